"""The learning rate of each optimizer step (`trainer.lr_schedule`, `trainer.warmup_periods`).

Invariant: the rate is a pure function of the step's index in the run (period x steps_per_period +
the step within the period) and the run's shape, so a run resumed at period k continues the schedule
exactly where the uninterrupted run would be: nothing but the period needs saving.
"""

from __future__ import annotations

import math

SCHEDULES = ("constant", "linear", "cosine")


def lr_at(
    step: int, lr: float, schedule: str, total_steps: int, warmup_steps: int = 0, min_ratio: float = 0.0
) -> float:
    """The rate of step `step` (0-based) of `total_steps`: warmup steps rise linearly, lr x (s + 1) / W,
    then constant lr, or from lr down towards lr x min_ratio, linearly or along a half cosine, with
    progress p = (s - W) / (total - W): the first step after the warmup at lr, the last one step short
    of the end value (as Hugging Face's schedules)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"trainer.lr_schedule must be one of {list(SCHEDULES)}, got {schedule!r}")
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if schedule == "constant":
        return lr
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    shape = 1.0 - progress if schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
    return lr * (min_ratio + (1.0 - min_ratio) * shape)
