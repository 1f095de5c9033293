"""Tasks by name: the one place `task.name` is turned into a prompt source and a scorer, or into the
alphabet of its texts alone."""

from __future__ import annotations

from cadence.config import TaskConfig
from cadence.tasks.base import Task
from cadence.tasks.digits import DigitsTask


def unknown_task(name: str) -> ValueError:
    """The error for a `task.name` no task has."""
    return ValueError(
        f"task.name {name!r} is unknown; known: 'digits', 'arithmetic', 'file', 'reasoning_gym'"
    )


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
    raise unknown_task(cfg.name)


def task_alphabet(cfg: TaskConfig, seed: int) -> str:
    """The `alphabet` of the task `make_task(cfg, seed)` builds, without building it: the digits and
    arithmetic tasks' own, a file task's from its records (the file read), a reasoning_gym task's from
    its generated problems."""
    if cfg.name == "digits":
        return DigitsTask.alphabet
    if cfg.name == "arithmetic":
        from cadence.tasks.arithmetic import ArithmeticTask

        return ArithmeticTask.alphabet
    if cfg.name == "file":
        from cadence.tasks.dataset import file_records, records_alphabet

        return records_alphabet(file_records(cfg))
    if cfg.name == "reasoning_gym":
        from cadence.tasks.dataset import records_alphabet
        from cadence.tasks.gym import problem_records, problems

        return records_alphabet(problem_records(cfg, problems(cfg, seed)[1]))
    raise unknown_task(cfg.name)
