"""Attention over a packed row by blocks: each run of queries attends only the key ranges it may see.

A packed row (ops/packing.py) is runs of positions that see the same keys: the shared trunk (itself,
causally), a group's prompt body (the trunk, then itself causally), a response segment (the trunk, its
group's body, then itself causally). `SegmentMask` holds, for each run [a, b), the earlier ranges it
sees whole; `attend` runs one `scaled_dot_product_attention` a run, over the keys of those ranges and
of the run itself, with a [b - a, c + b - a] mask (c columns of context, then causal). The work is the
sum over runs of (b - a)(c + b - a): what the row's segments read, not T², and no [T, T] tensor is
made (`dense` builds it, for the reference path and the tests).

Invariant: `attend(q, k, v)` equals `scaled_dot_product_attention(q, k, v, attn_mask=dense())` up to
float summation order, values and gradients.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

Range = tuple[int, int]


@dataclass(frozen=True)
class Run:
    """Queries [start, end) that see the `context` ranges whole (all before `start`) and themselves
    causally."""

    start: int
    end: int
    context: tuple[Range, ...]

    @property
    def seen(self) -> int:
        return sum(e - s for s, e in self.context)


@dataclass(frozen=True)
class SegmentMask:
    """A packed row's attention as runs (batch 1, every head alike); `length` positions in all."""

    length: int
    runs: tuple[Run, ...]
    _masks: dict[tuple[int, int, str], Tensor] = field(default_factory=dict, compare=False, repr=False)

    def dense(self, device: torch.device | str = "cpu") -> Tensor:
        """The same attention as a bool [1, 1, T, T] mask (True = may attend): the reference."""
        mask = torch.zeros(self.length, self.length, dtype=torch.bool, device=device)
        for run in self.runs:
            for s, e in run.context:
                mask[run.start : run.end, s:e] = True
            n = run.end - run.start
            mask[run.start : run.end, run.start : run.end] = torch.ones(n, n, dtype=torch.bool).tril()
        return mask.view(1, 1, self.length, self.length)

    def _mask(self, n: int, seen: int, device: torch.device) -> Tensor:
        """[n, seen + n]: the context whole, then causal; built once a shape and device."""
        key = (n, seen, str(device))
        if key not in self._masks:
            rows = torch.arange(n, device=device).unsqueeze(1)
            self._masks[key] = torch.arange(seen + n, device=device).unsqueeze(0) <= rows + seen
        return self._masks[key]

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Attention of q [1, H, T, D] over k, v [1, H, T, D] (heads already repeated), run by run."""
        if q.shape[2] != self.length:
            raise ValueError(f"a segment mask of {self.length} positions given {q.shape[2]} queries")
        outs: list[Tensor] = []
        for run in self.runs:
            a, b = run.start, run.end
            if not run.context:
                outs.append(
                    F.scaled_dot_product_attention(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], is_causal=True)
                )
                continue
            if len(run.context) == 1 and run.context[0][1] == a:  # one range just before: a view
                keys, values = k[:, :, run.context[0][0] : b], v[:, :, run.context[0][0] : b]
            else:
                keys = torch.cat([k[:, :, s:e] for s, e in run.context] + [k[:, :, a:b]], dim=2)
                values = torch.cat([v[:, :, s:e] for s, e in run.context] + [v[:, :, a:b]], dim=2)
            mask = self._mask(b - a, run.seen, q.device)
            outs.append(F.scaled_dot_product_attention(q[:, :, a:b], keys, values, attn_mask=mask))
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)


def segment_mask(groups: Sequence[int], segments: Sequence[int]) -> SegmentMask:
    """The runs of a packed row from each position's group (-1: the shared trunk) and segment (-1: the
    trunk or a prompt body, else the sample whose response it is), as `pack_groups` numbers them."""
    if len(groups) != len(segments):
        raise ValueError(f"{len(groups)} group indices for {len(segments)} segment indices")
    runs: list[Run] = []
    trunk = 0
    while trunk < len(groups) and groups[trunk] == -1:
        trunk += 1
    bodies: dict[int, Range] = {}
    start = 0
    for i in range(1, len(groups) + 1):
        if i < len(groups) and (groups[i], segments[i]) == (groups[start], segments[start]):
            continue
        g, s = groups[start], segments[start]
        context: list[Range] = []
        if g != -1:
            context.append((0, trunk))
            if s != -1:
                context.append(bodies.get(g, (start, start)))
            else:
                bodies[g] = (start, i)
        runs.append(Run(start, i, _merged(context)))
        start = i
    return SegmentMask(len(groups), tuple(runs))


def _merged(ranges: Sequence[Range]) -> tuple[Range, ...]:
    """The non-empty ranges, adjacent ones joined (fewer, longer copies of keys)."""
    out: list[Range] = []
    for s, e in ranges:
        if e <= s:
            continue
        if out and out[-1][1] == s:
            out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return tuple(out)
