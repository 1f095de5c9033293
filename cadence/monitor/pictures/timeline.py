"""`cadence timeline`: who works when, a row per actor and a bar per span, over a few periods.

Invariant: every span that overlaps the window is drawn at least `_MIN_PX` pixels wide, so a span
shorter than a pixel still shows; widths otherwise are exact, on a time axis from the window's start.
A worker's environment waits (inside its generation) are drawn over its generation bar, and so is the
generation a closed period stopped (from the stop to the batch's end, in a paler colour).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cadence.monitor.pictures import PictureError, check_run_dir, picture_format, read_metrics
from cadence.monitor.pictures.spans import (
    Span,
    Window,
    choose_window,
    clip,
    idle_gaps,
    period_starts,
    read_spans,
    row_order,
    seconds_by_period,
)

# what a span kind is shown as, and its colour
_CATEGORY = {
    "generate": "generation",
    "call": "generation",  # an agent's call to the worker's endpoint (inside the batch's generation)
    "stopped": "stopped generation",
    "environment": "environment",
    "train": "training",
    "step": "optimizer step",
    "publish": "weight sync",
    "load": "weight sync",
}
_COLOURS = {
    "generation": "#4C72B0",
    "stopped generation": "#9AA9C4",
    "environment": "#CCB974",
    "training": "#DD8452",
    "optimizer step": "#C44E52",
    "weight sync": "#2CA02C",
    "other": "#8172B3",
}
_IDLE = "#F2F2F2"
_IDLE_HATCH = "#C8C8C8"
_WIDTH_IN = 14.0
_DPI = 150
_MIN_PX = 1.5
_BAR = 0.72
_MAX_PERIOD_LABELS = 16


def draw_timeline(run_dir: Path, out: Path, periods: tuple[int, int] | None = None) -> Path:
    """Draw the spans of `periods` (A, B: periods A to B; default: 4 from the middle of the run)
    of the run in `run_dir` into `out` (.png or .svg) and return `out`."""
    fmt = picture_format(out)
    check_run_dir(run_dir)
    spans = read_spans(run_dir)
    if not spans:
        raise PictureError(f"no span events in {run_dir / 'logs'}: is it a cadence run directory?")
    try:
        window = choose_window(spans, periods)
    except PictureError as err:
        raise PictureError(f"{run_dir}: {err}") from None

    import matplotlib
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    shown = clip(spans, window)
    gaps = idle_gaps(spans, window)
    rows = row_order({s.actor for s in shown} | {a for a, g in gaps.items() if g})
    length = max(window.end - window.start, 1e-9)
    fig = Figure(figsize=(_WIDTH_IN, 1.9 + 0.5 * len(rows)), dpi=_DPI, layout="constrained")
    ax = fig.add_subplot()
    axes_px = _WIDTH_IN * _DPI * 0.86
    min_w = length * _MIN_PX / axes_px

    for y, actor in enumerate(rows):
        idle = [(a - window.start, b - a) for a, b in gaps.get(actor, [])]
        ax.broken_barh(
            idle, (y - _BAR / 2, _BAR), facecolors=_IDLE, edgecolors=_IDLE_HATCH, hatch="////", linewidth=0
        )
        by_category: dict[str, list[tuple[float, float]]] = {}
        for s in shown:
            if s.actor == actor:
                bar = (s.start - window.start, max(s.end - s.start, min_w))
                by_category.setdefault(_CATEGORY.get(s.kind, "other"), []).append(bar)
        for category, bars in by_category.items():
            # nested in the generation it interrupts, or ends (a period closed meanwhile)
            on_top = 2 if category in ("environment", "stopped generation") else 1
            ax.broken_barh(
                bars, (y - _BAR / 2, _BAR), facecolors=_COLOURS[category], linewidth=0, zorder=on_top
            )
        busy = _busy_share(shown, actor, gaps.get(actor, []))
        if busy is not None:
            ax.text(1.003, y, f"busy {busy:.0%}", transform=ax.get_yaxis_transform(), va="center", fontsize=8)

    _period_lines(ax, spans, window)
    ax.set_xlim(0, length)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_yticks(range(len(rows)), rows)
    ax.set_xlabel(f"seconds from the start of period {window.first}")
    ax.tick_params(axis="y", length=0)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)

    used = [c for c in _COLOURS if any(_CATEGORY.get(s.kind, "other") == c for s in shown)]
    handles = [Patch(facecolor=_COLOURS[c], label=c) for c in used]
    handles.append(Patch(facecolor=_IDLE, edgecolor=_IDLE_HATCH, hatch="////", linewidth=0, label="idle"))
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), frameon=False)
    fig.suptitle(_title(run_dir, window, spans), fontsize=11)

    out.parent.mkdir(parents=True, exist_ok=True)
    with matplotlib.rc_context({"svg.fonttype": "none", "hatch.linewidth": 0.6}):
        fig.savefig(out, format=fmt)
    return out


def _busy_share(shown: list[Span], actor: str, gaps: list[tuple[float, float]]) -> float | None:
    """The share of the actor's time in the window (from its first to its last instant) not idle."""
    own = [s for s in shown if s.actor == actor]
    if not own and not gaps:
        return None
    lo = min([s.start for s in own] + [a for a, _ in gaps])
    hi = max([s.end for s in own] + [b for _, b in gaps])
    if hi <= lo:
        return None
    return 1.0 - sum(b - a for a, b in gaps) / (hi - lo)


