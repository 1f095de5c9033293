"""A state dict as a few flat byte buckets, and back: the layout a broadcast sends.

Invariant: `plan_buckets` is a pure function of the tensors' names, dtypes and shapes, so the root and
every member that receive the same plan agree on every byte's place; `read_bucket` of a bucket that
`fill_bucket` wrote gives tensors equal bit for bit to the originals. Every tensor starts on an
`ALIGN`-byte boundary so it can be viewed in place with its own dtype.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

ALIGN = 64


@dataclass(frozen=True)
class Slot:
    """Where one tensor lives: bucket `bucket`, bytes `offset` .. `offset + nbytes`."""

    name: str
    dtype: str  # torch's name without the prefix: "float32", "bfloat16", ...
    shape: tuple[int, ...]
    bucket: int
    offset: int
    nbytes: int


@dataclass(frozen=True)
class BucketPlan:
    slots: tuple[Slot, ...]
    sizes: tuple[int, ...]  # bytes of each bucket

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.slots)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_of(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def plan_buckets(state: Mapping[str, Tensor], bucket_bytes: int) -> BucketPlan:
    """Tensors in name order, packed into buckets of at most `bucket_bytes` (a larger tensor alone)."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    slots: list[Slot] = []
    sizes: list[int] = []
    for name in sorted(state):
        t = state[name]
        nbytes = t.numel() * t.element_size()
        if not sizes or (sizes[-1] and _aligned(sizes[-1]) + nbytes > bucket_bytes):
            sizes.append(0)
        offset = _aligned(sizes[-1])
        slots.append(Slot(name, dtype_name(t.dtype), tuple(t.shape), len(sizes) - 1, offset, nbytes))
        sizes[-1] = offset + nbytes
    return BucketPlan(tuple(slots), tuple(sizes))


def plan_from_layout(
    names: Sequence[str],
    dtypes: Sequence[str],
    shapes: Sequence[Sequence[int]],
    buckets: Sequence[int],
    offsets: Sequence[int],
    sizes: Sequence[int],
) -> BucketPlan:
    """The plan whose columns a message carried; `ValueError` when they do not fit together."""
    slots = []
    for name, dtype, shape, bucket, offset in zip(names, dtypes, shapes, buckets, offsets, strict=True):
        nbytes = math.prod(shape) * dtype_of(dtype).itemsize
        if not 0 <= bucket < len(sizes) or offset < 0 or offset + nbytes > sizes[bucket]:
            raise ValueError(f"tensor {name!r} does not fit bucket {bucket} at offset {offset}")
        slots.append(Slot(name, dtype, tuple(shape), bucket, offset, nbytes))
    return BucketPlan(tuple(slots), tuple(sizes))


def fill_bucket(plan: BucketPlan, state: Mapping[str, Tensor], index: int, out: Tensor) -> None:
    """Copy the tensors of bucket `index` into the uint8 buffer `out` (any device)."""
    for slot in plan.slots:
        if slot.bucket == index and slot.nbytes:
            src = state[slot.name].detach().contiguous().reshape(-1).view(torch.uint8)
            out[slot.offset : slot.offset + slot.nbytes].copy_(src)


def read_bucket(plan: BucketPlan, index: int, buffer: Tensor) -> dict[str, Tensor]:
    """The tensors of bucket `index` as views into the uint8 `buffer` (which they keep alive)."""
    return {
        slot.name: buffer[slot.offset : slot.offset + slot.nbytes].view(dtype_of(slot.dtype)).view(slot.shape)
        for slot in plan.slots
        if slot.bucket == index
    }
