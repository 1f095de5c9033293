"""Attention over a packed row by blocks: each run of queries attends only the key ranges it may see.

A packed row (ops/packing.py) is runs of positions that see the same keys: the shared trunk (itself,
causally), a group's prompt body (the trunk, then itself causally), a response segment (the trunk, its
group's body, then itself causally). `SegmentMask` holds, for each run [a, b), the earlier runs it
sees whole; `attend` runs one `scaled_dot_product_attention` a run, over the keys of those ranges and
of the run itself, with a [b - a, c + b - a] mask (c columns of context, then causal). The work is the
sum over runs of (b - a)(c + b - a): what the row's segments read, not T², and no [T, T] tensor is
made (`dense` builds it, for the reference path and the tests).

With a `context` of c positions (keys and values already cached before the row: the engine's trunk
or an episode's shared opening, its prompts prefilled as the row's runs), every run sees those c keys
whole before its own ranges, and the row's keys come after them.

Invariant: `attend(q, k, v)` equals `scaled_dot_product_attention(q, k, v, attn_mask=dense())` up to
float summation order, values and gradients.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass(frozen=True)
class Run:
    """Queries [start, end) that see the earlier runs `sees` (indices) whole and themselves causally."""

    start: int
    end: int
    sees: tuple[int, ...]

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class SegmentMask:
    """A packed row's attention as runs that tile it in order (batch 1, every head alike); `length`
    positions in all, after `context` cached positions every run sees whole."""

    length: int
    runs: tuple[Run, ...]
    context: int = 0
    _masks: dict[tuple[int, int, str], Tensor] = field(default_factory=dict, compare=False, repr=False)

    def seen(self, run: Run) -> int:
        """Positions of the earlier runs `run` sees whole."""
        return sum(self.runs[j].size for j in run.sees)

    def dense(self, device: torch.device | str = "cpu") -> Tensor:
        """The same attention as a bool [1, 1, T, c + T] mask (True = may attend): the reference."""
        c = self.context
        mask = torch.zeros(self.length, c + self.length, dtype=torch.bool, device=device)
        mask[:, :c] = True
        for run in self.runs:
            for j in run.sees:
                mask[run.start : run.end, c + self.runs[j].start : c + self.runs[j].end] = True
            mask[run.start : run.end, c + run.start : c + run.end] = torch.ones(
                run.size, run.size, dtype=torch.bool
            ).tril()
        return mask.view(1, 1, self.length, c + self.length)

    def _mask(self, n: int, seen: int, device: torch.device) -> Tensor:
        """[n, seen + n]: the context whole, then causal; built once a shape and device."""
        key = (n, seen, str(device))
        if key not in self._masks:
            rows = torch.arange(n, device=device).unsqueeze(1)
            self._masks[key] = torch.arange(seen + n, device=device).unsqueeze(0) <= rows + seen
        return self._masks[key]

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Attention of q [1, H, T, D] over k, v [1, H, c + T, D] (heads already repeated), run by
        run. The row is split into its runs once (a slice a run would make its backward write a
        whole [1, H, T, D] gradient a run)."""
        c = self.context
        if q.shape[2] != self.length or k.shape[2] != c + self.length:
            raise ValueError(
                f"a segment mask of {self.length} positions after {c} given {q.shape[2]} queries"
                f" and {k.shape[2]} keys"
            )
        sizes = [run.size for run in self.runs]
        qs = q.split(sizes, dim=2)
        ks, vs = k[:, :, c:].split(sizes, dim=2), v[:, :, c:].split(sizes, dim=2)
        outs: list[Tensor] = []
        for i, run in enumerate(self.runs):
            if not run.sees and not c:
                outs.append(F.scaled_dot_product_attention(qs[i], ks[i], vs[i], is_causal=True))
                continue
            keys = torch.cat(([k[:, :, :c]] if c else []) + [ks[j] for j in run.sees] + [ks[i]], dim=2)
            values = torch.cat(([v[:, :, :c]] if c else []) + [vs[j] for j in run.sees] + [vs[i]], dim=2)
            mask = self._mask(run.size, c + self.seen(run), q.device)
            outs.append(F.scaled_dot_product_attention(qs[i], keys, values, attn_mask=mask))
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)


def segment_mask(groups: Sequence[int], segments: Sequence[int]) -> SegmentMask:
    """The runs of a packed row from each position's group (-1: the shared trunk) and segment (-1: the
    trunk or a prompt body, else the sample whose response it is), as `pack_groups` numbers them."""
    if len(groups) != len(segments):
        raise ValueError(f"{len(groups)} group indices for {len(segments)} segment indices")
    runs: list[Run] = []
    trunk: tuple[int, ...] = ()  # the trunk's run, seen by every later one
    bodies: dict[int, int] = {}  # a group's prompt body's run
    start = 0
    for i in range(1, len(groups) + 1):
        if i < len(groups) and (groups[i], segments[i]) == (groups[start], segments[start]):
            continue
        g, s = groups[start], segments[start]
        if g == -1:
            sees: tuple[int, ...] = ()
            trunk = (len(runs),)
        elif s == -1:
            sees = trunk
            bodies[g] = len(runs)
        else:
            sees = trunk + ((bodies[g],) if g in bodies else ())
        runs.append(Run(start, i, sees))
        start = i
    return SegmentMask(len(groups), tuple(runs))


def prompts_mask(sizes: Sequence[int], context: int) -> SegmentMask:
    """Prompts of `sizes` tokens one after another in a row, after `context` cached positions: each
    sees the context and itself causally, never another prompt (the engine's prefill of a row)."""
    runs: list[Run] = []
    start = 0
    for size in sizes:
        runs.append(Run(start, start + size, ()))
        start += size
    return SegmentMask(start, tuple(runs), context)