def _period_lines(ax: Any, spans: list[Span], window: Window) -> None:
    """Dashed lines where periods begin, and each period's number centred above it."""
    starts = period_starts(spans)
    edges = [window.start]
    for k in range(window.first + 1, window.last + 1):
        edges.append(starts.get(k, edges[-1]))
    edges.append(window.end)
    count = window.last - window.first + 1
    stride = max(1, -(-count // _MAX_PERIOD_LABELS))
    transform = ax.get_xaxis_transform()
    for i, k in enumerate(range(window.first, window.last + 1)):
        a, b = edges[i] - window.start, edges[i + 1] - window.start
        ax.axvline(a, color="#555555", linestyle="--", linewidth=0.8, zorder=3)
        if i % stride == 0 and b > a:
            label = f"period {k}" if count <= 8 else str(k)
            ax.text((a + b) / 2, 1.01, label, transform=transform, ha="center", va="bottom", fontsize=9)
    ax.axvline(edges[-1] - window.start, color="#555555", linestyle="--", linewidth=0.8, zorder=3)


def _title(run_dir: Path, window: Window, spans: list[Span]) -> str:
    total = max(s.period for s in spans) + 1
    if window.last == window.first:
        head = f"{run_dir}: period {window.first} of {total}"
    else:
        head = f"{run_dir}: periods {window.first} to {window.last} of {total}"
    rows = [r for r in read_metrics(run_dir) if window.first <= r.get("period", -1) <= window.last]
    figures = []
    for key, name in (
        ("period_s", "period"),
        ("gen_s", "generation"),
        ("train_s", "training"),
        ("overlap_s", "overlap"),
        ("trainer_idle_s", "trainer idle"),
        ("weight_sync_s", "weight sync"),
    ):
        values = [float(r[key]) for r in rows if isinstance(r.get(key), int | float)]
        if values:
            figures.append(f"{name} {_seconds(sum(values) / len(values))}")
    shown = [s for s in spans if window.first <= s.period <= window.last]
    waits = seconds_by_period(shown, "environment")
    if waits:  # the worker that waited longest, a period
        figures.append(f"environment {_seconds(sum(waits.values()) / (window.last - window.first + 1))}")
    if not figures:
        return head
    return f"{head}\nmean of the periods shown: " + ", ".join(figures)


def _seconds(value: float) -> str:
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"
