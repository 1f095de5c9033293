"""`cadence slurm submit|add-workers|status|stop`: a run's life on a cluster, from its login node.

Invariant: nothing is submitted for a folder that holds a run (the rule of `cadence run`), and every
job a command submitted is recorded in `DIR/slurm/jobs.json` before the next one; `stop` ends the run
(its summary written) before it cancels what is left, and returns once `squeue` shows none of its jobs.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cadence.config import load_config
from cadence.launch.launcher import LaunchError, check_out, prepare
from cadence.launch.slurm.allocation import SlurmError
from cadence.launch.slurm.jobs import Runner, read_jobs, record_job, run_command, sbatch, scancel, squeue_jobs
from cadence.launch.slurm.scripts import SubmitOptions, control_script, rollout_script
from cadence.launch.slurm.task import STOP_FILE
from cadence.monitor.run_dir import read_jsonl


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


def submit(
    config: Path,
    overrides: Sequence[str],
    out: Path,
    opts: SubmitOptions,
    dry_run: bool = False,
    run: Runner = run_command,
    say: Callable[[str], None] = print,
) -> list[dict[str, str]]:
    """Write the run's folder and scripts and submit its jobs (with `dry_run`, print them instead and
    touch nothing); the jobs submitted."""
    try:
        check_out(out, overwrite=False)
    except LaunchError as err:
        raise SlurmError(str(err)) from None
    ranks = opts.trainer_nodes * opts.ranks_per_node
    cfg = load_config(config, overrides, {"trainer.ranks": ranks} if ranks > 1 else {})
    out = out.resolve()
    if not dry_run and run is run_command and shutil.which("sbatch") is None:
        raise SlurmError("sbatch is not on PATH: submit from a host of the cluster with Slurm's client")
    if not dry_run:
        name, size = partition_nodes(opts.partition, run)
        if opts.trainer_nodes > size:
            raise SlurmError(f"--trainer-nodes {opts.trainer_nodes}: partition {name} has {size} nodes")
    cfg = dataclasses.replace(cfg, run_id=cfg.run_id or uuid.uuid4().hex[:12])  # kept by `prepare`
    python = sys.executable
    control = control_script(out, cfg.run_id, opts, python)
    rollout = rollout_script(out, cfg.run_id, opts, python)
    if dry_run:
        say(f"# {out / 'slurm' / 'control.sbatch'}\n{control}")
        say(f"# {out / 'slurm' / 'rollout.sbatch'}\n{rollout}")
        say(f"sbatch --parsable {out / 'slurm' / 'control.sbatch'}")
        for _ in range(opts.rollout_jobs):
            say(f"sbatch --parsable --dependency=after:<control job> {out / 'slurm' / 'rollout.sbatch'}")
        return []
    cfg, _ = prepare(cfg, out, beyond=True)  # its actors bind the nodes' addresses: keys of its own
    folder = out / "slurm"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "control.sbatch").write_text(control)
    (folder / "rollout.sbatch").write_text(rollout)
    (folder / "options.json").write_text(json.dumps(opts.__dict__, default=list, indent=1) + "\n")
    control_id = sbatch(folder / "control.sbatch", [], run)
    record_job(out, control_id, "control")
    say(f"cadence: control job {control_id} (dispatcher, trainer) for run {cfg.run_id} in {out}")
    submitted = [{"id": control_id, "role": "control"}]
    if opts.rollout_jobs:
        submitted += add_workers(out, opts.rollout_jobs, after=control_id, run=run, say=say)
    return submitted


def _check_live(out: Path) -> list[dict[str, str]]:
    jobs = read_jobs(out)
    if (out / "summary.json").exists():
        raise SlurmError(f"the run in {out} has ended (summary.json): nothing to add or stop")
    return jobs


def add_workers(
    out: Path,
    count: int,
    partition: str = "",
    after: str = "",
    run: Runner = run_command,
    say: Callable[[str], None] = print,
) -> list[dict[str, str]]:
    """Submit `count` more rollout jobs that join the run in `out` (on `partition`, if given)."""
    _check_live(out)
    if count < 1:
        raise SlurmError(f"--count {count}: at least one worker")
    args = ([f"--dependency=after:{after}"] if after else []) + (
        [f"--partition={partition}"] if partition else []
    )
    submitted = []
    for _ in range(count):
        job = sbatch(out / "slurm" / "rollout.sbatch", args, run)
        record_job(out, job, "rollout")
        submitted.append({"id": job, "role": "rollout"})
        say(f"cadence: rollout job {job} (worker rollout-{job})")
    return submitted


def status(out: Path, run: Runner = run_command) -> dict[str, Any]:
    """Each job's Slurm state (`GONE` once squeue no longer knows it) and the run's last metrics row."""
    jobs = read_jobs(out)
    states = squeue_jobs([j["id"] for j in jobs], run)
    rows = read_jsonl(out / "metrics.jsonl") if (out / "metrics.jsonl").exists() else []
    return {
        "jobs": [
            {**j, "state": states.get(j["id"], ("GONE", ""))[0], "where": states.get(j["id"], ("", ""))[1]}
            for j in jobs
        ],
        "last_period": rows[-1] if rows else None,
        "ended": (out / "summary.json").exists(),
    }


def stop(
    out: Path,
    timeout_s: float = 600.0,
    run: Runner = run_command,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """End the run in `out` cleanly (a resume checkpoint, then its summary), then cancel every job of it
    and wait until squeue shows none; the summary."""
    jobs = _check_live(out)
    ids = [j["id"] for j in jobs]
    control = [j["id"] for j in jobs if j["role"] == "control"]
    running = squeue_jobs(control, run)
    if any(state == "RUNNING" for state, _ in running.values()):
        (out / "slurm" / STOP_FILE).write_text("stop\n")
        say("cadence: asked the control job to end the run (a resume checkpoint, then the summary)")
        _until(
            lambda: (out / "summary.json").exists() or not squeue_jobs(control, run),
            timeout_s,
            "summary.json",
        )
    scancel(ids, run)
    _until(lambda: not squeue_jobs(ids, run), timeout_s, "every job of the run to leave squeue")
    summary: dict[str, Any] = (
        json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else {}
    )
    say(f"cadence: run in {out} stopped after {summary.get('periods', 0)} periods; no job of it is left")
    return summary


def _until(ready: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise SlurmError(f"gave up waiting for {what} after {timeout_s:.0f}s")
        time.sleep(1.0)
