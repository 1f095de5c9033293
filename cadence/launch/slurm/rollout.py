"""A rollout job's task (`cadence slurm task --role rollout DIR`): one worker that joins the run, and
joins it again whenever the control job comes back (requeued), until the run has ended.

```
 DIR/dispatcher.addr, one not joined yet ─► cadence rollout --name rollout-<job id> ─► it ends:
      0, or DIR/summary.json ─► the task ends, 0
      else (the dispatcher gone: its job requeued, or it refused us) ─► wait for the next address
 a new address while the worker runs (a new dispatcher) ─► the worker stopped, started against it
 no such address yet ─► every 5 s: the control job's state (squeue, then scontrol for a finished one)
      ended (COMPLETED/FAILED/CANCELLED/..., or forgotten) without summary.json ─► control_job_gone, 1
      pending, requeued, running ─► wait on; waiting_for_dispatcher every 30 s
      past rollout.wait_for_dispatcher_s ─► no_dispatcher, 1
```

Invariant: the task never waits without end or in silence: while no dispatcher is there it says so
every 30 s, gives up when the control job has ended (naming its state) or after
`rollout.wait_for_dispatcher_s`, and leaves no process of its own behind.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import structlog

from cadence.config import load_config
from cadence.launch.slurm.allocation import Allocation, SlurmError
from cadence.launch.slurm.children import Signals, cadence_command, deaf_to_usr1, stop_children
from cadence.launch.slurm.jobs import Runner, job_ended, read_jobs, run_command

log = structlog.get_logger()

SAY_EVERY_S = 30.0
"""How often a task that waits for its dispatcher says so."""


def worker_name(alloc: Allocation) -> str:
    """A rollout job's worker name: the same after a requeue (the job keeps its id)."""
    return f"rollout-{alloc.job_id}" + (f"-{alloc.node_index}" if len(alloc.nodes) > 1 else "")


class ControlWatch:
    """The run's control job (from `DIR/slurm/jobs.json`), asked of Slurm at most every `every_s`:
    its last state once it has ended, else None (also where Slurm cannot be asked just now)."""

    def __init__(
        self,
        out: Path,
        run: Runner = run_command,
        clock: Callable[[], float] = time.monotonic,
        every_s: float = 5.0,
    ) -> None:
        self.out, self.run, self.clock, self.every_s = out, run, clock, every_s
        self.asked = -float("inf")
        self.state: str | None = None
        self.job = ""

    def ended(self) -> str | None:
        if self.clock() - self.asked < self.every_s:
            return self.state
        self.asked = self.clock()
        try:
            control = [j["id"] for j in read_jobs(self.out) if j["role"] == "control"]
            self.job = control[0] if control else ""
            self.state = job_ended(control[:1], self.run).get(self.job) if control else None
        except (SlurmError, OSError, subprocess.TimeoutExpired) as err:
            log.warning("control_job_unknown", error=str(err))
            self.state = None
        return self.state


def _address(path: Path) -> tuple[str, int] | None:
    try:
        text, mtime = path.read_text().strip(), path.stat().st_mtime_ns
    except OSError:
        return None
    return (text, mtime) if text else None


def _moved(out: Path, seen: int) -> bool:
    try:
        return (out / "dispatcher.addr").stat().st_mtime_ns != seen
    except OSError:
        return False


def next_dispatcher(
    out: Path,
    seen: int | None,
    watch: ControlWatch,
    limit_s: float,
    signals: Signals,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[str, int] | None:
    """The address in `DIR/dispatcher.addr` once it is one this task has not joined (the file's mtime
    is not `seen`), with that mtime; None once the run has ended or the task was told to stop;
    `SlurmError` when the control job has ended without the run, or after `limit_s`."""
    summary = out / "summary.json"
    start = said = clock()
    while not summary.exists() and not signals.term:
        found = _address(out / "dispatcher.addr")
        if found is not None and found[1] != seen:
            return found
        state = watch.ended()
        if state is not None and not summary.exists():
            raise SlurmError(
                f"the control job {watch.job} has ended ({state}) without ending the run (no summary.json):"
                " no dispatcher will come"
            )
        waited = clock() - start
        if waited > limit_s:
            raise SlurmError(
                f"no dispatcher in {out / 'dispatcher.addr'} for {waited:.0f}s"
                f" (rollout.wait_for_dispatcher_s = {limit_s:g}); control job {watch.job or '?'} still queued"
            )
        if clock() - said >= SAY_EVERY_S:
            said = clock()
            log.info("waiting_for_dispatcher", waited_s=round(waited), limit_s=limit_s, control=watch.job)
        sleep(0.5)
    return None


def rollout_task(out: Path, alloc: Allocation, env: Mapping[str, str]) -> int:
    """The task's life (see the module's diagram); its exit status."""
    signals = Signals()
    signals.install()
    name = worker_name(alloc)
    limit_s = load_config(out / "config.json", []).rollout.wait_for_dispatcher_s
    watch, seen = ControlWatch(out), None
    child: list[subprocess.Popen[bytes]] = []
    try:
        while True:
            try:
                found = next_dispatcher(out, seen, watch, limit_s, signals)
            except SlurmError as err:
                log.error(
                    "control_job_gone" if watch.state else "no_dispatcher", worker=name, reason=str(err)
                )
                return 1
            if found is None:
                return 0 if (out / "summary.json").exists() else 143
            address, seen = found
            log.info("rollout_task_joins", worker=name, dispatcher=address)
            args = ["rollout", "--connect", address, "--name", name, "--config", str(out / "config.json")]
            child[:] = [
                subprocess.Popen(
                    cadence_command(*args, "--out", str(out)),
                    env={**env, "PYTHONUNBUFFERED": "1"},
                    preexec_fn=deaf_to_usr1,
                )
            ]
            while child[0].poll() is None and not signals.term:
                if _moved(out, seen):  # a new dispatcher (its job requeued): the old one is gone
                    stop_children(child)
                time.sleep(0.2)
            if signals.term:
                return 143
            if child[0].returncode == 0 or (out / "summary.json").exists():
                return 0
            log.info("dispatcher_left", worker=name, exit=child[0].returncode)
    finally:
        stop_children(child)
