"""The span events of a run as typed records, and the arithmetic a timeline needs (no drawing).

A span is an interval of work one actor logged: `generate` and `load` from rollout workers (with an
environment also `environment`: time inside environment calls, within a `generate` span), `train`,
`step` and `publish` from the trainer. Period k begins when version k is published, so
the boundary before period k+1 is the end of the `publish` span tagged with period k.

Invariant: within the chosen window, every instant of an actor's row between its first and last
span is either inside one of its spans or inside exactly one of its idle gaps.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

from cadence.monitor import logview
from cadence.monitor.pictures import PictureError
from cadence.monitor.run_dir import read_new_lines

DEFAULT_PERIODS = 4


@dataclass(frozen=True)
class Span:
    actor: str
    kind: str
    start: float
    end: float
    period: int
    eval: bool = False  # work of an eval round (its `eval` field), not of the period's training


@dataclass(frozen=True)
class Window:
    """Periods `first` to `last` (both shown), from `start` to `end` (epoch seconds)."""

    first: int
    last: int
    start: float
    end: float


def read_spans(run_dir: Path) -> list[Span]:
    """Every span event of every actor's log under `run_dir/logs`, ordered by start time."""
    spans = []
    for path in sorted((run_dir / "logs").glob("*.jsonl")):
        for event in read_new_lines(path, 0)[0]:
            if event.get("event") != "span":
                continue
            try:
                span = Span(
                    actor=str(event.get("actor", path.stem)),
                    kind=str(event["kind"]),
                    start=float(event["start"]),
                    end=float(event["end"]),
                    period=int(event["period"]),
                    eval=event.get("eval") is True,
                )
            except (KeyError, TypeError, ValueError):
                continue
            spans.append(span)
    spans.sort(key=lambda s: (s.start, s.end))
    return spans


def parse_periods(text: str) -> tuple[int, int]:
    """`A:B` (periods A to B, both included, as `cadence logs --period` reads it) or `A` (A alone)."""
    return logview.parse_periods(text, open_ended=False)


def period_starts(spans: list[Span]) -> dict[int, float]:
    """Period number -> the time it began: the end of the `publish` span of the period before."""
    starts: dict[int, float] = {}
    for s in spans:
        if s.kind == "publish":
            starts[s.period + 1] = min(s.end, starts.get(s.period + 1, s.end))
    return starts


def seconds_by_period(spans: list[Span], kind: str) -> dict[int, float]:
    """Period -> the most seconds one actor spent in training spans of `kind` tagged with it (for
    "environment": the waits of the worker that waited longest; eval rounds' spans are left out);
    periods without such a span are left out."""
    per_actor: dict[int, dict[str, float]] = {}
    for s in spans:
        if s.kind == kind and not s.eval:
            actors = per_actor.setdefault(s.period, {})
            actors[s.actor] = actors.get(s.actor, 0.0) + (s.end - s.start)
    return {period: max(actors.values()) for period, actors in sorted(per_actor.items())}


def choose_window(spans: list[Span], periods: tuple[int, int] | None = None) -> Window:
    """The periods to show: `periods` when given, else `DEFAULT_PERIODS` from the middle of the run."""
    numbers = sorted({s.period for s in spans if s.period >= 0})
    if not numbers:
        raise PictureError("no spans of any period")
    lo, hi = numbers[0], numbers[-1]
    if periods is None:
        count = min(DEFAULT_PERIODS, hi - lo + 1)
        first = max(lo, (lo + hi + 1) // 2 - count // 2)
        last = min(hi, first + count - 1)
        first = last - count + 1
    else:
        first, last = periods
    inside = [s for s in spans if first <= s.period <= last]
    if not inside:
        raise PictureError(f"no spans of periods {first} to {last}: the run has periods {lo} to {hi}")
    starts = period_starts(spans)
    start = starts.get(first, min(s.start for s in inside))
    end = starts.get(last + 1, max(s.end for s in inside))
    return Window(first, last, start, end)


def clip(spans: list[Span], window: Window) -> list[Span]:
    """The spans that overlap the window, cut to it (one that only touches an edge is left out)."""
    return [
        replace(s, start=max(s.start, window.start), end=min(s.end, window.end))
        for s in spans
        if (s.end > window.start and s.start < window.end)
        or (s.start == s.end and window.start < s.start < window.end)
    ]


def idle_gaps(spans: list[Span], window: Window) -> dict[str, list[tuple[float, float]]]:
    """Actor -> the intervals of the window in which it ran no span, counted only between its first
    span's start and its last span's end over the whole run (before it joins it is not idle)."""
    gaps: dict[str, list[tuple[float, float]]] = {}
    for actor in {s.actor for s in spans}:
        own = [s for s in spans if s.actor == actor]
        lo = max(window.start, min(s.start for s in own))
        hi = min(window.end, max(s.end for s in own))
        cursor = lo
        found: list[tuple[float, float]] = []
        for s in sorted(own, key=lambda s: s.start):
            if s.end <= lo or s.start >= hi:
                continue
            if s.start > cursor:
                found.append((cursor, s.start))
            cursor = max(cursor, s.end)
        if hi > cursor:
            found.append((cursor, hi))
        gaps[actor] = found
    return gaps


def row_order(actors: set[str] | list[str]) -> list[str]:
    """The trainer first, then the other non-rollout actors, then rollout workers in natural order."""

    def key(actor: str) -> tuple[int, list[tuple[int, int | str]]]:
        rank = {"trainer": 0, "publisher": 1, "dispatcher": 2}.get(
            actor, 4 if actor.startswith("rollout") else 3
        )
        parts = re.split(r"(\d+)", actor)
        return rank, [(0, int(p)) if p.isdigit() else (1, p) for p in parts if p]

    return sorted(set(actors), key=key)
