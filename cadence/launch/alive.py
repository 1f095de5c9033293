"""`DIR/dispatcher.alive`: the dispatcher touches it every few seconds while it runs, so a task or a
command on another node can tell a dispatcher that runs from one whose process ended or whose node
died, which Slurm still calls RUNNING for minutes (until its `SlurmdTimeout`).

Invariant: only the file's mtime says anything; touching it never fails the dispatcher (a full disk
still takes an mtime), and a dispatcher is alive while its last touch is under `STALE_S` old.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from pathlib import Path

ALIVE = "dispatcher.alive"

TOUCH_EVERY_S = 5.0
"""How often a running dispatcher touches `DIR/dispatcher.alive`."""

STALE_S = 30.0
"""A touch older than this: the dispatcher is gone (its process, its node, or its network to the disk)."""


async def keep_alive(out: Path, every_s: float = TOUCH_EVERY_S) -> None:
    """Touch `out/dispatcher.alive` now and every `every_s` seconds, forever."""
    path = out / ALIVE
    while True:
        with contextlib.suppress(OSError):
            path.touch()
        await asyncio.sleep(every_s)


def alive_age(out: Path, now: Callable[[], float] = time.time) -> float | None:
    """Seconds since the dispatcher last touched `out/dispatcher.alive`; None when none ever did."""
    try:
        return max(0.0, now() - (out / ALIVE).stat().st_mtime)
    except OSError:
        return None


def dispatcher_alive(out: Path, now: Callable[[], float] = time.time) -> bool:
    age = alive_age(out, now)
    return age is not None and age < STALE_S
