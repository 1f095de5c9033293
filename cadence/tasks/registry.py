"""Tasks by name: the one place `task.name` is turned into a prompt source and a scorer."""

from __future__ import annotations

from cadence.config import TaskConfig
from cadence.tasks.base import Task
from cadence.tasks.digits import DigitsTask


def make_task(cfg: TaskConfig, seed: int, held_out: int = 0) -> Task:
    """`held_out`: records of a file or reasoning_gym task kept from training for evaluation
    (`cadence.tasks.heldout.held_out`); the generated tasks hold out nothing, their eval prompts come
    from another seed stream."""
    if cfg.name == "digits":
        return DigitsTask(cfg, seed)
    if cfg.name == "arithmetic":
        from cadence.tasks.arithmetic import ArithmeticTask

        return ArithmeticTask(cfg, seed)
    if cfg.name == "file":
        from cadence.tasks.dataset import FileTask

        return FileTask(cfg, seed, held_out)
    if cfg.name == "reasoning_gym":
        from cadence.tasks.gym import ReasoningGymTask

        return ReasoningGymTask(cfg, seed, held_out)
    raise ValueError(
        f"task.name {cfg.name!r} is unknown; known: 'digits', 'arithmetic', 'file', 'reasoning_gym'"
    )
