"""Concurrent calls gathered into one engine call: the rows (prompt, seed, token limit) of every call
that arrives while the engine is busy, or within `gather_s` of the first of them, are generated
together, so the episodes' calls share the engine's decode steps as the episode runner's turns do.

```
 call ─► pending ─┬─ every live agent has a call pending ─► one generate(rows of all) ─► each call's rows
                  └─ gather_s since the first one came ───►
```

Invariant: a row's sample depends on its prompt, seed and token limit alone (the engine's), never on
the rows it is batched with; every call gets its rows' results, the engine's exception (which
`failure` also keeps for the batch's owner to raise), or, once the batch is closed, a 503.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cadence.rollout.agent.chat import ApiError
from cadence.tasks.environments.generation import Generate, Generated

Row = tuple[list[int], int, int]  # prompt ids, seed, token limit


@dataclass
class _Call:
    rows: Sequence[Row]
    done: asyncio.Future[list[Generated]]


class Batcher:
    """Gathers the calls of `live()` agents into calls of `generate`."""

    def __init__(
        self,
        generate: Generate,
        live: Callable[[], int],
        gather_s: float = 0.003,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.generate = generate
        self.live = live
        self.gather_s = gather_s
        self.clock = clock
        self.pending: list[_Call] = []
        self.running: list[_Call] = []  # in the engine now
        self.changed = asyncio.Event()
        self.failure: BaseException | None = None
        self.engine_calls = 0

    async def sample(self, rows: Sequence[Row]) -> list[Generated]:
        """One continuation of each row, generated with whatever else is pending."""
        call = _Call(rows, asyncio.get_running_loop().create_future())
        self.pending.append(call)
        self.changed.set()
        return await call.done

    def poke(self) -> None:
        """Something changed that may let the pending calls go now (an agent ended)."""
        self.changed.set()

    async def run(self) -> None:
        """Serve the calls until cancelled."""
        while True:
            await self.changed.wait()
            self.changed.clear()
            if not self.pending:
                continue
            deadline = self.clock() + self.gather_s
            while len(self.pending) < self.live() and (left := deadline - self.clock()) > 0:
                try:
                    await asyncio.wait_for(self.changed.wait(), left)
                except TimeoutError:
                    break
                self.changed.clear()
            calls, self.pending = self.pending, []
            await self._generate(calls)

    def close(self) -> None:
        """The batch is over: every call not answered yet gets `ApiError` 503 (its agent has ended)."""
        for call in self.pending + self.running:
            if not call.done.done():
                call.done.set_exception(ApiError(503, "the episode's batch has ended", kind="server_error"))
        self.pending, self.running = [], []

    async def _generate(self, calls: list[_Call]) -> None:
        rows = [row for call in calls for row in call.rows]
        self.running = calls
        try:
            self.engine_calls += 1
            made = await self.generate([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows])
        except Exception as exc:
            self.failure = self.failure or exc
            for call in calls:
                if not call.done.done():
                    call.done.set_exception(exc)
            return
        start = 0
        for call in calls:
            if not call.done.done():
                call.done.set_result(made[start : start + len(call.rows)])
            start += len(call.rows)
