"""The sbatch scripts of a run: a few `#SBATCH` lines and one `srun … cadence slurm task`.

Invariant: pure text from the options; every value a user gave is quoted for the shell, and a script
runs the same Python that submitted it (a shared filesystem, as the run's folder needs anyway).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

SIGNAL_BEFORE_S = 120
"""How long before its time limit the control job is told (SIGUSR1) to checkpoint and requeue."""


@dataclass(frozen=True)
class SubmitOptions:
    """What `cadence slurm submit` was asked for (each `None`/empty: Slurm's default)."""

    trainer_nodes: int = 1
    gpus_per_node: int = 0
    rollout_jobs: int = 1
    partition: str = ""
    rollout_partition: str = ""
    account: str = ""
    time: str = ""
    qos: str = ""
    rollout_qos: str = ""
    sbatch_args: tuple[str, ...] = field(default_factory=tuple)
    ifname: str = ""
    cpus_per_task: int = 0

    @property
    def ranks_per_node(self) -> int:
        """Trainer processes on each of its nodes: one a GPU, one on a node without."""
        return max(self.gpus_per_node, 1)


def _lines(options: list[tuple[str, str | int]]) -> list[str]:
    return [f"#SBATCH --{name}={shlex.quote(str(value))}" for name, value in options if value]


def _common(opts: SubmitOptions, partition: str, qos: str) -> list[tuple[str, str | int]]:
    return [
        ("partition", partition),
        ("account", opts.account),
        ("time", opts.time),
        ("qos", qos),
        ("cpus-per-task", opts.cpus_per_task),
    ]


def control_script(out: Path, run_id: str, opts: SubmitOptions, python: str) -> str:
    """The control job: the dispatcher, the trainer and its publisher; requeued with its resume
    checkpoint when its time runs out."""
    options: list[tuple[str, str | int]] = [
        ("job-name", f"cadence-control-{run_id}"),
        ("nodes", opts.trainer_nodes),
        ("ntasks-per-node", 1),
        ("gpus-per-node", opts.gpus_per_node),
        *_common(opts, opts.partition, opts.qos),
        ("signal", f"USR1@{SIGNAL_BEFORE_S}"),
        ("output", str(out / "slurm" / "control-%j.out")),
        ("open-mode", "append"),
    ]
    task = [python, "-m", "cadence", "slurm", "task", "--role", "control", str(out)]
    if opts.ifname:
        task += ["--ifname", opts.ifname]
    return _script([*_lines(options), "#SBATCH --requeue", *_extra(opts)], task)


def rollout_script(out: Path, run_id: str, opts: SubmitOptions, python: str, partition: str = "") -> str:
    """A rollout job: one worker that joins the run, and joins it again after a requeue."""
    options: list[tuple[str, str | int]] = [
        ("job-name", f"cadence-rollout-{run_id}"),
        ("nodes", 1),
        ("ntasks-per-node", 1),
        ("gpus-per-node", opts.gpus_per_node),
        *_common(opts, partition or opts.rollout_partition or opts.partition, opts.rollout_qos or opts.qos),
        ("output", str(out / "slurm" / "rollout-%j.out")),
        ("open-mode", "append"),
    ]
    task = [python, "-m", "cadence", "slurm", "task", "--role", "rollout", str(out)]
    return _script([*_lines(options), "#SBATCH --requeue", *_extra(opts)], task)


def _extra(opts: SubmitOptions) -> list[str]:
    return [f"#SBATCH {shlex.quote(arg)}" for arg in opts.sbatch_args]


def _script(header: list[str], task: list[str]) -> str:
    srun = ["srun", "--kill-on-bad-exit=1", *task]
    return "\n".join(["#!/bin/bash", *header, "", "exec " + shlex.join(srun), ""])
