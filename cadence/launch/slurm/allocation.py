"""What Slurm tells a task about its job: `SLURM_*` variables into one typed value.

Invariant: a task outside a Slurm job, or a variable Slurm always sets that is missing or malformed,
is one `SlurmError` naming the variable; a hostlist is expanded as `scontrol show hostnames` does.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass


class SlurmError(RuntimeError):
    """A Slurm command or job that cannot go on; the message is for the user, one line."""


@dataclass(frozen=True)
class Allocation:
    """This task's job: `job_id`, its `nodes` in order, this task's node (`node_index`), how often the
    job was requeued (`restarts`) and the host it was submitted from."""

    job_id: str
    nodes: tuple[str, ...]
    node_index: int
    restarts: int = 0
    submit_host: str = ""

    @property
    def first(self) -> bool:
        return self.node_index == 0


def _number(env: Mapping[str, str], name: str, default: str | None = None) -> int:
    text = env.get(name, default)
    if text is None:
        raise SlurmError(f"{name} is not set: `cadence slurm task` runs inside a Slurm job, under srun")
    if not text.isdigit():
        raise SlurmError(f"{name} = {text!r} is not a count")
    return int(text)


def allocation_from_env(env: Mapping[str, str]) -> Allocation:
    """The allocation of the task whose environment is `env`."""
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if not job:
        raise SlurmError("SLURM_JOB_ID is not set: `cadence slurm task` runs inside a Slurm job, under srun")
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        raise SlurmError("SLURM_JOB_NODELIST is not set: `cadence slurm task` runs inside a Slurm job")
    nodes = tuple(expand_hostlist(nodelist))
    index = _number(env, "SLURM_NODEID", "0")
    if index >= len(nodes):
        raise SlurmError(f"SLURM_NODEID = {index}, but the job has {len(nodes)} nodes ({nodelist})")
    restarts = _number(env, "SLURM_RESTART_COUNT", "0")
    return Allocation(str(job), nodes, index, restarts, env.get("SLURM_SUBMIT_HOST", ""))


_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_hostlist(text: str) -> list[str]:
    """`n[1-3,7],gpu-a[01-02]` ─► n1 n2 n3 n7 gpu-a01 gpu-a02 (zero padding kept)."""
    hosts: list[str] = []
    for part in _split_top(text):
        if "[" not in part:
            hosts.append(part)
            continue
        head, _, rest = part.partition("[")
        ranges, _, tail = rest.partition("]")
        if "[" in tail:
            raise SlurmError(f"hostlist {text!r}: one bracket a name is all this reads")
        for item in ranges.split(","):
            match = _RANGE.match(item)
            if match is None:
                raise SlurmError(f"hostlist {text!r}: {item!r} is no number or range")
            low, high = match.group(1), match.group(2) or match.group(1)
            width = len(low)
            hosts += [f"{head}{n:0{width}d}{tail}" for n in range(int(low), int(high) + 1)]
    return hosts


def _split_top(text: str) -> list[str]:
    """Split at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in parts if p]
