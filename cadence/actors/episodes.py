"""Episodes on the built-in engine: the episode runner's `Generate` (`cadence.tasks.environments`)
made of a `TorchEngine`, and the runner a worker would make of an engine, a tokenizer and an
environment. Here because it joins two sibling layers, the model and the tasks.

```
 runner: generate(contexts, turn seeds, room) ─► a thread: per distinct room (clipped to the model's
   max_position) one engine.generate_many([(context, [seed]), ...]) ─► Generated(ids, log-probs, eos?)
```

Invariant: each turn is sampled with the weights the engine holds now, so a caller loads no other
version while a batch of episodes runs (a worker loads one only between batches), from its turn seed
alone, so a sample does not depend on the other episodes of the batch; the event loop is free while
the engine computes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace

from cadence.model.engine import SamplingParams, TorchEngine
from cadence.model.tokenizer import TextTokenizer
from cadence.model.turns import ChatTurns
from cadence.tasks.environments.base import EnvironmentFactory
from cadence.tasks.environments.bounds import Bounds
from cadence.tasks.environments.generation import Generated
from cadence.tasks.environments.runner import EpisodeRunner


class EngineGenerate:
    """The runner's `Generate` on a `TorchEngine`, sampling with `params` (its `max_new_tokens` unused:
    each call says how many)."""

    def __init__(self, engine: TorchEngine, params: SamplingParams) -> None:
        self.engine = engine
        self.params = params

    @property
    def max_context(self) -> int:
        return self.engine.model.cfg.max_position

    async def __call__(
        self, prompts: Sequence[Sequence[int]], seeds: Sequence[int], max_new_tokens: Sequence[int]
    ) -> list[Generated]:
        return await asyncio.to_thread(self.generate, prompts, seeds, max_new_tokens)

    def generate(
        self, prompts: Sequence[Sequence[int]], seeds: Sequence[int], max_new_tokens: Sequence[int]
    ) -> list[Generated]:
        """The same, on this thread: one `generate_many` for the prompts of each token limit."""
        limits = [min(n, self.max_context - len(p)) for p, n in zip(prompts, max_new_tokens, strict=True)]
        out: list[Generated] = [Generated([], [], False)] * len(prompts)  # no room: nothing sampled
        for limit in sorted({n for n in limits if n >= 1}):
            picked = [i for i, n in enumerate(limits) if n == limit]
            params = replace(self.params, max_new_tokens=limit)
            groups = self.engine.generate_many([(prompts[i], [seeds[i]]) for i in picked], params)
            for i, (completion,) in zip(picked, groups, strict=True):
                out[i] = Generated(completion.tokens, completion.logprobs, completion.finished)
        return out


def episode_runner(
    engine: TorchEngine,
    params: SamplingParams,
    tokenizer: TextTokenizer,
    factory: EnvironmentFactory,
    bounds: Bounds,
    role: str = "user",
) -> EpisodeRunner:
    """The runner of `factory`'s episodes on `engine`, their messages in `tokenizer`'s chat template."""
    return EpisodeRunner(factory, EngineGenerate(engine, params), ChatTurns(tokenizer, role), bounds)
