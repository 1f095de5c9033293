"""`cadence plot RUN RUN ...`: several runs side by side, one colour a run, named by its folder: the
held-out eval accuracy of each eval round, the training reward a period, and, when a run played
episodes, its tool calls an episode (a run without them draws no line there).

Invariant: each run is read as `cadence plot` reads one (a key missing from a row leaves that period
out, a key missing everywhere leaves the run's line out); runs of different lengths share the axis.
Against seconds (`--x seconds`), a period's figure stands at the end of that period (its `period_s`
and those before it summed), an eval round of version v at the start of period v, when v was made.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cadence.monitor.pictures import PictureError, check_run_dir, picture_format, read_metrics
from cadence.monitor.pictures.plot import per_episode, series
from cadence.monitor.run_dir import read_new_lines

_COLOURS = ("#4C72B0", "#DD8452", "#2CA02C", "#C44E52", "#8172B3", "#937860")


def draw_compare(run_dirs: list[Path], out: Path, seconds: bool = False) -> Path:
    """Draw the runs in `run_dirs` side by side into `out` (.png or .svg), against the period or the
    wall-clock `seconds` since each run's start; return `out`."""
    fmt = picture_format(out)
    runs = []
    for run_dir in run_dirs:
        check_run_dir(run_dir)
        rows = read_metrics(run_dir)
        if not rows:
            raise PictureError(f"no periods in {run_dir / 'metrics.jsonl'}: is it a cadence run directory?")
        runs.append((run_dir, rows, read_new_lines(run_dir / "eval.jsonl", 0)[0]))
    names = _names(run_dirs)

    import matplotlib
    from matplotlib.figure import Figure

    fig = Figure(figsize=(15, 4.5), dpi=150, layout="constrained")
    accuracy, reward, tools = fig.subplots(1, 3, sharex=True)
    # each panel: what a run's line is (from its eval rounds and its period rows), and its marker size
    panels = (
        (accuracy, lambda rows, evals: series(evals, "eval_accuracy"), 4.0),
        (reward, lambda rows, evals: series(rows, "reward_mean"), 2.5),
        (tools, lambda rows, evals: per_episode(rows, "tool_calls"), 2.5),
    )
    drawn = [False] * len(panels)
    for (_, rows, evals), name, colour in zip(runs, names, _colours(len(runs)), strict=True):
        ends = period_ends(rows)
        for i, (ax, line, size) in enumerate(panels):
            x, y = line(rows, evals)
            if seconds:  # an eval round's x is its version: the start of that period
                made = i == 0
                x = [ends.get(int(p) - 1, 0.0) if made else ends.get(int(p), 0.0) for p in x]
            if x:
                ax.plot(x, y, color=colour, marker="o", markersize=size, linewidth=1.4, label=name)
                drawn[i] = True
    _finish(accuracy, "held-out eval accuracy", drawn[0], "no eval.jsonl rounds", (-0.03, 1.03))
    _finish(reward, "training reward (mean a period)", drawn[1], "no reward_mean")
    _finish(tools, "tool calls an episode", drawn[2], "no run played episodes")
    for ax in (accuracy, reward, tools):
        ax.set_xlabel("seconds since the run's start" if seconds else "period")
    fig.suptitle(" vs ".join(names), fontsize=11)
    out.parent.mkdir(parents=True, exist_ok=True)
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        fig.savefig(out, format=fmt)
    return out


def period_ends(rows: list[dict[str, Any]]) -> dict[int, float]:
    """Each period's end, in seconds since the run's start: its `period_s` and those before it summed."""
    ends: dict[int, float] = {}
    total = 0.0
    for row in sorted(rows, key=lambda r: int(r.get("period", 0))):
        total += float(row.get("period_s", 0.0))
        ends[int(row.get("period", 0))] = total
    return ends


def _names(run_dirs: list[Path]) -> list[str]:
    """Each run's folder name, or its whole path where two folders share a name."""
    names = [run_dir.name or str(run_dir) for run_dir in run_dirs]
    if len(set(names)) < len(names):
        return [str(run_dir) for run_dir in run_dirs]
    return names


def _colours(n: int) -> list[str]:
    return [_COLOURS[i % len(_COLOURS)] for i in range(n)]


def _finish(ax: Any, title: str, drawn: bool, missing: str, ylim: tuple[float, float] | None = None) -> None:
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    if not drawn:
        ax.text(0.5, 0.5, missing, transform=ax.transAxes, ha="center", color="#777777")
        return
    if ylim:
        ax.set_ylim(*ylim)
    ax.legend(loc="best", fontsize=8)
