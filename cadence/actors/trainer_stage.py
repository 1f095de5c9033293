"""When the trainer stages the version a period's step makes: once the workers on its host have
loaded the period's own version.

```
 version k published ─► the workers load it: one on this host maps its slot and checks the digest
    (a pass over the version's bytes), then lets version k-1's slot go
 the trainer meanwhile: waits while a worker on this host still holds k-1 (at most SETTLE_S, and not
    once a group has arrived) ─► stages k+1 (training/staging.py: the parameters copied into a new
    buffer, another pass over the same number of bytes)
```

Staging at once, both passes shared the host's memory bandwidth, and the workers' load of every
version, on the critical path of every period, took the longer for it (SmolLM2 in float32 on two
cores: 0.070 against 0.038-0.043 s). The stage is off that path as long as it ends before the
period's first group is trained: the wait ends at the first arrival, and after SETTLE_S whatever
holds k-1 (a worker with nothing to do this period keeps it). A version under WAIT_BYTES is staged
at once: its copy is too short to be worth a wait.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from cadence.training.learner import Learner
from cadence.wire.buffer import Buffer

log = structlog.get_logger()

SETTLE_S = 0.5
"""The longest the stage waits for the workers on this host to load (a load takes 0.02-0.1 s)."""

WAIT_BYTES = 64 << 20
"""Versions smaller than this are staged at once: their copy and a worker's check take a few
milliseconds each, less than the wait would."""

POLL_S = 0.005
"""How often it asks, meanwhile, whether a worker still holds the version before."""


class VersionStaging:
    """Stages each period's version for `learner` (where it can) through `compute` (the trainer's
    computing thread) into `alloc`'s buffers; `held(v)`: whether a worker on this host still holds
    version v (None: no worker shares the trainer's memory, nothing to wait for)."""

    def __init__(
        self,
        learner: Learner,
        compute: Callable[..., Awaitable[Any]],
        alloc: Callable[[int], Buffer],
        dtype: str | None,
        clock: Callable[[], float],
        held: Callable[[int], bool] | None = None,
    ) -> None:
        self.learner, self.compute, self.alloc, self.dtype = learner, compute, alloc, dtype
        self.clock, self.held = clock, held
        self.unstaged = False  # the learner said once why it cannot stage (then it is not asked again)

    async def __call__(self, period: int, arrived: Callable[[], bool], nbytes: int) -> None:
        """Stage version `period + 1` once the workers on this host have loaded version `period` (of
        `nbytes`; at once under WAIT_BYTES), or `arrived()` (a group is in), or SETTLE_S passed; one
        line says why not where it cannot."""
        stage = getattr(self.learner, "stage", None)
        if stage is None or self.unstaged:
            return
        waited = await self._settle(period, arrived) if nbytes >= WAIT_BYTES else 0.0
        begin = self.clock()
        problem = await self.compute(stage, self.alloc, self.dtype)
        if problem is not None:
            self.unstaged = True
            log.info("versions_not_staged", reason=problem)
        else:
            log.debug(
                "version_staged",
                version=period + 1,
                waited_s=round(waited, 4),
                stage_s=round(self.clock() - begin, 4),
            )

    async def _settle(self, period: int, arrived: Callable[[], bool]) -> float:
        """Until no worker on this host holds version `period - 1`: the seconds waited."""
        held = self.held
        begin = self.clock()
        if held is None or period < 1:
            return 0.0
        while held(period - 1) and not arrived() and self.clock() - begin < SETTLE_S:
            await asyncio.sleep(POLL_S)
        return self.clock() - begin
