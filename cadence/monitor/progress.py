"""What `cadence run` shows while it runs: a live status line on a terminal, plain lines elsewhere.

On a terminal one line is redrawn in place (period, groups trained of B in the current period,
reward, accuracy, tokens/s, turns an episode in a multi-turn run, elapsed and time left) and a
permanent line is printed every twentieth of the run; without a terminal every period gets one plain
line, as a log would want (a multi-turn run's with its episode figures). The gap between the engine's
log-probs and the learner's is shown only where it matters: a period's `mismatch_kl` above
`MISMATCH_SHOWN` (1e-3, a k3 far above float rounding).

Invariant: the display only reads the run folder (`metrics.jsonl`, the trainer's `train` spans in
`logs/trainer.jsonl`); it never talks to an actor, so a slow terminal cannot slow the run.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TextIO

from cadence.monitor.period_metrics import PeriodMetrics
from cadence.monitor.run_dir import read_new_lines

MISMATCH_SHOWN = 1e-3


def period_line(row: PeriodMetrics, periods: int) -> str:
    return (
        f"period {row.period + 1:>4}/{periods}  reward {row.reward_mean:.3f}  acc {row.accuracy:.3f}"
        f"  period {row.period_s:.2f}s  overlap {row.overlap_s:.2f}s  sync {row.weight_sync_s * 1e3:.0f}ms"
        f"{transports_part(row)}{version_part(row)}"
        f"  {row.tokens_per_s:.0f} tok/s  workers {row.workers_active}{episode_part(row)}{sampling_part(row)}"
        f"{mismatch_part(row)}"
    )


def transports_part(row: PeriodMetrics) -> str:
    """How the workers' versions came (`shm`, `zmq`, a broadcast's backend), "" for a row without it."""
    if not row.weights_from:
        return ""
    return f" ({', '.join(sorted(set(row.weights_from.values())))})"


def version_part(row: PeriodMetrics) -> str:
    """The bytes of the version published (the adapters alone with `[trainer.lora]`), "" for a row
    without them."""
    return f" ({row.version_bytes / 1e6:.1f} MB)" if row.version_bytes else ""


def mismatch_part(row: PeriodMetrics) -> str:
    """The engine-learner gap (its k3 mean, the ratio's extremes, the share of tokens beyond the bound)
    when its k3 is above `MISMATCH_SHOWN`, else ""."""
    if row.mismatch_kl is None or row.mismatch_kl <= MISMATCH_SHOWN:
        return ""
    return (
        f"  mismatch kl {row.mismatch_kl:.2g} ratio [{row.mismatch_ratio_min or 0.0:.3g},"
        f" {row.mismatch_ratio_max or 0.0:.3g}] beyond {row.mismatch_beyond_token_share or 0.0:.2%}"
    )


def sampling_part(row: PeriodMetrics) -> str:
    """An over-sampled run's figures (prompts issued, groups kept, filtered by reason, stopped, the
    tail), "" for a row without them."""
    if row.groups_filtered is None:
        return ""
    reasons = ", ".join(f"{reason} {n}" for reason, n in sorted(row.filtered.items()))
    return (
        f"  issued {row.prompts_issued if row.prompts_issued is not None else '?'}  kept {row.groups}"
        f"  filtered {row.groups_filtered}{f' ({reasons})' if reasons else ''}"
        f"  stopped {row.groups_stopped if row.groups_stopped is not None else '?'}  tail {row.tail_s:.2f}s"
    )


def episode_part(row: PeriodMetrics) -> str:
    """A multi-turn run's episode figures (turns an episode, tool calls and errors; the environment's
    wall seconds, `env_wall_s`, then its seconds summed over the episodes, `env_s`, each after its
    label; its tokens and timeouts; an agent's: sequences an episode, mean and most, and the share
    of episodes of several), "" for a single-turn run's row."""
    if row.turns_mean is None:
        return ""
    agents = (
        f"  sequences {row.sequences_mean:.2f} (max {row.sequences_max or 0}, {row.rewrite_share or 0.0:.0%} rewritten)"
        if row.sequences_mean is not None
        else ""
    )
    return (
        f"  turns {row.turns_mean:.2f}  tools {row.tool_calls or 0} ({row.tool_errors or 0} err)"
        f"  env wall {row.env_wall_s or 0.0:.2f}s episodes {row.env_s or 0.0:.2f}s tokens {row.env_tokens or 0}"
        f"  timeouts {row.env_timeouts or 0}" + agents
    )


def status_line(
    period: int, periods: int, groups: int, batch: int, last: PeriodMetrics | None, elapsed: float
) -> str:
    """The live line: `period` is the one in progress (0-based), `groups` of it trained so far."""
    done = min(period, periods)
    left = elapsed / done * (periods - done) if done else None
    parts = [f"period {min(period + 1, periods):>4}/{periods}", f"groups {groups:>3}/{batch}"]
    if last is not None:
        parts += [
            f"reward {last.reward_mean:.3f}",
            f"acc {last.accuracy:.3f}",
            f"{last.tokens_per_s:.0f} tok/s",
        ]
        if last.turns_mean is not None:
            parts.append(f"turns {last.turns_mean:.2f}")
    parts.append(f"elapsed {_clock(elapsed)}")
    parts.append(f"left {_clock(left) if left is not None else '?'}")
    return "  ".join(parts)


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class Progress:
    """Follows a run folder and prints what it finds; call `poll` now and then, `close` at the end."""

    def __init__(
        self, out: Path, periods: int, batch: int, stream: TextIO, live: bool, first: int = 0
    ) -> None:
        """`first`: the period a resumed run starts at; the lines already in `metrics.jsonl` are not shown."""
        self.out = out
        self.periods = periods
        self.batch = batch
        self.stream = stream
        self.live = live
        self.begin = time.time()
        self.offsets = {"metrics": 0, "trainer": 0}
        for key, path in (("metrics", out / "metrics.jsonl"), ("trainer", out / "logs" / "trainer.jsonl")):
            if first and path.exists():
                self.offsets[key] = path.stat().st_size
        self.last: PeriodMetrics | None = None
        self.period = first
        self.groups: dict[int, int] = {}
        self.every = max(1, periods // 20)
        self._drawn = False

    def poll(self) -> None:
        rows, self.offsets["metrics"] = read_new_lines(self.out / "metrics.jsonl", self.offsets["metrics"])
        if self.live:
            spans, self.offsets["trainer"] = read_new_lines(
                self.out / "logs" / "trainer.jsonl", self.offsets["trainer"]
            )
            for e in spans:
                if e.get("event") == "span" and e.get("kind") == "train" and isinstance(e.get("period"), int):
                    self.groups[e["period"]] = self.groups.get(e["period"], 0) + int(e.get("groups", 1))
        for row in map(PeriodMetrics.from_row, rows):
            self.last = row
            self.period = row.period + 1
            self.groups.pop(row.period, None)
            if not self.live:
                self._print(period_line(row, self.periods))
            elif self.period % self.every == 0 or self.period == self.periods:
                self._clear()
                self._print(period_line(row, self.periods))
        if self.live:
            line = status_line(
                self.period,
                self.periods,
                self.groups.get(self.period, 0),
                self.batch,
                self.last,
                time.time() - self.begin,
            )
            self.stream.write("\r\x1b[2K" + line)
            self.stream.flush()
            self._drawn = True

    def close(self) -> None:
        self._clear()

    def _clear(self) -> None:
        if self._drawn:
            self.stream.write("\r\x1b[2K")
            self.stream.flush()
            self._drawn = False

    def _print(self, line: str) -> None:
        self.stream.write(line + "\n")
        self.stream.flush()
