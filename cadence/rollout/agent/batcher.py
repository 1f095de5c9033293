"""Concurrent calls gathered into one engine call: the rows (prompt, seed, token limit) of every call
that arrives while no engine call runs, or within `gather_s` of the first of them, are generated
together, and on the built-in engine a call that arrives while one decodes joins it
(`tasks/environments/turn_gate.py`, as the episode runner's turns do), each row answered as it ends.

```
 call ─► its rows ─┬─ an engine call decodes (streaming) ─► offered, taken between two of its steps
                   └─ none ─► pending: every live agent has a call pending, or gather_s since the
                              first one came ─► one call of all the rows pending
```

Invariant: a row's sample depends on its prompt, seed and token limit alone (the engine's), never on
the rows it is batched with, but for the last bits of its log-probs (and, rarely, a token) where the
rows gathered share a beginning beyond the chat template's that the built-in engine computes once for
them (the agents' system prompt and worked examples; which rows are gathered is timing); every call
gets its rows' results, the engine's exception (which `failure` also keeps for the batch's owner to
raise), or, once the batch is closed, a 503.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Sequence

from cadence.rollout.agent.chat import ApiError
from cadence.tasks.environments.generation import Generate, Generated, Row
from cadence.tasks.environments.turn_gate import TurnGate


class Batcher:
    """Gathers the calls of `live()` agents into calls of `generate`, each row at most `steps` new
    tokens."""

    def __init__(
        self,
        generate: Generate,
        live: Callable[[], int],
        gather_s: float = 0.003,
        clock: Callable[[], float] = time.monotonic,
        steps: int = 1,
    ) -> None:
        self.gate = TurnGate(generate, live, steps, None, gather_s, clock)
        self._callers = itertools.count()

    @property
    def failure(self) -> BaseException | None:
        return self.gate.failure

    @property
    def engine_calls(self) -> int:
        return self.gate.calls

    async def sample(self, rows: Sequence[Row], reach: int = 0) -> list[Generated]:
        """One continuation of each row, generated with whatever else is pending or decoding; `reach`:
        the positions its conversation may come to (so that its later calls fit a running call)."""
        asked = self.gate.ask(rows, reach, asker=next(self._callers))
        made = await asyncio.gather(*asked, return_exceptions=True)
        for turn in made:
            if isinstance(turn, BaseException):
                raise turn
        return [turn for turn in made if isinstance(turn, Generated)]

    def poke(self) -> None:
        """Something changed that may let the pending calls go now (an agent ended)."""
        self.gate.poke()

    async def run(self) -> None:
        """Serve the calls until cancelled."""
        await self.gate.run()

    def close(self) -> None:
        """The batch is over: every call not answered yet gets `ApiError` 503 (its agent has ended)."""
        self.gate.close(ApiError(503, "the episode's batch has ended", kind="server_error"))
