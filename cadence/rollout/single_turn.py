"""Single-turn groups: one completion a sample, every prompt of a batch decoded together in one engine
call, each completion scored by the run's reward functions, and each group handed on as soon as its
own samples have ended.

```
 complete(groups, ready=, stopped=)
   engine.generate_many (its own thread) ─► group i's samples all ended ─► scored ─► ready(i, samples)
                                           (the others still decoding)
   stopped() true ─► the engine drops every row left between two decode steps; nothing more is ready
```

Invariant: a sample depends only on its prompt, its seed and the weights the engine holds, never on
when its group leaves or on which groups are stopped; the engine computes inside `hold()` (the
worker's engine lock and thread budget) on a thread of its own, so the event loop is free meanwhile
and scores a group while the others decode.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Sequence
from contextlib import nullcontext
from typing import Any, Protocol

from cadence.model.engine import Completion, GroupEnded, StoppedGroups
from cadence.model.rollout_engine import JoiningEngine, RolloutEngine
from cadence.model.tokenizer import TextTokenizer
from cadence.rollout.joining import Joining
from cadence.rollout.play import Hold
from cadence.rollout.results import GroupSamples
from cadence.tasks.base import Prompt, Score


class Scorer(Protocol):
    """The run's reward functions (`cadence.rewards.scorer.Scorer`)."""

    async def score(
        self, prompt: str, response: str, answer: str, finished: bool, prompt_id: int = -1
    ) -> Score: ...


Ready = Callable[[int, GroupSamples, int], Awaitable[None]]
"""Takes group i of a batch, scored, as soon as it is (a worker sends it to the trainer), and how many
of the batch's groups have ended right behind it (to be handed on next)."""


async def complete(
    engine: RolloutEngine,
    tokenizer: TextTokenizer,
    scorer: Scorer,
    groups: Sequence[tuple[Prompt, list[int]]],
    temperature: float | None = None,
    hold: Hold = nullcontext,
    ready: Ready | None = None,
    stopped: Callable[[], bool] | None = None,
    joining: Joining[Any] | None = None,
) -> list[GroupSamples | None]:
    """One completion a seed of each (prompt, sample seeds), all decoded in one `generate_many` at
    `temperature` (None: the engine's own), scored by `scorer`; every group handed to `ready` as soon
    as it is scored, while the engine decodes the others. `stopped()`: the batch is no longer wanted:
    the engine drops what it still decodes. `joining` (a `JoiningEngine`): the batches offered join
    the call, its group `len(groups) + j` is `joining.taken[j]`. Each group's samples, None if stopped."""
    prompts = [tokenizer.encode_prompt(prompt.text) for prompt, _ in groups]
    pairs = [(ids, list(seeds)) for ids, (_, seeds) in zip(prompts, groups, strict=True)]
    loop = asyncio.get_running_loop()
    ended: asyncio.Queue[tuple[int, list[Completion]] | None] = asyncio.Queue()

    def report(index: int, completions: list[Completion]) -> None:
        loop.call_soon_threadsafe(ended.put_nowait, (index, completions))

    def stop_all() -> Collection[int]:  # a joined group's index too
        return range(len(groups) + len(joining.taken if joining else ())) if stopped and stopped() else ()

    over = [False]  # the engine has returned: the queue's last item is None

    def finish() -> None:
        over[0] = True
        ended.put_nowait(None)

    def generate() -> list[list[Completion]]:
        try:
            with hold():
                return _generate_many(engine, pairs, temperature, report, stop_all, joining)
        finally:
            loop.call_soon_threadsafe(finish)

    decoding = asyncio.ensure_future(asyncio.to_thread(generate))
    out: dict[int, GroupSamples] = {}
    try:
        while (item := await ended.get()) is not None:
            index, completions = item
            prompt, ids = _group(groups, prompts, joining, index)
            samples = await _scored(tokenizer, scorer, prompt, ids, completions)
            out[index] = samples
            if ready is not None and not (stopped is not None and stopped()):
                await ready(index, samples, ended.qsize() - over[0])
        made = await decoding  # its failure, if any, is the batch's
    finally:
        if not decoding.done():
            decoding.cancel()
    return [out.get(i) for i in range(len(made))]


def _group(
    groups: Sequence[tuple[Prompt, list[int]]],
    prompts: list[list[int]],
    joining: Joining[Any] | None,
    index: int,
) -> tuple[Prompt, list[int]]:
    """Group `index` of a call: its prompt and the prompt's ids (a joined one's taken before it was told)."""
    if index < len(groups):
        return groups[index][0], prompts[index]
    assert joining is not None
    joined = joining.taken[index - len(groups)]
    return joined.prompt, joined.ids


def _generate_many(
    engine: RolloutEngine,
    pairs: list[tuple[list[int], list[int]]],
    temperature: float | None,
    report: GroupEnded,
    stop_all: StoppedGroups,
    joining: Joining[Any] | None,
) -> list[list[Completion]]:
    """The engine's call (with `joining`'s batches where it takes them; at its own temperature for None)."""
    if joining is not None and isinstance(engine, JoiningEngine):
        return engine.generate_many(pairs, temperature, ended=report, stopped=stop_all, joining=joining.take)
    if temperature is None:
        return engine.generate_many(pairs, ended=report, stopped=stop_all)
    return engine.generate_many(pairs, temperature, ended=report, stopped=stop_all)


async def _scored(
    tokenizer: TextTokenizer, scorer: Scorer, prompt: Prompt, ids: list[int], group: list[Completion]
) -> GroupSamples:
    texts = [tokenizer.decode_response(c.tokens) for c in group]
    scores = [
        await scorer.score(prompt.text, text, prompt.answer, c.finished, prompt.prompt_id)
        for text, c in zip(texts, group, strict=True)
    ]
    truncated = [not c.finished for c in group]
    tokens, logprobs = [c.tokens for c in group], [c.logprobs for c in group]
    return GroupSamples(ids, tokens, logprobs, texts, scores, truncated=truncated)
