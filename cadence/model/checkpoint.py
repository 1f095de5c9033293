"""Weights as safetensors, checkpoints as Hugging Face-style folders.

Invariant: no reader ever sees a half-written file (each is written under a temporary name, then
renamed with ``os.replace``; ``config.json`` last); a checkpoint folder holds ``config.json`` (the HF
config of the model's family: Llama, Qwen2 or Qwen3) and either ``model.safetensors`` or shards
``model-0000i-of-0000n.safetensors`` with ``model.safetensors.index.json``, HF names and no duplicate
tied head, so transformers opens it unchanged; loading a folder saved here or by transformers gives a
model with the same logits. Only safetensors and json are used to read and write it.
"""

from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import Tensor

from cadence.model.config import ModelConfig
from cadence.model.hf_state import hf_state_dict, load_hf_state_dict
from cadence.model.safetensors_bytes import DTYPE_OF_CODE as DTYPE_OF_CODE
from cadence.model.safetensors_bytes import Layout as Layout
from cadence.model.safetensors_bytes import safetensors_header as safetensors_header
from cadence.model.safetensors_bytes import safetensors_metadata as safetensors_metadata
from cadence.model.safetensors_bytes import state_dict_from_bytes as state_dict_from_bytes
from cadence.model.safetensors_bytes import state_dict_to_bytes as state_dict_to_bytes
from cadence.model.safetensors_bytes import state_nbytes as state_nbytes
from cadence.model.safetensors_bytes import tensors_layout as tensors_layout
from cadence.model.safetensors_bytes import tensors_to_bytes as tensors_to_bytes
from cadence.model.safetensors_bytes import write_safetensors as write_safetensors
from cadence.model.transformer import Transformer
from cadence.wire.buffer import Buffer

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
_SHARD_NAME = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")
_DTYPE_NAMES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _write_atomic(path: Path, data: bytes | Buffer) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _is_weights_file(name: str) -> bool:
    return name in (WEIGHTS_FILE, INDEX_FILE) or _SHARD_NAME.fullmatch(name) is not None


def _shards(state: Mapping[str, Tensor], max_shard_bytes: int | None) -> list[dict[str, Tensor]]:
    """Split ``state`` in name order into shards of at most ``max_shard_bytes`` (a bigger tensor stands alone)."""
    shards: list[dict[str, Tensor]] = [{}]
    size = 0
    for name in sorted(state):
        nbytes = state[name].numel() * state[name].element_size()
        if max_shard_bytes is not None and shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = state[name]
        size += nbytes
    return shards


def save_checkpoint(
    model: Transformer | Mapping[str, Tensor],
    cfg: ModelConfig,
    directory: Path,
    extra_files: Mapping[str, str] | None = None,
    max_shard_bytes: int | None = None,
) -> None:
    """Write the weights (of ``model``, or HF-named tensors), each extra file (name -> text) and
    ``config.json`` into ``directory``.

    The weights go to ``model.safetensors``, or, when they exceed ``max_shard_bytes``, to numbered
    shards and ``model.safetensors.index.json``; weight files of an earlier save that the new one
    does not use are removed before ``config.json`` is written.
    """
    directory = Path(directory)
    if max_shard_bytes is not None and max_shard_bytes <= 0:
        raise ValueError(f"max_shard_bytes must be positive, got {max_shard_bytes}")
    for name in extra_files or {}:
        if Path(name).name != name or name == CONFIG_FILE or _is_weights_file(name):
            raise ValueError(
                f"extra file name {name!r} must be a plain file name other than {CONFIG_FILE!r} and the weight files"
            )
    directory.mkdir(parents=True, exist_ok=True)
    state = hf_state_dict(model) if isinstance(model, Transformer) else model
    shards = _shards(state, max_shard_bytes)
    written = [WEIGHTS_FILE] if len(shards) == 1 else []
    if len(shards) == 1:
        _write_atomic(directory / WEIGHTS_FILE, tensors_to_bytes(shards[0]))
    else:
        weight_map: dict[str, str] = {}
        for i, shard in enumerate(shards, start=1):
            name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
            _write_atomic(directory / name, tensors_to_bytes(shard))
            weight_map.update(dict.fromkeys(shard, name))
            written.append(name)
        total = state_nbytes(state)
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        _write_atomic(directory / INDEX_FILE, (json.dumps(index, indent=2) + "\n").encode())
        written.append(INDEX_FILE)
    for name, text in (extra_files or {}).items():
        _write_atomic(directory / name, text.encode())
    for stale in directory.iterdir():
        if _is_weights_file(stale.name) and stale.name not in written:
            stale.unlink()
    config = cfg.to_hf_dict()
    config["torch_dtype"] = str(next(iter(state.values())).dtype).removeprefix("torch.")
    _write_atomic(directory / CONFIG_FILE, (json.dumps(config, indent=2) + "\n").encode())


