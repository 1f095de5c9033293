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
import math
import mmap
import os
import re
import struct
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as st_load
from safetensors.torch import load_file
from torch import Tensor

from cadence.model.config import ModelConfig
from cadence.model.hf_state import hf_state_dict, load_hf_state_dict
from cadence.model.transformer import Transformer
from cadence.wire.buffer import Buffer

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
_SHARD_NAME = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")
_DTYPE_NAMES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
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


@dataclass(frozen=True)
class Layout:
    """Where a state's tensors go in its safetensors bytes: ``head`` (the 8-byte length and the
    JSON header, padded to 8), each tensor with the dtype it is written in, the body's size; and,
    when every tensor is a contiguous CPU one written as it is, ``flat``: their bytes as flat views,
    which show the tensors as they are written in place (one concatenation writes a version)."""

    head: bytes
    tensors: tuple[tuple[Tensor, torch.dtype], ...]
    nbytes: int
    flat: tuple[Tensor, ...] | None

    def holds(self, state: Mapping[str, Tensor]) -> bool:
        """Whether ``state``'s tensors are still the very storage this layout views (none replaced)."""
        return len(state) == len(self.tensors) and all(
            state[name].data_ptr() == t.data_ptr()
            for name, (t, _) in zip(sorted(state), self.tensors, strict=True)
        )


def safetensors_layout(
    state: Mapping[str, Tensor], metadata: Mapping[str, str], dtype: torch.dtype | None = None
) -> Layout:
    """The layout of ``state`` per the safetensors format, the names in sorted order; with ``dtype``
    the floating-point tensors are written in it."""
    header: dict[str, object] = {"__metadata__": dict(metadata)}
    tensors: list[tuple[Tensor, torch.dtype]] = []  # each with the dtype it is written in
    offset = 0
    for name in sorted(state):
        tensor = state[name].detach()
        if tensor.dtype not in _DTYPES:
            raise ValueError(f"tensor {name!r} has dtype {tensor.dtype}, which safetensors cannot store here")
        kind = dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype
        size = tensor.numel() * kind.itemsize
        header[name] = {
            "dtype": _DTYPES[kind],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + size],
        }
        tensors.append((tensor, kind))
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    as_is = all(t.dtype == kind and t.device.type == "cpu" and t.is_contiguous() for t, kind in tensors)
    flat = tuple(t.reshape(-1).view(torch.uint8) for t, _ in tensors) if as_is else None
    return Layout(struct.pack("<Q", len(encoded)) + encoded, tuple(tensors), offset, flat)


def write_safetensors(layout: Layout, alloc: Callable[[int], Buffer] = bytearray) -> Buffer:
    """The bytes ``layout`` says, of its tensors as they are now, in ``alloc(nbytes)``: each tensor
    copied once, straight into the one buffer (a 135M model's 540 MB: a copy less is a tenth of a
    second less on the way to the workers); ``alloc``'s buffer (a pool's, a shared slot: pages
    already touched are filled ten times faster). Written here because ``safetensors.torch.save``
    needs numpy, which cadence does not depend on."""
    if sys.byteorder != "little":
        raise RuntimeError("safetensors serialisation is implemented for little-endian hosts only")
    base = len(layout.head)
    out = alloc(base + layout.nbytes)
    out[:base] = layout.head
    if not layout.nbytes:
        return out
    body = torch.frombuffer(out, dtype=torch.uint8, offset=base, count=layout.nbytes)
    if layout.flat is not None:
        # as they are: one concatenation into the buffer (420 adapters: 2.4 ms against 3.7 a copy
        # each; 675 MiB: 62 ms against 71)
        torch.cat(layout.flat, out=body)
        return out
    start = 0
    for tensor, kind in layout.tensors:
        size = tensor.numel() * kind.itemsize
        if size:  # reshape: one contiguous row (a view unless the tensor is strided), on any device
            row, part = tensor.reshape(-1), body[start : start + size]
            if row.dtype == kind:
                part.copy_(row.view(torch.uint8))
            elif (base + start) % kind.itemsize == 0:
                part.view(kind).copy_(row)  # cast as it is copied
            else:  # a view of another dtype must start at a multiple of its size
                part.copy_(row.to(kind).view(torch.uint8))
        start += size
    return out


