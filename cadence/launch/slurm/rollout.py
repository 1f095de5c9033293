"""A rollout job's task (`cadence slurm task --role rollout DIR`): one worker that joins the run, and
joins it again whenever the control job comes back (requeued), until the run has ended.

```
 DIR/dispatcher.addr, one not joined yet ─► cadence rollout --name rollout-<job id> ─► while it runs:
      DIR/summary.json (the run ended) ─► the worker stopped if still there, the task ends, 0
      a new address (a new dispatcher: its job requeued) ─► the worker stopped, started against it
      the dispatcher gone (DIR/dispatcher.alive stale) and its control job ended ─► control_job_gone, 1
 the worker ends by itself, the run not ended (lost in a network blip, told it was declared lost):
      the same dispatcher still runs (dispatcher.alive fresh) ─► worker_left_dispatcher, a pause
          (5 s, doubled after each worker that ended within 120 s, at most 300 s), the worker again
      else ─► wait for the next address
 no dispatcher to join ─► every 5 s: the control job's state (squeue, then scontrol for a finished one)
      ended (COMPLETED/FAILED/CANCELLED/..., or forgotten) without summary.json ─► control_job_gone, 1
      pending, requeued, running ─► wait on; waiting_for_dispatcher every 30 s
      past rollout.wait_for_dispatcher_s ─► no_dispatcher, 1
```

Invariant: the task never waits without end or in silence: while no dispatcher is there it says so
every 30 s, gives up when the control job has ended (naming its state) or after
`rollout.wait_for_dispatcher_s`, and leaves no process of its own behind. It ends 0 only when the
run has ended (`summary.json`): a run that failed fails its rollout jobs too.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import structlog

from cadence.config import load_config
from cadence.launch.alive import dispatcher_alive
from cadence.launch.slurm.allocation import Allocation, SlurmError
from cadence.launch.slurm.children import Signals, cadence_command, deaf_to_usr1, stop_children
from cadence.launch.slurm.jobs import Runner, job_ended, read_jobs, run_command

log = structlog.get_logger()

SAY_EVERY_S = 30.0
"""How often a task that waits for its dispatcher says so."""

LOOK_EVERY_S = 1.0
"""How often a task whose worker runs looks at the run folder (a few file states on a shared disk)."""


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
    alive: Callable[[], bool] = lambda: False,
) -> tuple[str, int] | None:
    """The address in `DIR/dispatcher.addr` once it is one this task has not joined (the file's mtime
    is not `seen`), or the one it joined while that dispatcher is `alive` (a worker lost in a network
    blip rejoins it), with that mtime; None once the run has ended or the task was told to stop;
    `SlurmError` when the control job has ended without the run, or after `limit_s`."""
    summary = out / "summary.json"
    start = said = clock()
    while not summary.exists() and not signals.term:
        found = _address(out / "dispatcher.addr")
        if found is not None and (found[1] != seen or alive()):
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


class Rejoins:
    """The pause before a worker starts again against the dispatcher it left: `first_s` after a worker
    that ran `steady_s` or longer, doubled after each that ended sooner, at most `most_s` (a worker that
    fails as it starts does not start again at once, forever)."""

    def __init__(self, first_s: float = 5.0, most_s: float = 300.0, steady_s: float = 120.0) -> None:
        self.first_s, self.most_s, self.steady_s = first_s, most_s, steady_s
        self.pause = 0.0

    def after(self, ran_s: float) -> float:
        """The pause after a worker that ran `ran_s` seconds."""
        steady = ran_s >= self.steady_s or not self.pause
        self.pause = self.first_s if steady else min(self.most_s, self.pause * 2)
        return self.pause


def worker_command(out: Path, name: str) -> Callable[[str], list[str]]:
    """The worker a rollout task starts against a dispatcher's address."""
    config = str(out / "config.json")
    return lambda address: cadence_command(
        "rollout", "--connect", address, "--name", name, "--config", config, "--out", str(out)
    )


