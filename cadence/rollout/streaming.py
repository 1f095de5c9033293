"""The episodes' turns on the built-in engine as one running call (`Streaming`): the turns of a
batch's call decode together, each told as it ends, and the turns its episodes ask for meanwhile join
it between two decode steps.

```
 stream(rows, told, offers, steps, shared, positions) ─► a thread: hold() ─► one
   engine.generate_many(rows with room, steps, limits = each one's room clipped to the model's
   positions, shared, positions, ended ─► told(i) on the event loop,
   joining(room) ─► offers.take(what fits the call's cache) ─► turns with room join; without, told
   at once with no tokens)
```

Invariant: each turn is told once, with what the engine sampled for it from its own context, seed,
limit and `shared` under the weights held (the worker's `hold` refuses the call when its version
changed), whatever joined beside it; the event loop is free while the engine computes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from contextlib import nullcontext

from cadence.model.engine import Completion
from cadence.model.rollout_engine import LimitedEngine, TurnEngine
from cadence.model.tokenizer import TextTokenizer
from cadence.model.turns import ChatTurns
from cadence.rollout.play import EngineGenerate, Hold
from cadence.tasks.environments.base import EnvironmentFactory
from cadence.tasks.environments.bounds import Bounds
from cadence.tasks.environments.generation import Generated, Offers, Row
from cadence.tasks.environments.runner import EpisodeRunner


class StreamingGenerate(EngineGenerate):
    """`EngineGenerate` on an engine that takes a limit a turn and turns joining its calls."""

    engine: LimitedEngine

    async def stream(
        self,
        rows: Sequence[Row],
        told: Callable[[int, Generated], None],
        offers: Offers,
        steps: int,
        shared: Sequence[int] = (),
        positions: int = 0,
    ) -> None:
        loop = asyncio.get_running_loop()

        def tell(i: int, turn: Generated) -> None:
            loop.call_soon_threadsafe(told, i, turn)

        await asyncio.to_thread(self._stream, rows, tell, offers, steps, shared, positions)

    def _stream(
        self,
        rows: Sequence[Row],
        tell: Callable[[int, Generated], None],
        offers: Offers,
        steps: int,
        shared: Sequence[int],
        positions: int,
    ) -> None:
        """The same, on this thread."""
        turn_of: list[int] = []  # the engine's group index -> the turn's index in the stream
        counted = [len(rows)]  # turns of the stream so far: the call's, then those taken

        def admit(batch: Sequence[Row], start: int) -> list[tuple[list[int], list[int], int]]:
            """The turns with room as the engine's groups; the others told at once, with no tokens."""
            groups = []
            for j, (context, seed, room) in enumerate(batch):
                limit = min(room, steps, self.max_context - len(context))
                if limit < 1:
                    tell(start + j, Generated([], [], False))
                    continue
                turn_of.append(start + j)
                groups.append((list(context), [seed], limit))
            return groups

        def ended(i: int, completions: list[Completion]) -> None:
            (c,) = completions
            tell(turn_of[i], Generated(c.tokens, c.logprobs, c.finished))

        def joining(room: int) -> list[tuple[list[int], list[int], int]]:
            taken = offers.take(lambda context, limit: len(context) + min(limit, steps) <= room + steps)
            start, counted[0] = counted[0], counted[0] + len(taken)
            return admit(taken, start)

        own = admit(rows, 0)
        if not own:
            return  # every turn told: none had room
        with self.hold():
            self.engine.generate_many(
                [(p, s) for p, s, _ in own],
                self.temperature,
                max_new_tokens=steps,
                ended=ended,
                joining=joining,
                limits=[n for _, _, n in own],
                shared=shared,
                positions=positions,
            )


def engine_generate(
    engine: TurnEngine, temperature: float | None = None, hold: Hold = nullcontext
) -> EngineGenerate:
    """The runner's `Generate` on `engine`: streaming where the engine takes a limit a turn and turns
    joining its calls (the built-in one), else a call a batch of turns."""
    if isinstance(engine, LimitedEngine):
        return StreamingGenerate(engine, temperature, hold)
    return EngineGenerate(engine, temperature, hold)


def episode_runner(
    engine: TurnEngine,
    tokenizer: TextTokenizer,
    factory: EnvironmentFactory,
    bounds: Bounds,
    role: str = "user",
    temperature: float | None = None,
) -> EpisodeRunner:
    """The runner of `factory`'s episodes on `engine`, their messages in `tokenizer`'s chat template."""
    return EpisodeRunner(factory, engine_generate(engine, temperature), ChatTurns(tokenizer, role), bounds)
