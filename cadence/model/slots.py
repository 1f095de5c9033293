"""The engine's KV cache: a fixed number of slots, each one sample's keys and values from position 0
on, allocated once and written in place.

Invariant: a slot is held by at most one row at a time (``take`` hands out the lowest free slots,
``free`` gives one back, neither touches any tensor); a row's keys and values stay where they were
written until its slot is given to another row, so no row's cache is ever copied when another ends.
The last position of every slot is a spare that no row attends: a padded or ended row writes there.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import torch
from torch import Tensor

from cadence.model.config import ModelConfig

LENGTH_STEP = 256  # the cache's length grows in steps of this many positions
WIDTH_STEP = 64  # a step attends the positions of its longest row rounded up to this


def row_bucket(rows: int, slots: int) -> int:
    """The rows a step computes for ``rows`` live ones: 2, 4, 8, then multiples of 16, at most
    ``slots`` (each bucket one shape for the compiled step; never 1, which a compiler would take as
    a shape of its own)."""
    for size in (2, 4, 8):
        if rows <= size:
            return min(size, slots)
    return min(-(-rows // 16) * 16, slots)


def step_rows(rows: int, slots: int, least: int = 1, bucketed: bool = True) -> int:
    """The rows a step computes for ``rows`` live ones: at least ``least`` (from which each row comes
    out alike whatever the others are: ``invariance.py``), a bucket where ``bucketed``, else exactly
    that many (eager on the CPU), never more than ``slots``."""
    rows = max(rows, least)
    return min(row_bucket(rows, slots) if bucketed else rows, slots)


def width_bucket(positions: int, length: int) -> int:
    """The cache positions a step attends when its rows' positions are below ``positions``."""
    return min(-(-positions // WIDTH_STEP) * WIDTH_STEP, length)


def cache_bytes(cfg: ModelConfig, slots: int, length: int, dtype: torch.dtype) -> int:
    """What the keys and values of ``slots`` slots of ``length`` positions take."""
    per_position = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim
    return slots * (length + 1) * per_position * torch.tensor([], dtype=dtype).element_size()


def cache_dtype(dtype: torch.dtype, device: torch.device, by_rows: bool) -> torch.dtype:
    """What the slot cache holds keys and values in: float32 on the CPU when the model's dtype is a
    16-bit one and the decode attention goes row by row (``decode_step.attend``), else the model's.
    The CPU multiplies a bfloat16 query by a slot's keys 3x slower than in float32, the keys being a
    strided view of the cache, which its bfloat16 kernels copy first (SmolLM2, 32 rows: 700 against
    400 us a layer over 128 positions, 2 400 against 1 100 over 512); the keys and values are the
    model's 16-bit ones widened exactly, and their products are summed in float32 either way."""
    if device.type == "cpu" and by_rows and dtype in (torch.bfloat16, torch.float16):
        return torch.float32
    return dtype


def auto_rows(cfg: ModelConfig, device: torch.device, dtype: torch.dtype) -> int:
    """The slots when none are asked for: 64 on the CPU; on a GPU as many as a quarter of its free
    memory holds at the model's positions (at most 4096 a row counted), between 64 and 512."""
    if device.type != "cuda":
        return 64
    free, _ = torch.cuda.mem_get_info(device)
    per_slot = cache_bytes(cfg, 1, min(cfg.max_position, 4096), dtype)
    return max(64, min(512, free // 4 // per_slot))


class SlotCache:
    """``keys`` and ``values``: a tensor a layer, [slots, kv heads, length + 1, head dim], in
    ``dtype`` (``cache_dtype``); ``length`` the positions a slot holds (the one after them is the
    spare)."""

    def __init__(
        self, cfg: ModelConfig, slots: int, length: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        shape = (slots, cfg.num_kv_heads, length + 1, cfg.head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_layers)]
        self.slots, self.length = slots, length
        self.device = device
        self._free = list(range(slots))
        self._held: set[int] = set()

    @property
    def spare(self) -> int:
        """The position a row that writes nowhere writes to."""
        return self.length

    @property
    def held(self) -> int:
        return len(self._held)

    def highest(self) -> int:
        """One past the highest slot held (0 when none is)."""
        return max(self._held) + 1 if self._held else 0

    def take(self, n: int) -> list[int]:
        """The ``n`` lowest free slots, now held."""
        if n > len(self._free):
            raise ValueError(f"{n} slots asked, {len(self._free)} free")
        taken = [heapq.heappop(self._free) for _ in range(n)]
        self._held.update(taken)
        return taken

    def free(self, slots: Sequence[int]) -> None:
        for slot in slots:
            self._held.remove(slot)
            heapq.heappush(self._free, slot)

    def lowest_free(self) -> int:
        return self._free[0] if self._free else self.slots

    def write_prompt(self, slots: Tensor, keys: Sequence[Tensor], values: Sequence[Tensor]) -> None:
        """Each of ``slots`` gets one prompt's keys and values (per layer [1, kv heads, n, head dim])
        at positions 0..n-1."""
        n = keys[0].shape[2]
        for own, k in zip(self.keys, keys, strict=True):
            own[slots, :, :n] = k.to(own.dtype)
        for own, v in zip(self.values, values, strict=True):
            own[slots, :, :n] = v.to(own.dtype)

    def move(self, source: int, target: int, width: int) -> None:
        """Slot ``source``'s first ``width`` positions copied into the free slot ``target``, which is
        held instead: one row's cache, the only copy a compaction makes."""
        for tensor in (*self.keys, *self.values):
            tensor[target, :, :width] = tensor[source, :, :width]
        self._free.remove(target)
        heapq.heapify(self._free)
        self._held.add(target)
        self.free([source])
