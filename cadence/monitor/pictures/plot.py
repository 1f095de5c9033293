"""`cadence plot`: reward, accuracy, response length and throughput against the period, 2x2; a run
with held-out evaluation (`eval.jsonl`) adds its eval accuracy, pass@k and reward as marked lines to the
accuracy and reward panels; a run of multi-turn episodes (rows with `turns_mean`) adds a third row:
turns, tool calls, tool errors and environment timeouts an episode, and the environment's seconds and
tokens an episode; a run whose rows measure the gap between the engine's log-probs and the learner's
(`mismatch_kl`) adds a row of its own: its k3 mean (log scale) and the share of tokens and samples
beyond the bound, and the token ratio's extremes with its mean.

Invariant: a key missing from some rows leaves those periods out of its curve, a key missing from
every row leaves its curve (or panel) out; neither stops the picture. From `_SMOOTH_FROM` periods
on, each curve is drawn faint with a trailing moving average over it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cadence.monitor.pictures import PictureError, check_run_dir, picture_format, read_metrics
from cadence.monitor.run_dir import read_new_lines

_SMOOTH_FROM = 40
_BLUE = "#4C72B0"
_ORANGE = "#DD8452"
_GREEN = "#2CA02C"
_PURPLE = "#8172B3"
_RED = "#C44E52"


def draw_plot(run_dir: Path, out: Path) -> Path:
    """Draw the per-period curves of the run in `run_dir` into `out` (.png or .svg); return `out`."""
    fmt = picture_format(out)
    check_run_dir(run_dir)
    rows = read_metrics(run_dir)
    if not rows:
        raise PictureError(f"no periods in {run_dir / 'metrics.jsonl'}: is it a cadence run directory?")

    import matplotlib
    from matplotlib.figure import Figure

    played = any(_number(row.get("turns_mean")) for row in rows)
    sampled = any(_number(row.get("groups_filtered")) for row in rows)
    mismatched = any(_number(row.get("mismatch_kl")) for row in rows)
    height = 2 + played + sampled + mismatched
    fig = Figure(figsize=(12, 3.6 * height + 0.3), dpi=150, layout="constrained")
    panels = fig.subplots(height, 2, sharex=True)
    (reward, accuracy), (length, speed) = panels[0], panels[1]
    smooth = len(rows) >= _SMOOTH_FROM
    window = max(5, len(rows) // 25)

    x, mean = series(rows, "reward_mean")
    if x:
        xb, both = _band(rows)
        if xb:
            lo = [m - d for m, d in both]
            hi = [m + d for m, d in both]
            reward.fill_between(xb, lo, hi, color=_BLUE, alpha=0.15, linewidth=0, label="mean ± std")
        _curve(reward, x, mean, _BLUE, "mean", smooth, window)
    evals = read_new_lines(run_dir / "eval.jsonl", 0)[0]
    _eval_curve(reward, evals, "eval_reward", "eval reward (held out)", _RED, "o")
    _finish(reward, "reward", "reward_mean", bool(x))

    x, acc = series(rows, "accuracy")
    if x:
        _curve(accuracy, x, acc, _GREEN, "accuracy", smooth, window)
        accuracy.set_ylim(-0.03, 1.03)
    _eval_curve(accuracy, evals, "eval_accuracy", "eval accuracy (held out)", _RED, "o")
    _eval_curve(accuracy, evals, "eval_pass_at_k", "eval pass@k (held out)", _RED, "^", dashed=True)
    _finish(accuracy, "accuracy", "accuracy", bool(x))

    x, resp = series(rows, "response_len_mean")
    if x:
        _curve(length, x, resp, _PURPLE, "mean response length", smooth, window)
        length.set_ylabel("tokens")
    _finish(length, "response length", "response_len_mean", bool(x))

    tokens = (*series(rows, "tokens_per_s"), _BLUE, "tokens/s", "tokens/s")
    samples = (*series(rows, "samples_per_s"), _ORANGE, "samples/s", "samples/s")
    drawn, paired = _two_scales(speed, tokens, samples, smooth, window, "lower right")
    _finish(speed, "throughput", "tokens_per_s", drawn, legend=not paired)

    if played:
        _episodes(rows, panels[2][0], panels[2][1], smooth, window)
    if sampled:
        _sampling(rows, panels[2 + played][0], panels[2 + played][1], smooth, window)
    if mismatched:
        _mismatch(rows, panels[-1][0], panels[-1][1], smooth, window)
    for ax in panels[-1]:
        ax.set_xlabel("period")
    note = f", moving average over {window} periods" if smooth else ""
    fig.suptitle(f"{run_dir}: {len(rows)} periods{note}", fontsize=11)
    out.parent.mkdir(parents=True, exist_ok=True)
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        fig.savefig(out, format=fmt)
    return out


def _episodes(rows: list[dict[str, Any]], turns: Any, env: Any, smooth: bool, window: int) -> None:
    """The episode panels: what an episode did (turns, tool calls, errors, timeouts) and what its
    environment took (seconds and tokens), each a mean over the period's episodes."""
    drawn = False
    for key, label, colour in (
        ("turns_mean", "model turns", _BLUE),
        ("tool_calls", "tool calls", _GREEN),
        ("tool_errors", "tool errors", _ORANGE),
        ("env_timeouts", "environment timeouts", _RED),
    ):
        x, y = series(rows, key) if key == "turns_mean" else per_episode(rows, key)
        if x:
            _curve(turns, x, y, colour, label, smooth, window)
            drawn = True
    turns.set_ylabel("an episode")
    _finish(turns, "episodes", "turns_mean", drawn)

    seconds = (*per_episode(rows, "env_s"), _PURPLE, "seconds in environment calls", "seconds an episode")
    tokens = (*per_episode(rows, "env_tokens"), _ORANGE, "environment tokens", "tokens an episode")
    drawn, paired = _two_scales(env, seconds, tokens, smooth, window, "best")
    _finish(env, "environment", "env_s", drawn, legend=not paired)


