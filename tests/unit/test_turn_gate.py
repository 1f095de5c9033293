"""The turns' gate: the batch's first turns in one call, a turn asked while a call streams joins it,
one that does not fit waits for the next call, and a failure reaches every turn of its call."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import pytest

from cadence.tasks.environments.generation import Generated, Offers, Row
from cadence.tasks.environments.turn_gate import TurnGate, all_or_none, common_beginning


def _turn(row: Row) -> Generated:
    """A fake turn that names what it was asked: its seed and room as tokens."""
    return Generated([row[1], row[2]], [0.0, 0.0], True)


class Batches:
    """A `Generate` of one call a batch, recording the seeds of each call."""

    max_context = 100

    def __init__(self) -> None:
        self.calls: list[list[int]] = []

    async def __call__(
        self, prompts: Sequence[Sequence[int]], seeds: Sequence[int], max_new_tokens: Sequence[int]
    ) -> list[Generated]:
        self.calls.append(list(seeds))
        await asyncio.sleep(0)
        return [_turn((p, s, n)) for p, s, n in zip(prompts, seeds, max_new_tokens, strict=True)]


class Streams(Batches):
    """A `Streaming` fake: tells its turns one by one, taking what is offered and fits between two."""

    def __init__(self, fits: Callable[[Sequence[int], int], bool] = lambda context, limit: True) -> None:
        super().__init__()
        self.fits = fits
        self.failure: Exception | None = None
        self.streamed: list[tuple[int, Sequence[int], int]] = []

    async def stream(
        self,
        rows: Sequence[Row],
        told: Callable[[int, Generated], None],
        offers: Offers,
        steps: int,
        shared: Sequence[int] = (),
        positions: int = 0,
    ) -> None:
        self.calls.append([row[1] for row in rows])
        self.streamed.append((steps, shared, positions))
        queue, i = list(rows), 0
        while i < len(queue):
            if self.failure is not None:
                raise self.failure
            told(i, _turn(queue[i]))
            i += 1
            for _ in range(20):  # a few turns of the event loop: the told episode may ask again
                await asyncio.sleep(0)
                if more := offers.take(self.fits):
                    queue += more
                    self.calls[-1] += [row[1] for row in more]
                    break


async def _episodes(gate: TurnGate, turns: dict[int, int], live: list[int]) -> dict[int, list[Generated]]:
    """Episodes of seeds `turns` (each its number of turns), context [seed] growing by a token a turn."""
    got: dict[int, list[Generated]] = {seed: [] for seed in turns}

    async def play(seed: int) -> None:
        try:
            for t in range(turns[seed]):
                got[seed].append(await gate.turn([seed] * (t + 1), seed * 10 + t, 3, reach=9))
        finally:
            live[0] -= 1
            gate.poke()

    await all_or_none([play(seed) for seed in turns], gate.run())
    return got


def test_the_first_turns_go_in_one_call_and_later_ones_as_the_engine_frees() -> None:
    fake, live = Batches(), [3]
    gate = TurnGate(fake, lambda: live[0], steps=3)
    got = asyncio.run(_episodes(gate, {1: 2, 2: 2, 3: 1}, live))
    assert fake.calls[0] == [10, 20, 30] and sorted(s for call in fake.calls for s in call) == [
        10,
        11,
        20,
        21,
        30,
    ]
    assert [turn.tokens for turn in got[2]] == [[20, 3], [21, 3]]
    assert gate.joined == 0


def test_a_turn_asked_while_a_call_streams_joins_it() -> None:
    fake, live = Streams(), [2]
    gate = TurnGate(fake, lambda: live[0], steps=3, shared=[7])
    got = asyncio.run(_episodes(gate, {1: 3, 2: 3}, live))
    assert len(fake.calls) == 1 and sorted(fake.calls[0]) == [10, 11, 12, 20, 21, 22]
    assert gate.calls == 1 and gate.joined == 4
    assert fake.streamed == [(3, [7], 9)]  # the call's limit, the batch's beginning, the reach asked
    assert [turn.tokens for turn in got[1]] == [[10, 3], [11, 3], [12, 3]]


def test_a_turn_that_does_not_fit_the_running_call_waits_for_the_next() -> None:
    fake, live = Streams(fits=lambda context, limit: len(context) < 3), [1]
    gate = TurnGate(fake, lambda: live[0], steps=3)
    got = asyncio.run(_episodes(gate, {1: 4}, live))
    assert fake.calls == [[10, 11], [12], [13]]  # past 2 ids a context does not fit: a call each
    assert gate.joined == 1 and [t.tokens[0] for t in got[1]] == [10, 11, 12, 13]


def test_the_engines_failure_reaches_every_episode_of_the_call() -> None:
    fake, live = Streams(), [2]
    fake.failure = RuntimeError("the engine broke")
    gate = TurnGate(fake, lambda: live[0], steps=3)
    with pytest.raises(RuntimeError, match="the engine broke"):
        asyncio.run(_episodes(gate, {1: 2, 2: 2}, live))


def test_the_common_beginning_stops_short_of_the_shortest_context() -> None:
    assert common_beginning([[1, 2, 3, 4], [1, 2, 3, 9], [1, 2, 3]]) == [1, 2]
    assert common_beginning([[1, 2, 3]]) == [] and common_beginning([]) == []
    assert common_beginning([[5, 6], [4, 6]]) == []


def test_a_batch_cancelled_while_its_episodes_play_ends_cancelled_with_nothing_left_running() -> None:
    started: list[str] = []

    async def forever(name: str) -> None:
        started.append(name)
        await asyncio.Event().wait()

    async def main() -> None:
        batch = asyncio.ensure_future(all_or_none([forever("a"), forever("b")], forever("gate")))
        while len(started) < 3:
            await asyncio.sleep(0)
        batch.cancel()
        with pytest.raises(asyncio.CancelledError):
            await batch
        assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []

    asyncio.run(main())
