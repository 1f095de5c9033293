"""`cadence slurm add-workers|status|stop`: a run's life on a cluster, from its login node.

Invariant: each command reads the jobs' states from Slurm and the run's folder and says what is
true. A control job that ended without the run's summary is named with its state: `add-workers`
refuses, `status` says the run is dead, `stop` cancels what is left and writes the summary of the
periods `metrics.jsonl` holds (those its resume checkpoint holds, when it has one). A control job
RUNNING whose dispatcher has gone silent (`cadence.launch.alive`) is said so by `status` and stopped
as a dead one. A summary the disk refuses is one `SlurmError` and leaves no file behind. A live run is stopped cleanly: a resume checkpoint, then the summary
of exactly the periods it holds, and its jobs end on their own (COMPLETED); only jobs that never
started, or any still there after the timeout, are cancelled. `stop` returns once squeue shows none.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cadence.launch.alive import STALE_S, alive_age
from cadence.launch.slurm.allocation import SlurmError
from cadence.launch.slurm.jobs import (
    ENDED,
    Runner,
    ended_state,
    partition_nodes,
    read_jobs,
    record_job,
    run_command,
    sbatch,
    scancel,
    squeue_jobs,
)
from cadence.launch.slurm.task import STOP_FILE
from cadence.launch.slurm.workers import dispatcher_view
from cadence.monitor.period_metrics import PeriodMetrics
from cadence.monitor.run_dir import read_new_lines, summarize, write_json
from cadence.training.resume import ResumeError, find_resume


def _check_live(out: Path) -> list[dict[str, str]]:
    jobs = read_jobs(out)
    if (out / "summary.json").exists():
        raise SlurmError(f"the run in {out} has ended (summary.json): nothing to add or stop")
    return jobs


def job_state(job: str, states: dict[str, tuple[str, str]], run: Runner) -> str:
    """Its state in squeue (`states`), else the last one Slurm knows ("GONE" once forgotten)."""
    return states[job][0] if job in states else ended_state(job, run)


def control_state(out: Path, run: Runner = run_command) -> tuple[str, str]:
    """The run's control job and its state."""
    control = next((j["id"] for j in read_jobs(out) if j["role"] == "control"), "")
    return control, job_state(control, squeue_jobs([control], run), run) if control else "GONE"


def periods_recorded(out: Path) -> list[dict[str, Any]]:
    return read_new_lines(out / "metrics.jsonl", 0)[0]


def add_workers(
    out: Path,
    count: int,
    partition: str = "",
    after: str = "",
    run: Runner = run_command,
    say: Callable[[str], None] = print,
    submitted: list[dict[str, str]] | None = None,
) -> list[dict[str, str]]:
    """Submit `count` more rollout jobs that join the run in `out` (on `partition`, if given); each
    is appended to `submitted` as it goes."""
    _check_live(out)
    if count < 1:
        raise SlurmError(f"--count {count}: at least one worker")
    if partition:
        partition_nodes(partition, run)
    if not after:
        control, state = control_state(out, run)
        if state in ENDED or state == "GONE":
            raise SlurmError(
                f"the control job {control} has ended ({state}) without ending the run: a worker would"
                f" find no dispatcher (`cadence slurm status {out}`)"
            )
    args = ([f"--dependency=after:{after}"] if after else []) + (
        [f"--partition={partition}"] if partition else []
    )
    added: list[dict[str, str]] = []
    for _ in range(count):
        job = {"id": sbatch(out / "slurm" / "rollout.sbatch", args, run), "role": "rollout"}
        added.append(job)
        if submitted is not None:
            submitted.append(job)
        record_job(out, job["id"], "rollout")
        say(f"cadence: rollout job {job['id']} (worker rollout-{job['id']})")
    return added


def status(
    out: Path, run: Runner = run_command, alive: Callable[[Path], float | None] = alive_age
) -> dict[str, Any]:
    """Each job's Slurm state (the last one Slurm knows for a finished job) and, for a rollout job,
    what the dispatcher says of its worker while it runs ("no dispatcher" else); the run's last
    metrics row; whether it is going, silent (its control job RUNNING to Slurm, its dispatcher not:
    `alive` is the age of its last sign of life, `cadence.launch.alive`), waiting for its control
    job, ended, or dead (its control job ended without its summary)."""
    jobs = read_jobs(out)
    states = squeue_jobs([j["id"] for j in jobs], run)
    rows = periods_recorded(out)
    listed = [
        {**j, "state": job_state(j["id"], states, run), "where": states.get(j["id"], ("", ""))[1]}
        for j in jobs
    ]
    control = next((j for j in listed if j["role"] == "control"), {"id": "", "state": "GONE"})
    ended = (out / "summary.json").exists()
    age = alive(out)
    if ended:
        run_state = "ended"
    elif control["state"] in ENDED or control["state"] == "GONE":
        run_state = "dead"
    elif control["state"] != "RUNNING":
        run_state = "waiting"
    elif age is not None and age >= STALE_S:
        run_state = "silent"
    else:
        run_state = "going"
    view = dispatcher_view(out) if run_state == "going" else {}
    for entry in listed:
        if entry["role"] == "rollout":
            seen = view.get(f"rollout-{entry['id']}", {}).get("state", "not seen")
            entry["worker"] = seen if run_state == "going" else "no dispatcher"
            entry["weights_from"] = ((rows[-1] if rows else {}).get("weights_from") or {}).get(
                f"rollout-{entry['id']}", ""
            )
    return {
        "jobs": listed,
        "last_period": rows[-1] if rows else None,
        "periods": len(rows),
        "ended": ended,
        "run": run_state,
        "control": {"id": control["id"], "state": control["state"]},
        "dispatcher_silent_s": round(age) if run_state == "silent" and age is not None else None,
    }


