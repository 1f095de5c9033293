"""Weights as safetensors, checkpoints as Hugging Face-style folders.

Invariant: no reader ever sees a half-written file (each is written under a temporary name, then
renamed with ``os.replace``; ``config.json`` last); a checkpoint folder holds ``config.json`` (a Llama HF
config) and ``model.safetensors`` with HF names and no duplicate tied head, and loading it gives a
model with the same logits as the one saved.
"""

from __future__ import annotations

import ctypes
import json
import os
import struct
import sys
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import load as st_load
from safetensors.torch import load_file
from torch import Tensor

from cadence.model.config import ModelConfig
from cadence.model.transformer import Transformer, hf_state_dict, load_hf_state_dict

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


def _safetensors_bytes(state: Mapping[str, Tensor], metadata: Mapping[str, str]) -> bytes:
    """Serialise per the safetensors format (8-byte header length, JSON header, raw little-endian data).

    Written here because ``safetensors.torch.save`` needs numpy, which cadence does not depend on.
    """
    if sys.byteorder != "little":
        raise RuntimeError("safetensors serialisation is implemented for little-endian hosts only")
    header: dict[str, object] = {"__metadata__": dict(metadata)}
    chunks: list[bytes] = []
    offset = 0
    for name in sorted(state):
        tensor = state[name].detach().to("cpu").contiguous()
        if tensor.dtype not in _DTYPES:
            raise ValueError(f"tensor {name!r} has dtype {tensor.dtype}, which safetensors cannot store here")
        size = tensor.numel() * tensor.element_size()
        chunks.append(ctypes.string_at(tensor.data_ptr(), size) if size else b"")
        header[name] = {
            "dtype": _DTYPES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    return b"".join([struct.pack("<Q", len(encoded)), encoded, *chunks])


def state_dict_to_bytes(model: Transformer) -> bytes:
    """The HF-named state dict (tied ``lm_head.weight`` dropped) as safetensors bytes."""
    return _safetensors_bytes(hf_state_dict(model), {"format": "pt"})


def state_dict_from_bytes(data: bytes) -> dict[str, Tensor]:
    return st_load(data)


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_checkpoint(
    model: Transformer, cfg: ModelConfig, directory: Path, extra_files: Mapping[str, str] | None = None
) -> None:
    """Write ``config.json``, ``model.safetensors`` and each extra file (name -> text) into ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    files: dict[str, bytes] = {
        WEIGHTS_FILE: state_dict_to_bytes(model),
        CONFIG_FILE: (json.dumps(cfg.to_hf_dict(), indent=2) + "\n").encode(),
    }
    for name, text in (extra_files or {}).items():
        if Path(name).name != name or name in files:
            raise ValueError(f"extra file name {name!r} must be a plain file name other than {sorted(files)}")
        files[name] = text.encode()
    for name, data in files.items():
        _write_atomic(directory / name, data)


def load_checkpoint(directory: Path) -> tuple[Transformer, ModelConfig]:
    """Build the model described by ``directory/config.json`` and load its weights (on CPU)."""
    directory = Path(directory)
    cfg = ModelConfig.from_hf_dict(json.loads((directory / CONFIG_FILE).read_text()))
    model = Transformer(cfg)
    load_hf_state_dict(model, load_file(str(directory / WEIGHTS_FILE)))
    return model, cfg