def _weight_files(directory: Path) -> list[Path]:
    """``model.safetensors``, else the shards named by ``model.safetensors.index.json``."""
    if (directory / WEIGHTS_FILE).is_file():
        return [directory / WEIGHTS_FILE]
    if (directory / INDEX_FILE).is_file():
        index = _read_json(directory / INDEX_FILE)
        if not isinstance(index, dict) or not isinstance(index.get("weight_map"), dict):
            raise CheckpointError(f"{directory / INDEX_FILE} holds no weight_map")
        return [directory / name for name in sorted(set(index["weight_map"].values()))]
    raise CheckpointError(f"{directory} holds neither {WEIGHTS_FILE} nor {INDEX_FILE}")


class CheckpointError(ValueError):
    """A checkpoint folder, or a file in it, that is missing or cannot be read; the message names it."""


def check_checkpoint(directory: Path) -> None:
    """`CheckpointError` naming the first missing, unreadable or truncated file of the checkpoint folder
    `directory` (its config, weights and tokenizer), without loading the weights."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"checkpoint folder {directory} not found")
    for name in (CONFIG_FILE, "tokenizer.json"):
        _read_json(directory / name)
    for path in _weight_files(directory):
        _check_safetensors(path)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path} not found") from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path} is empty or damaged, not JSON ({exc})") from None


def _check_safetensors(path: Path) -> None:
    if not path.is_file():
        raise CheckpointError(f"{path} not found")
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
    if len(head) < 8 or struct.unpack("<Q", head)[0] > size - 8:
        raise CheckpointError(f"{path} is truncated or not safetensors ({size} bytes)")


def _iter_tensors(files: list[Path], dtype: torch.dtype) -> Iterator[tuple[str, Tensor]]:
    for path in files:  # one file in memory at a time, beside the converted tensors
        _check_safetensors(path)
        try:
            tensors = load_file(str(path))
        except Exception as exc:  # safetensors' own errors name no file
            raise CheckpointError(f"{path} cannot be read: {exc}") from None
        for name, tensor in tensors.items():
            yield name, tensor.to(dtype) if tensor.is_floating_point() else tensor


def _resolve_dtype(dtype: torch.dtype | str, config: Mapping[str, Any]) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype != "auto":
        raise ValueError(f"dtype must be a torch.dtype or 'auto', got {dtype!r}")
    name = config.get("torch_dtype") or config.get("dtype") or "float32"
    if name not in _DTYPE_NAMES:
        raise ValueError(f"config torch_dtype {name!r} is not supported; supported: {sorted(_DTYPE_NAMES)}")
    return _DTYPE_NAMES[name]


def load_checkpoint(
    directory: Path, dtype: torch.dtype | str = torch.float32
) -> tuple[Transformer, ModelConfig]:
    """Build the model of ``directory/config.json`` and load its weights on CPU, single file or sharded.

    The weights are converted to ``dtype`` (float32 unless told; ``"auto"`` keeps the config's
    ``torch_dtype``) as they are read, so the model is never held in two precisions at once.
    """
    directory = Path(directory)
    config = _read_json(directory / CONFIG_FILE)
    cfg = ModelConfig.from_hf_dict(config)
    target = _resolve_dtype(dtype, config)
    with torch.device("meta"):
        model = Transformer(cfg)
    load_hf_state_dict(model, dict(_iter_tensors(_weight_files(directory), target)), assign=True)
    return model, cfg