# a curve on its own scale: (periods, values, colour, label, the axis's label)
Scaled = tuple[list[float], list[float], str, str, str]


def _sampling(rows: list[dict[str, Any]], groups: Any, times: Any, smooth: bool, window: int) -> None:
    """The panels of an over-sampled run: a period's groups kept, filtered and stopped; its period
    time and tail (the last kept group to the step)."""
    for key, colour, label in (
        ("groups", _GREEN, "kept"),
        ("groups_filtered", _ORANGE, "filtered"),
        ("groups_stopped", _RED, "stopped"),
    ):
        x, y = series(rows, key)
        if x:
            _curve(groups, x, y, colour, label, smooth, window)
    groups.set_ylabel("groups")
    _finish(groups, "groups a period", "groups_filtered", True)
    period = (*series(rows, "period_s"), _BLUE, "period", "seconds")
    tail = (*series(rows, "tail_s"), _PURPLE, "tail", "seconds")
    drawn, paired = _two_scales(times, period, tail, smooth, window, "upper right")
    _finish(times, "period and tail", "tail_s", drawn, legend=not paired)


def _mismatch(rows: list[dict[str, Any]], gap: Any, ratios: Any, smooth: bool, window: int) -> None:
    """The engine-learner gap: its k3 mean (log scale) with the shares beyond the bound on a second
    scale; the token ratio pi_learner / pi_engine, its mean and extremes."""
    kl = (*series(rows, "mismatch_kl"), _BLUE, "k3 mean (KL engine || learner)", "k3 a token")
    beyond = (*series(rows, "mismatch_beyond_token_share"), _ORANGE, "tokens beyond the bound", "share")
    drawn, paired = _two_scales(gap, kl, beyond, smooth, window, "upper right")
    if kl[0] and min(kl[1]) > 0:
        gap.set_yscale("log")
    _finish(gap, "engine-learner gap", "mismatch_kl", drawn, legend=not paired)
    drawn = False
    for key, colour, label in (
        ("mismatch_ratio_max", _RED, "largest"),
        ("mismatch_ratio_mean", _GREEN, "mean"),
        ("mismatch_ratio_min", _PURPLE, "smallest"),
    ):
        x, y = series(rows, key)
        if x:
            _curve(ratios, x, y, colour, label, smooth, window)
            drawn = True
    if drawn:
        ratios.axhline(1.0, color="#777777", linewidth=0.8)
        ratios.set_ylabel("pi_learner / pi_engine")
    _finish(ratios, "token ratio", "mismatch_ratio_max", drawn)