def state_dict_to_bytes(model: Transformer) -> Buffer:
    """The HF-named state dict (tied ``lm_head.weight`` dropped) as safetensors bytes."""
    return tensors_to_bytes(hf_state_dict(model))


def tensors_to_bytes(
    state: Mapping[str, Tensor],
    alloc: Callable[[int], Buffer] = bytearray,
    dtype: torch.dtype | str | None = None,
    metadata: Mapping[str, str] | None = None,
) -> Buffer:
    """HF-named tensors (e.g. gathered from a sharded model) as safetensors bytes, in `alloc(nbytes)`;
    with `dtype` (or its name, "bfloat16"), the floating-point ones in it; `metadata`: strings the
    header carries beside `format`."""
    return write_safetensors(tensors_layout(state, dtype, metadata), alloc)


def tensors_layout(
    state: Mapping[str, Tensor],
    dtype: torch.dtype | str | None = None,
    metadata: Mapping[str, str] | None = None,
) -> Layout:
    """The layout `tensors_to_bytes` writes: kept, it writes the next version of the same tensors
    with no walk over them (`write_safetensors`)."""
    kind = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    return safetensors_layout(state, {"format": "pt", **(metadata or {})}, kind)


DTYPE_OF_CODE = {code: dtype for dtype, code in _DTYPES.items()}
"""A safetensors header's dtype code ("F32", …) to its torch dtype."""


def safetensors_header(data: bytes | Buffer | memoryview | mmap.mmap) -> tuple[int, dict[str, Any]]:
    """The length of safetensors `data`'s head (the 8-byte size and the JSON header) and the header,
    `__metadata__` included; ValueError when it cannot be read."""
    if len(data) < 8:
        raise ValueError(f"safetensors data of {len(data)} bytes has no header")
    (size,) = struct.unpack("<Q", bytes(data[:8]))
    if size > len(data) - 8:
        raise ValueError(f"safetensors header of {size} bytes overruns {len(data)} bytes of data")
    try:
        header = json.loads(bytes(data[8 : 8 + size]))
    except ValueError as err:
        raise ValueError(f"a safetensors header that is not JSON: {err}") from None
    if not isinstance(header, dict):
        raise ValueError("a safetensors header that is not a table")
    return 8 + size, header


def safetensors_metadata(data: bytes | Buffer | memoryview) -> dict[str, str]:
    """The `__metadata__` strings of safetensors `data`'s header; ValueError when it has no readable one."""
    _, header = safetensors_header(data)
    meta = header.get("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise ValueError("a safetensors header whose __metadata__ is not a table of strings")
    return meta


def state_nbytes(state: Mapping[str, Tensor]) -> int:
    """The bytes the tensors of `state` hold."""
    return sum(t.numel() * t.element_size() for t in state.values())


def state_dict_from_bytes(data: bytes | bytearray | mmap.mmap) -> dict[str, Tensor]:
    """The tensors of safetensors `data`: copies for `bytes` (read by safetensors), views of the buffer
    for a `bytearray` (as `pull_weights` returns) or a writable mapping (a version in shared memory),
    which must then stay unchanged while they are used."""
    if isinstance(data, bytes):
        return st_load(data)
    return _safetensors_views(data)


def _safetensors_views(data: bytearray | mmap.mmap) -> dict[str, Tensor]:
    """Tensors viewing `data`, laid out per the safetensors format; ValueError on a malformed layout."""
    if sys.byteorder != "little":
        raise RuntimeError("safetensors views are implemented for little-endian hosts only")
    base, header = safetensors_header(data)
    header.pop("__metadata__", None)
    state: dict[str, Tensor] = {}
    for name, entry in header.items():
        dtype = DTYPE_OF_CODE.get(entry["dtype"])
        shape = [int(n) for n in entry["shape"]]
        start, end = (int(n) for n in entry["data_offsets"])
        count = math.prod(shape)
        if dtype is None or not 0 <= start <= end <= len(data) - base:
            raise ValueError(
                f"tensor {name!r}: dtype {entry['dtype']} or offsets {start}..{end} not readable"
            )
        if (end - start) != count * dtype.itemsize:
            raise ValueError(f"tensor {name!r}: {end - start} bytes for shape {shape} of {dtype}")
        flat = (
            torch.frombuffer(data, dtype=dtype, count=count, offset=base + start)
            if count
            else torch.empty(0, dtype=dtype)
        )
        state[name] = flat.view(shape)
    return state


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
