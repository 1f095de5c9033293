"""The episodes' turns gathered into engine calls: each episode asks for its next turn as soon as its
environment has replied, and a turn asked while a call decodes joins it (`Streaming`), so no episode
waits for the slowest turn of a batch nor for the other episodes' environments.

```
 episode: turn(context, seed, room) ─┬─ a call is decoding (streaming) ─► offered ─► taken between two
                                     │                                     steps ─► told as it ends
                                     └─ none ─► pending: every live episode has asked, or gather_s
                                               since the first ─► one call of them all (streaming:
                                               stream(rows, told, offers); else generate(rows))
 a call ends ─► turns offered and never taken (no room in its cache) ─► pending, for the next call
```

Invariant: every turn asked is answered once, with its sample, or with the engine's exception; a
turn's sample depends on its context, seed, room, the batch's `shared` beginning and the weights,
never on the turns it is decoded beside nor on when it joined.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from cadence.ops.packing import shared_trunk
from cadence.tasks.environments.generation import Generate, Generated, Row, Streaming


@dataclass
class _Asked:
    row: Row
    reach: int  # the positions its episode may still come to need (its context and budget)
    asker: int  # who asked (an episode, an agent's call): the gate waits for each live one once
    done: asyncio.Future[Generated]


class RowOffers:
    """Turns offered to one running call (`Offers`): taken by its engine's thread in the order they
    came, each once; closed when the call returns, the turns never taken given back."""

    def __init__(self) -> None:
        self.taken: list[_Asked] = []
        self._offered: list[_Asked] = []
        self._closed = False
        self._lock = threading.Lock()

    def offer(self, asked: _Asked) -> bool:
        """Offer a turn; False once the call has returned (then it is not offered)."""
        with self._lock:
            if self._closed:
                return False
            self._offered.append(asked)
            return True

    def take(self, fits: Callable[[Sequence[int], int], bool]) -> list[Row]:
        with self._lock:
            if self._closed:
                return []
            now: list[_Asked] = []
            rest: list[_Asked] = []
            for a in self._offered:
                (now if fits(a.row[0], a.row[2]) else rest).append(a)
            self._offered = rest
            self.taken += now
        return [a.row for a in now]

    def close(self) -> list[_Asked]:
        """The call has returned: nothing more is taken. The turns offered and never taken."""
        with self._lock:
            self._closed = True
            left, self._offered = self._offered, []
        return left


class TurnGate:
    """Serves the turns of `live()` askers (episodes, agents) on `generate`, each at most `steps` new
    tokens; `shared` is the beginning every context has (computed once a call where the engine
    can); None: each call's own rows' common beginning (the agents', whose contexts the gate cannot
    know ahead, so that a row's last bits then depend on what it was gathered with)."""

    def __init__(
        self,
        generate: Generate,
        live: Callable[[], int],
        steps: int,
        shared: Sequence[int] | None = (),
        gather_s: float = 0.003,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.generate = generate
        self.live = live
        self.steps = steps
        self.shared = None if shared is None else list(shared)
        self.gather_s = gather_s
        self.clock = clock
        self.pending: list[_Asked] = []
        self.running: list[_Asked] = []  # the running call's own turns
        self.offers: RowOffers | None = None  # the running call's, while it takes turns
        self.changed = asyncio.Event()
        self.calls = 0  # engine calls made
        self.joined = 0  # turns that joined a running call
        self.failure: BaseException | None = None  # the engine's first, kept for the batch's owner
        self._closed: BaseException | None = None

    async def turn(
        self, context: Sequence[int], seed: int, room: int, reach: int = 0, asker: int = -1
    ) -> Generated:
        """The episode's next turn: at most `room` tokens after `context`, drawn from `seed`; `reach`:
        the most positions the episode's context may come to (so that its later turns fit)."""
        (done,) = self.ask([(context, seed, room)], reach, asker)
        return await done

    def ask(self, rows: Sequence[Row], reach: int = 0, asker: int = -1) -> list[asyncio.Future[Generated]]:
        """Each row's turn, to await (an agent's call of several choices: `asker` names it once)."""
        out = []
        for context, seed, room in rows:
            asked = _Asked(
                (list(context), seed, room), max(reach, len(context) + room), asker, asyncio.Future()
            )
            if self._closed is not None:
                asked.done.set_exception(self._closed)
            elif self.offers is not None and self.offers.offer(asked):
                self.joined += 1
            else:
                self.pending.append(asked)
                self.changed.set()
            out.append(asked.done)
        return out

    def close(self, why: BaseException) -> None:
        """Nothing more is answered: every turn asked and not answered yet, and every one asked after,
        gets `why`."""
        self._closed = why
        left = self.offers.close() if self.offers is not None else []
        taken = self.offers.taken if self.offers is not None else []
        _fail([*self.pending, *self.running, *taken, *left], why)
        self.pending, self.running = [], []

    def poke(self) -> None:
        """An episode ended: the pending turns may not wait for it."""
        self.changed.set()

    async def run(self) -> None:
        """Serve the turns until cancelled."""
        while True:
            await self.changed.wait()
            self.changed.clear()
            if not self.pending:
                continue
            deadline = self.clock() + self.gather_s
            while self._askers() < self.live() and (left := deadline - self.clock()) > 0:
                try:
                    await asyncio.wait_for(self.changed.wait(), left)
                except TimeoutError:
                    break
                self.changed.clear()
            asked, self.pending = self.pending, []
            self.calls += 1
            self.running = asked
            if isinstance(self.generate, Streaming):
                await self._stream(self.generate, asked)
            else:
                await self._generate(asked)
            self.running = []

    def _askers(self) -> int:
        """How many have a turn pending (an asker of -1 counts once a turn)."""
        named = {a.asker for a in self.pending if a.asker >= 0}
        return len(named) + sum(1 for a in self.pending if a.asker < 0)

    async def _generate(self, asked: list[_Asked]) -> None:
        contexts, seeds, rooms = (
            [a.row[0] for a in asked],
            [a.row[1] for a in asked],
            [a.row[2] for a in asked],
        )
        try:
            made = await self.generate(contexts, seeds, rooms)
        except Exception as exc:
            self.failure = self.failure or exc
            _fail(asked, exc)
            return
        for a, turn in zip(asked, made, strict=True):
            _answer(a, turn)

    async def _stream(self, generate: Streaming, asked: list[_Asked]) -> None:
        offers = RowOffers()
        self.offers = offers

        def told(i: int, turn: Generated) -> None:
            _answer(asked[i] if i < len(asked) else offers.taken[i - len(asked)], turn)

        positions = max(a.reach for a in asked)
        rows = [a.row for a in asked]
        shared = common_beginning([r[0] for r in rows]) if self.shared is None else self.shared
        try:
            await generate.stream(rows, told, offers, self.steps, shared, positions)
        except Exception as exc:
            self.failure = self.failure or exc
            _fail(asked + offers.taken, exc)
        finally:
            self.offers = None
            left = offers.close()
            self.joined -= len(left)
            if self._closed is not None:
                _fail(left, self._closed)
            elif left:
                self.pending = left + self.pending
                self.changed.set()
        unanswered = [a for a in asked + offers.taken if not a.done.done()]
        _fail(unanswered, RuntimeError(f"the engine's call returned without {len(unanswered)} turns"))


def _answer(asked: _Asked, turn: Generated) -> None:
    if not asked.done.done():
        asked.done.set_result(turn)


def _fail(asked: Sequence[_Asked], exc: BaseException) -> None:
    for a in asked:
        if not a.done.done():
            a.done.set_exception(exc)


def common_beginning(contexts: Sequence[Sequence[int]]) -> list[int]:
    """The ids every context begins with, short of the shortest one's last (none for fewer than two):
    `shared_trunk`'s."""
    return list(contexts[0][: shared_trunk(contexts)]) if contexts else []


async def all_or_none(work: Sequence[Coroutine[Any, Any, None]], server: Coroutine[Any, Any, None]) -> None:
    """Run `work` to its end with `server` beside it (cancelled then); the first exception of any of
    them cancels the others and is raised."""
    tasks = [asyncio.ensure_future(w) for w in work]
    serving = asyncio.ensure_future(server)
    try:
        pending: set[asyncio.Future[None]] = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending | {serving}, return_when=asyncio.FIRST_COMPLETED)
            pending.discard(serving)
            for task in done:
                if task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
            if serving in done:
                raise RuntimeError("the turns' gate stopped while episodes still asked for turns")
    finally:
        for task in [*tasks, serving]:
            task.cancel()
        # their ends awaited, their exceptions dropped; a cancellation of this task itself still ends it
        await asyncio.gather(*tasks, serving, return_exceptions=True)
