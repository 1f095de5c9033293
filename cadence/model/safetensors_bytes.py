"""Safetensors bytes in memory: a state's layout, its bytes written once into a given buffer, and
tensors read back as views of such bytes (a pulled version, a mapped slot).

Invariant: `state_dict_from_bytes(write_safetensors(tensors_layout(state)))` gives `state`'s tensors,
each in the dtype the layout wrote it in; `safetensors` reads the same bytes (a checkpoint's files are
written with `tensors_to_bytes`).
"""

from __future__ import annotations

import json
import math
import mmap
import struct
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from safetensors.torch import load as st_load
from torch import Tensor

from cadence.model.hf_state import hf_state_dict
from cadence.model.transformer import Transformer
from cadence.wire.buffer import Buffer

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
    fill_body(layout, torch.frombuffer(out, dtype=torch.uint8, offset=base, count=layout.nbytes), base)
    return out


def fill_body(layout: Layout, body: Tensor, base: int) -> None:
    """Write ``layout``'s tensors into ``body``, the uint8 bytes after its head (at ``base``), on any
    device: each cast to the dtype it is written in as it is copied."""
    if layout.flat is not None and body.device.type == "cpu":
        # as they are: one concatenation into the buffer (420 adapters: 2.4 ms against 3.7 a copy
        # each; 675 MiB: 62 ms against 71)
        torch.cat(layout.flat, out=body)
        return
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
    state: dict[str, Tensor] = {}
    for name, dtype, shape, start in safetensors_entries(header, len(data) - base):
        count = math.prod(shape)
        flat = (
            torch.frombuffer(data, dtype=dtype, count=count, offset=base + start)
            if count
            else torch.empty(0, dtype=dtype)
        )
        state[name] = flat.view(shape)
    return state


def safetensors_entries(
    header: dict[str, Any], body: int
) -> Iterator[tuple[str, torch.dtype, list[int], int]]:
    """Each tensor of a safetensors `header` (its `__metadata__` skipped) whose bytes lie within a body
    of `body` bytes: its name, dtype, shape and offset in the body; ValueError on a malformed entry."""
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype = DTYPE_OF_CODE.get(entry["dtype"])
        shape = [int(n) for n in entry["shape"]]
        start, end = (int(n) for n in entry["data_offsets"])
        if dtype is None or not 0 <= start <= end <= body:
            raise ValueError(
                f"tensor {name!r}: dtype {entry['dtype']} or offsets {start}..{end} not readable"
            )
        if (end - start) != math.prod(shape) * dtype.itemsize:
            raise ValueError(f"tensor {name!r}: {end - start} bytes for shape {shape} of {dtype}")
        yield name, dtype, shape, start