def stop(
    out: Path,
    timeout_s: float = 600.0,
    run: Runner = run_command,
    say: Callable[[str], None] = print,
    alive: Callable[[Path], float | None] = alive_age,
) -> dict[str, Any]:
    """End the run in `out` (see the module's invariant) and wait until squeue shows none of its jobs;
    the summary. A control job RUNNING whose dispatcher is silent (`alive`) is a dead one: its jobs
    cancelled, the summary written here."""
    jobs = _check_live(out)
    ids = [j["id"] for j in jobs]
    control, state = control_state(out, run)
    if state == "RUNNING" and not _silent(out, alive):
        (out / "slurm" / STOP_FILE).touch()  # no byte needed: a full disk takes it
        say("cadence: asked the control job to end the run (a resume checkpoint, then the summary)")
        _until(lambda: (out / "summary.json").exists() or control_state(out, run)[1] != "RUNNING"
               or _silent(out, alive), timeout_s, "summary.json")  # fmt: skip
        state = control_state(out, run)[1]
    if state == "RUNNING" and _silent(out, alive) and not (out / "summary.json").exists():
        state = "RUNNING, its dispatcher silent"
    if (out / "summary.json").exists():
        _let_jobs_end(ids, timeout_s, run, say)
    else:  # no dispatcher to end it: its control job ended, or waits in the queue
        say(f"cadence: the control job {control} is {state}: no dispatcher ends the run; cancelling its jobs")
        scancel([j for j in ids if j in squeue_jobs(ids, run)], run)
        _until(lambda: not squeue_jobs(ids, run), timeout_s, "every job of the run to leave squeue")
        _summary_of_recorded(out, f"{control} {state}")
    summary: dict[str, Any] = json.loads((out / "summary.json").read_text())
    ends = ", ".join(f"{j} {ended_state(j, run)}" for j in ids)
    say(
        f"cadence: run in {out} stopped after {summary.get('periods', 0)} periods"
        f"{_checkpoint_note(out)}; no job of it is left ({ends})"
    )
    return summary


def _let_jobs_end(ids: list[str], timeout_s: float, run: Runner, say: Callable[[str], None]) -> None:
    """The run has its summary: its running jobs end on their own; those that never started are
    cancelled (they would have nothing to do); any left after `timeout_s` too."""
    pending = [j for j, (state, _) in squeue_jobs(ids, run).items() if state == "PENDING"]
    if pending:
        scancel(pending, run)
    try:
        _until(lambda: not squeue_jobs(ids, run), timeout_s, "the run's jobs to end")
    except SlurmError:
        left = list(squeue_jobs(ids, run))
        say(f"cadence: jobs {', '.join(left)} still there after {timeout_s:.0f}s: cancelling them")
        scancel(left, run)
        _until(lambda: not squeue_jobs(ids, run), timeout_s, "every job of the run to leave squeue")


def _summary_of_recorded(out: Path, control: str) -> None:
    """`summary.json` of the periods in `metrics.jsonl`, for a run whose dispatcher is gone: with a
    resume checkpoint, of those it holds (the run continues from there; `after_checkpoint` counts the
    rows after it), its version the summary's `final_version`."""
    rows = [PeriodMetrics.from_row(r) for r in periods_recorded(out)]
    config = json.loads((out / "config.json").read_text())
    extra: dict[str, Any] = {"stopped": True, "control_job": control}
    version = len(rows)
    try:
        found = find_resume(out / "checkpoints")
    except ResumeError:
        found = None
    if found is not None:
        version = int(found[1]["version"])
        kept = [r for r in rows if r.period < version]
        if len(kept) < len(rows):
            extra["after_checkpoint"] = len(rows) - len(kept)
        rows = kept
    wall_s = sum(r.period_s for r in rows)  # the periods' own; the run's wall time is not known
    summary = summarize(rows, str(config.get("mode", "")), wall_s, version, "")
    try:
        write_json(out / "summary.json", {**summary, **extra})
    except OSError as err:
        raise SlurmError(
            f"summary.json not written in {out} ({os.strerror(err.errno or 0)}): metrics.jsonl holds"
            f" {len(rows)} periods; free some room and run `cadence slurm stop {out}` again"
        ) from None


def _silent(out: Path, alive: Callable[[Path], float | None]) -> bool:
    age = alive(out)
    return age is not None and age >= STALE_S


def _checkpoint_note(out: Path) -> str:
    try:
        found = find_resume(out / "checkpoints")
    except ResumeError:
        return "; its resume checkpoint is damaged"
    return f"; resume checkpoint at version {found[1]['version']}" if found else "; no resume checkpoint"


def _until(ready: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise SlurmError(f"gave up waiting for {what} after {timeout_s:.0f}s")
        time.sleep(1.0)
