"""The processes a node's task starts, and the signals it is sent.

Invariant: a signal only sets a flag the task's loop reads (no work in a handler); a child ignores
SIGUSR1 (Slurm's time-limit notice reaches every process of the step; the task alone acts on it); and
`stop_children` leaves no child running: SIGTERM, then SIGKILL after a grace.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType

from cadence.launch.slurm.allocation import SlurmError


@dataclass
class Signals:
    """The signals a task was sent, as flags its loop reads (no work in a signal handler)."""

    usr1: bool = False
    term: bool = False

    def install(self) -> None:
        for sig in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._take)

    def _take(self, signum: int, _: FrameType | None) -> None:
        if signum == signal.SIGUSR1:
            self.usr1 = True
        else:
            self.term = True


def deaf_to_usr1() -> None:
    """In a child, before it runs: Slurm signals every process of the step (the time-limit notice),
    and SIGUSR1 would end one that does not handle it; this task alone acts on it."""
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)


def cadence_command(*args: str) -> list[str]:
    """`python -m cadence ARGS` with this task's Python."""
    return [sys.executable, "-m", "cadence", *args]


def stop_children(procs: list[subprocess.Popen[bytes]], grace_s: float = 10.0) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_for(ready: Callable[[], bool], timeout_s: float, signals: Signals, what: str) -> None:
    """Poll `ready` until it holds; `SlurmError` naming `what` after `timeout_s` or on SIGTERM."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        if signals.term:
            raise SlurmError(f"stopped while waiting for {what}")
        if time.monotonic() > deadline:
            raise SlurmError(f"no {what} after {timeout_s:.0f}s")
        time.sleep(0.2)