def _two_scales(
    ax: Any, left: Scaled, right: Scaled, smooth: bool, window: int, loc: str
) -> tuple[bool, bool]:
    """`left` on `ax`'s scale and `right` on a second scale at its right (on `ax` itself when `left`
    has no point), one legend for both; (any curve drawn, both drawn)."""
    x, y, colour, label, unit = left
    if x:
        _curve(ax, x, y, colour, label, smooth, window)
        ax.set_ylabel(unit, color=colour)
    xr, yr, colour, label, unit = right
    if xr:
        twin = ax.twinx() if x else ax
        _curve(twin, xr, yr, colour, label, smooth, window)
        twin.set_ylabel(unit, color=colour)
        if x:
            handles = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
            ax.legend(handles=handles, loc=loc, fontsize=8)
    return bool(x or xr), bool(x and xr)


def per_episode(rows: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """(period, the row's `key` over its `samples`, the period's episodes) of the rows that hold both,
    with at least one episode."""
    xs, ys = [], []
    for i, row in enumerate(rows):
        episodes = row.get("samples")
        if _number(row.get(key)) and isinstance(episodes, int | float) and episodes > 0:
            xs.append(float(row.get("period", i)))
            ys.append(float(row[key]) / episodes)
    return xs, ys


def series(rows: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """(period, value) of the rows that hold a number under `key`."""
    xs, ys = [], []
    for i, row in enumerate(rows):
        if _number(row.get(key)):
            xs.append(float(row.get("period", i)))
            ys.append(float(row[key]))
    return xs, ys


def _band(rows: list[dict[str, Any]]) -> tuple[list[float], list[tuple[float, float]]]:
    """(period, (reward mean, reward std)) of the rows that hold both."""
    xs, pairs = [], []
    for i, row in enumerate(rows):
        if _number(row.get("reward_mean")) and _number(row.get("reward_std")):
            xs.append(float(row.get("period", i)))
            pairs.append((float(row["reward_mean"]), float(row["reward_std"])))
    return xs, pairs


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def moving_average(values: list[float], window: int) -> list[float]:
    """The mean of each value and the up to `window - 1` values before it."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def _curve(
    ax: Any, x: list[float], y: list[float], colour: str, label: str, smooth: bool, window: int
) -> None:
    if smooth:
        ax.plot(x, y, color=colour, alpha=0.3, linewidth=0.7)
        ax.plot(x, moving_average(y, window), color=colour, linewidth=1.8, label=label)
    else:
        ax.plot(x, y, color=colour, linewidth=1.4, marker="o", markersize=2.5, label=label)


def _eval_curve(
    ax: Any, evals: list[dict[str, Any]], key: str, label: str, colour: str, marker: str, dashed: bool = False
) -> None:
    """The eval rounds' `key` against the period evaluated, unsmoothed (rounds are few)."""
    x, y = series(evals, key)
    if x:
        style = "--" if dashed else "-"
        ax.plot(x, y, color=colour, linestyle=style, linewidth=1.4, marker=marker, markersize=4, label=label)


def _finish(ax: Any, title: str, key: str, drawn: bool, legend: bool = True) -> None:
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    if not drawn:
        ax.text(0.5, 0.5, f"no {key} in metrics.jsonl", transform=ax.transAxes, ha="center", color="#777777")
    elif legend:
        ax.legend(loc="best", fontsize=8)
