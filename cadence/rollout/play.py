"""Episodes played on a worker's engine: the episode runner's `Generate` (`cadence.tasks.environments`)
made of a `TurnEngine`, what a worker needs to run an assignment's samples as episodes (`Episodes`),
and a group's episodes as one prompt and a completion each (`episode_group`). Here because it joins
two sibling layers, the model and the tasks.

```
 runner: generate(contexts, turn seeds, room) ─► a thread: hold() (the worker's engine lock, thread
   budget, version check) ─► one engine.generate_many([(context, [seed]), ...], temperature, the
   longest room, limits = each one's room clipped to the model's positions, shared = the beginning
   the contexts share, computed once) (an engine without per-group limits: one call per distinct
   room) ─► Generated(ids, log-probs, eos?)
 a group's EpisodeResults ─► one prompt (what every episode's first message shares) and per sample
   the ids after it, a mask (0 where the environment wrote), log-probs (0.0 there), score, figures
```

Invariant: each turn is sampled with the weights the engine holds now, so a caller loads no other
version while a batch of episodes runs (the worker's `hold` refuses a turn when its version changed),
from its turn seed alone, so a sample does not depend on the other episodes of the batch; the event
loop is free while the engine computes. A group's completions, masks and log-probs line up token for
token, and `prompt + completion` is each episode's context exactly as the engine read and wrote it.
Given `waits`, every environment call (`start`, `step`, `score`, `close`) is timed in it and is
otherwise untouched: the runner sees the environment's values, exceptions and cancellations.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Protocol

from cadence.model.engine import Completion
from cadence.model.rollout_engine import LimitedEngine, TurnEngine
from cadence.monitor.span import Overlapping
from cadence.rollout.results import GroupSamples
from cadence.tasks.base import Prompt
from cadence.tasks.environments.base import EnvironmentFactory
from cadence.tasks.environments.bounds import Bounds
from cadence.tasks.environments.episode_record import EpisodeResult
from cadence.tasks.environments.generation import Generate, Generated, TurnCodec
from cadence.tasks.environments.runner import EpisodeRunner
from cadence.tasks.environments.turn_gate import common_beginning
from cadence.wire.messages import EpisodeFigures

Hold = Callable[[], AbstractContextManager[object]]


class PlaysEpisodes(Protocol):
    """What a worker plays a batch's samples as episodes with: an environment's (`Episodes`) or an
    agent's (`cadence.rollout.agent.episodes.AgentEpisodes`)."""

    async def run(
        self,
        generate: Generate,
        groups: Sequence[tuple[Prompt, list[int], list[int]]],
        eos_id: int,
        waits: Overlapping | None = None,
        version: int = 0,
    ) -> list[GroupSamples]: ...


class EngineGenerate:
    """The runner's `Generate` on `engine`, at `temperature` (None: the engine's own; each call says
    how many tokens), every call's computation inside `hold()`."""

    def __init__(
        self, engine: TurnEngine, temperature: float | None = None, hold: Hold = nullcontext
    ) -> None:
        self.engine = engine
        self.temperature = temperature
        self.hold = hold

    @property
    def max_context(self) -> int:
        return self.engine.max_context

    async def __call__(
        self, prompts: Sequence[Sequence[int]], seeds: Sequence[int], max_new_tokens: Sequence[int]
    ) -> list[Generated]:
        return await asyncio.to_thread(self.generate, prompts, seeds, max_new_tokens)

    def generate(
        self, prompts: Sequence[Sequence[int]], seeds: Sequence[int], max_new_tokens: Sequence[int]
    ) -> list[Generated]:
        """The same, on this thread: one `generate_many` for every prompt with room, each at its own
        token limit where the engine takes them (`LimitedEngine`), else one for each limit."""
        limits = [min(n, self.max_context - len(p)) for p, n in zip(prompts, max_new_tokens, strict=True)]
        out: list[Generated] = [Generated([], [], False)] * len(prompts)  # no room: nothing sampled
        with self.hold():
            if isinstance(self.engine, LimitedEngine):
                calls = [[i for i, n in enumerate(limits) if n >= 1]]
            else:
                calls = [
                    [i for i, n in enumerate(limits) if n == m] for m in sorted({n for n in limits if n >= 1})
                ]
            for picked in [c for c in calls if c]:
                for i, (completion,) in zip(picked, self._call(prompts, seeds, limits, picked), strict=True):
                    out[i] = Generated(completion.tokens, completion.logprobs, completion.finished)
        return out

    def _call(
        self, prompts: Sequence[Sequence[int]], seeds: Sequence[int], limits: list[int], picked: list[int]
    ) -> list[list[Completion]]:
        asked = [(list(prompts[i]), [seeds[i]]) for i in picked]
        longest = max(limits[i] for i in picked)
        if isinstance(self.engine, LimitedEngine):
            own = [limits[i] for i in picked]
            shared = common_beginning([p for p, _ in asked])  # the batch's opening, at least
            return self.engine.generate_many(
                asked, self.temperature, max_new_tokens=longest, limits=own, shared=shared
            )
        return self.engine.generate_many(asked, self.temperature, max_new_tokens=longest)