class RolloutTask:
    """One rollout job's task (the module's diagram): `command(address)` is its worker; `alive` says
    whether the run's dispatcher runs (`DIR/dispatcher.alive`)."""

    def __init__(
        self,
        out: Path,
        name: str,
        limit_s: float,
        command: Callable[[str], list[str]],
        env: Mapping[str, str],
        signals: Signals,
        watch: ControlWatch | None = None,
        alive: Callable[[Path], bool] = dispatcher_alive,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.out, self.name, self.limit_s, self.command = out, name, limit_s, command
        self.env = {**env, "PYTHONUNBUFFERED": "1"}
        self.signals = signals
        self.watch = watch or ControlWatch(out)
        self.alive, self.clock, self.sleep = alive, clock, sleep
        self.rejoins = Rejoins()
        self.child: list[subprocess.Popen[bytes]] = []

    def run(self) -> int:
        """The task's life; its exit status."""
        seen = None
        summary = self.out / "summary.json"
        try:
            while True:
                try:
                    found = next_dispatcher(
                        self.out, seen, self.watch, self.limit_s, self.signals, self.clock, self.sleep,
                        lambda: self.alive(self.out),
                    )  # fmt: skip
                except SlurmError as err:
                    return self._gone(err)
                if found is None:
                    return 0 if summary.exists() else 143
                address, seen = found
                log.info("rollout_task_joins", worker=self.name, dispatcher=address)
                began = self.clock()
                self.child[:] = [
                    subprocess.Popen(self.command(address), env=self.env, preexec_fn=deaf_to_usr1)
                ]
                ended = self._attend(seen)
                if ended is not None:
                    return ended
                if not _moved(self.out, seen):  # the same dispatcher: again, after a pause
                    pause = self.rejoins.after(self.clock() - began)
                    log.info("worker_left_dispatcher", worker=self.name, exit=self.child[0].returncode,
                             dispatcher=address, again_in_s=pause)  # fmt: skip
                    ended = self._pause(pause, seen)
                    if ended is not None:
                        return ended
        finally:
            stop_children(self.child)

    def _attend(self, seen: int) -> int | None:
        """While the worker runs: the task's exit status once the run has ended (the worker stopped if
        still there), the task was stopped, or the control job has ended without the run; None once the
        worker has ended by itself or was stopped for a new dispatcher."""
        child = self.child[0]
        while child.poll() is None:
            ended = self._ended()
            if ended is not None:
                return ended
            if _moved(self.out, seen):  # a new dispatcher (its job requeued): the old one is gone
                stop_children(self.child)
            self.sleep(LOOK_EVERY_S)
        return self._ended(child.returncode)

    def _pause(self, pause_s: float, seen: int) -> int | None:
        until = self.clock() + pause_s
        while self.clock() < until and not _moved(self.out, seen):
            ended = self._ended()
            if ended is not None:
                return ended
            self.sleep(LOOK_EVERY_S)
        return None

    def _ended(self, worker_exit: int | None = None) -> int | None:
        """The task's exit status when it is done: the run ended (0), the task told to stop (143), the
        control job ended without the run (1, once its dispatcher no longer runs); else None."""
        if (self.out / "summary.json").exists():
            return 0
        if self.signals.term:
            return 143
        if worker_exit is None and self.alive(self.out):
            return None
        state = self.watch.ended()
        if state is None:
            return None
        return self._gone(SlurmError(f"the control job {self.watch.job} has ended ({state}) without"
                                     " ending the run (no summary.json): no dispatcher will come"))  # fmt: skip

    def _gone(self, err: SlurmError) -> int:
        event = "control_job_gone" if self.watch.state else "no_dispatcher"
        log.error(event, worker=self.name, reason=str(err))
        return 1


def rollout_task(out: Path, alloc: Allocation, env: Mapping[str, str]) -> int:
    """The task's life (see the module's diagram); its exit status."""
    signals = Signals()
    signals.install()
    name = worker_name(alloc)
    limit_s = load_config(out / "config.json", []).rollout.wait_for_dispatcher_s
    return RolloutTask(out, name, limit_s, worker_command(out, name), env, signals).run()
