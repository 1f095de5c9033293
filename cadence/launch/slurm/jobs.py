"""The Slurm jobs of a run: `DIR/slurm/jobs.json`, and the client commands (sbatch, squeue, scancel,
scontrol) that submit, watch and cancel them.

Invariant: every job id a command submitted is in `jobs.json` with its role before the command
returns; a missing client command or a refusal by Slurm is one `SlurmError` with Slurm's own words.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cadence.launch.slurm.allocation import SlurmError
from cadence.monitor.run_dir import write_whole

Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


def run_command(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    """Run a Slurm client command; `SlurmError` when it is not installed or fails."""
    if shutil.which(args[0]) is None:
        raise SlurmError(f"{args[0]} is not on PATH: run this on a host of the cluster with Slurm's client")
    proc = subprocess.run(list(args), capture_output=True, text=True, timeout=120, check=False)
    if proc.returncode != 0:
        said = (proc.stderr or proc.stdout).strip().splitlines()
        raise SlurmError(f"{' '.join(args[:2])} failed: {said[-1] if said else f'exit {proc.returncode}'}")
    return proc


def jobs_path(out: Path) -> Path:
    return out / "slurm" / "jobs.json"


def read_jobs(out: Path) -> list[dict[str, str]]:
    """The jobs of the Slurm run in `out`; `SlurmError` when `out` is none."""
    path = jobs_path(out)
    if not path.is_file():
        raise SlurmError(
            f"{out} is not a Slurm run: it has no slurm/jobs.json (`cadence slurm submit` writes it)"
        )
    try:
        data: Any = json.loads(path.read_text())
        return [{"id": str(j["id"]), "role": str(j["role"])} for j in data["jobs"]]
    except (ValueError, KeyError, TypeError) as err:
        raise SlurmError(
            f"{path} is damaged ({err}): it lists a run's jobs as written by cadence slurm"
        ) from None


def record_job(out: Path, job_id: str, role: str) -> None:
    """Add a submitted job to `jobs.json` (written whole, then moved into place)."""
    path = jobs_path(out)
    jobs = read_jobs(out) if path.exists() else []
    jobs.append({"id": job_id, "role": role})
    write_whole(path, json.dumps({"jobs": jobs}, indent=1) + "\n")


def partition_nodes(partition: str, run: Runner = run_command) -> tuple[str, int]:
    """The partition (the default one where `partition` is empty) and how many nodes it has."""
    lines = run(["sinfo", "--noheader", "--format", "%P %D"]).stdout.split()
    sizes: dict[str, int] = {}
    default = ""
    for name, count in zip(lines[::2], lines[1::2], strict=False):
        if name.endswith("*"):
            name = default = name[:-1]
        sizes[name] = sizes.get(name, 0) + int(count)
    chosen = partition or default
    if chosen not in sizes:
        raise SlurmError(f"partition {chosen!r} is not one of this cluster's: {', '.join(sorted(sizes))}")
    return chosen, sizes[chosen]


def sbatch(script: Path, args: Sequence[str], run: Runner = run_command) -> str:
    """Submit `script` with `args` before it; the job id."""
    proc = run(["sbatch", "--parsable", *args, str(script)])
    job = proc.stdout.strip().split(";")[0]
    if not job.isdigit():
        raise SlurmError(f"sbatch answered {proc.stdout.strip()!r}, no job id")
    return job


def job_states(ids: Sequence[str], run: Runner = run_command) -> dict[str, tuple[str, str]]:
    """Each of `ids` still known to `squeue`: its state and its nodes (or the reason it waits)."""
    if not ids:
        return {}
    proc = run(["squeue", "--noheader", "--jobs", ",".join(ids), "--format", "%i|%T|%R"])
    states: dict[str, tuple[str, str]] = {}
    for line in proc.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 3:
            states[parts[0]] = (parts[1], parts[2])
    return states


def squeue_jobs(ids: Sequence[str], run: Runner = run_command) -> dict[str, tuple[str, str]]:
    """`job_states`, where a finished job that squeue no longer knows is simply left out (squeue
    refuses a list of only such ids)."""
    try:
        return job_states(ids, run)
    except SlurmError as err:
        if "Invalid job id" in str(err):
            return {}
        raise


ENDED = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
)
"""States a job does not leave: it will never run (again)."""


def ended_state(job: str, run: Runner = run_command) -> str:
    """The state `scontrol show job` gives a job squeue no longer lists (it keeps a finished job for
    MinJobAge, 300 s by default); "GONE" once Slurm has forgotten it."""
    try:
        text = run(["scontrol", "show", "job", "-o", job]).stdout
    except SlurmError:
        return "GONE"
    fields = dict(f.split("=", 1) for f in text.split() if "=" in f)
    return fields.get("JobState", "GONE") or "GONE"


def job_ended(ids: Sequence[str], run: Runner = run_command) -> dict[str, str]:
    """Each of `ids` that has ended, with its last state: not in squeue, or in a state of `ENDED`."""
    states = squeue_jobs(ids, run)
    ended = {j: state for j, (state, _) in states.items() if state in ENDED}
    ended.update({j: ended_state(j, run) for j in ids if j not in states})
    return ended


def scancel(ids: Sequence[str], run: Runner = run_command) -> None:
    if ids:
        run(["scancel", *ids])
