"""Single-turn groups: one completion a sample, every prompt of a batch decoded together in one engine
call, each completion scored by the run's reward functions.

Invariant: a sample depends only on its prompt, its seed and the weights the engine holds; the
engine computes inside `hold()` (the worker's engine lock and thread budget) on a thread of its own,
so the event loop is free meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from contextlib import nullcontext
from typing import Protocol

from cadence.model.engine import Completion
from cadence.model.rollout_engine import RolloutEngine
from cadence.model.tokenizer import TextTokenizer
from cadence.rollout.play import Hold
from cadence.rollout.results import GroupSamples
from cadence.tasks.base import Prompt, Score


class Scorer(Protocol):
    """The run's reward functions (`cadence.rewards.scorer.Scorer`)."""

    async def score(
        self, prompt: str, response: str, answer: str, finished: bool, prompt_id: int = -1
    ) -> Score: ...


async def complete(
    engine: RolloutEngine,
    tokenizer: TextTokenizer,
    scorer: Scorer,
    groups: Sequence[tuple[Prompt, list[int]]],
    temperature: float | None = None,
    hold: Hold = nullcontext,
) -> list[GroupSamples]:
    """One completion a seed of each (prompt, sample seeds), all decoded in one `generate_many` at
    `temperature` (None: the engine's own), scored by `scorer`."""
    prompts = [tokenizer.encode_prompt(prompt.text) for prompt, _ in groups]
    pairs = [(ids, list(seeds)) for ids, (_, seeds) in zip(prompts, groups, strict=True)]

    def generate() -> list[list[Completion]]:
        with hold():
            if temperature is None:
                return engine.generate_many(pairs)
            return engine.generate_many(pairs, temperature=temperature)

    made = await asyncio.to_thread(generate)
    out = []
    for (prompt, _), ids, group in zip(groups, prompts, made, strict=True):
        texts = [tokenizer.decode_response(c.tokens) for c in group]
        scores = [
            await scorer.score(prompt.text, text, prompt.answer, c.finished, prompt.prompt_id)
            for text, c in zip(texts, group, strict=True)
        ]
        out.append(GroupSamples(ids, [c.tokens for c in group], [c.logprobs for c in group], texts, scores))
    return out