@dataclass(frozen=True)
class Episodes:
    """What a worker needs to run an assignment's samples as episodes (`environment.name`)."""

    name: str
    factory: EnvironmentFactory
    codec: TurnCodec
    bounds: Bounds

    def runner(self, generate: Generate, waits: Overlapping | None = None) -> EpisodeRunner:
        """The runner of these episodes on `generate`; with `waits`, every environment call timed in it."""
        return EpisodeRunner(self.factory, generate, self.codec, self.bounds, waits=waits)

    async def run(
        self,
        generate: Generate,
        groups: Sequence[tuple[Prompt, list[int], list[int]]],
        eos_id: int,
        waits: Overlapping | None = None,
        version: int = 0,
    ) -> list[GroupSamples]:
        """`play` these groups' episodes on `generate`; with `waits`, every environment call timed in
        it, its last stretch logged by the time this returns (or raises). (`version`: the weights'
        version, which an environment is not told.)"""
        try:
            return await play(self.runner(generate, waits), groups, eos_id)
        finally:
            if waits is not None:
                waits.close()


def shared_prompt(prompts: Sequence[Sequence[int]]) -> list[int]:
    """The ids every one of `prompts` begins with."""
    first = list(prompts[0])
    n = len(first)
    for prompt in prompts[1:]:
        n = min(n, len(prompt))
        n = next((i for i in range(n) if first[i] != prompt[i]), n)
    return first[:n]


def row_after(
    prompt: Sequence[int],
    head: Sequence[int],
    tokens: Sequence[int],
    mask: Sequence[int],
    logprobs: Sequence[float],
    eos_id: int,
) -> tuple[list[int], list[int], list[float]]:
    """A sequence (its first prompt `head`, then `tokens` with their `mask` and `logprobs`) as a
    completion after the group's `prompt` (which `head` begins with): what `head` has beyond it with
    mask 0, then its tokens; no token at all: one environment token, eos."""
    own = list(head[len(prompt) :])
    ids, marks = own + list(tokens), [0] * len(own) + list(mask)
    lps = [0.0] * len(own) + list(logprobs)
    if not ids:
        return [eos_id], [0], [0.0]
    return ids, marks, lps


def episode_group(
    results: Sequence[EpisodeResult], fallback: list[int], eos_id: int, env_wall_s: float = 0.0
) -> GroupSamples:
    """A group's episodes as one prompt and a completion each. The prompt is what the episodes' first
    messages share (`fallback`, the task's prompt, when no episode got one: every environment failed
    to start); what an episode's own first message has beyond it begins its completion, with mask 0.
    An episode that holds no id after the prompt (it ended before the model's first token) becomes
    one environment token, eos: it counts in its group's rewards and trains nothing."""
    started = [r.prompt_tokens for r in results if r.prompt_tokens]
    prompt = shared_prompt(started) if started else list(fallback)
    if not prompt:
        raise ValueError("the episodes of a group share no first token: their first messages differ")
    completions, masks, logprobs = [], [], []
    for r in results:
        tokens, mask, lps = row_after(prompt, r.prompt_tokens, r.tokens, r.mask, r.logprobs, eos_id)
        completions.append(tokens)
        masks.append(mask)
        logprobs.append(lps)
    figures = EpisodeFigures(
        turns=[r.model_turns for r in results],
        tool_calls=[r.tool_calls for r in results],
        tool_errors=[r.tool_errors for r in results],
        env_timeouts=[r.timeouts for r in results],
        env_s=[r.env_seconds for r in results],
        env_wall_s=env_wall_s,
        env_tokens=[mask.count(0) for mask in masks],
        endings=[r.ended for r in results],
        transcripts=[[turn.text for turn in r.turns] for r in results],
        turn_rewards=[list(r.turn_rewards) for r in results]
        if any(reward is not None for r in results for reward in r.turn_rewards)
        else [],
    )
    texts = [next((t.text for t in reversed(r.turns) if t.author == "model"), "") for r in results]
    return GroupSamples(prompt, completions, logprobs, texts, [r.score for r in results], masks, figures)


async def play(
    runner: EpisodeRunner, groups: Sequence[tuple[Prompt, list[int], list[int]]], eos_id: int
) -> list[GroupSamples]:
    """The episodes of every (prompt, sample seeds, fallback prompt ids) group, run together, one
    episode a seed; each group's as `episode_group` makes them, with its share (by episodes) of the
    batch's wall seconds in environment calls."""
    results = await runner.run([(prompt, seed) for prompt, seeds, _ in groups for seed in seeds])
    out, start = [], 0
    for _, seeds, fallback in groups:
        share = runner.env_wall_s * len(seeds) / max(1, len(results))
        out.append(episode_group(results[start : start + len(seeds)], fallback, eos_id, share))
        start += len(seeds)
    return out
