"""The episode runner: a batch of episodes run turn by turn, every live episode's turn generated in one
call, token in and token out.

```
 for each (prompt, seed): env = factory(prompt, seed); ids = encode_prompt(await env.start())
 while any episode is live:
   past its time, its token budget or the engine's context ─► ended (episode_timeout, token_budget, context)
   generate(every live context, turn seeds, room) ─► each: + model ids (mask 1, their log-probs)
   each, at once: reply = await env.step(text)    (timed out: "[tool timed out after 2.0 s]")
     done ─► ended "done"; the model's max_turns ─► "max_turns"; raised ─► "error"
     else + encode_reply(reply.message) (mask 0), if budget and context keep room for a model token
 each: score = await env.score(transcript) (an "error" episode: Bounds.on_error); await env.close()
```

Invariant: every episode given comes back, in order, ended and scored; a context only grows by the ids
the engine sampled and the ids `encode_reply` gave, never by decoding and encoding again, and never
past `max_tokens` after the prompt nor past the engine's `max_context` in all; an
environment's failure ends its own episode only (logged, scored `on_error`); the engine's is raised,
once every environment is closed.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import cast

from cadence.tasks.base import Prompt, Score
from cadence.tasks.environments import guard
from cadence.tasks.environments.base import (
    Ending,
    Environment,
    EnvironmentFactory,
    Opening,
    Reply,
    opening_problem,
    opening_text,
)
from cadence.tasks.environments.bounds import Bounds
from cadence.tasks.environments.episode_record import Episode, EpisodeResult
from cadence.tasks.environments.generation import Generate, Generated, TurnCodec, turn_seed


class EpisodeRunner:
    def __init__(
        self,
        factory: EnvironmentFactory,
        generate: Generate,
        codec: TurnCodec,
        bounds: Bounds,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.factory = factory
        self.generate = generate
        self.codec = codec
        self.bounds = bounds
        self.clock = clock

    async def run(self, episodes: Sequence[tuple[Prompt, int]]) -> list[EpisodeResult]:
        """Run one episode for each (prompt, sample seed) to its end; their results in order."""
        opened = await asyncio.gather(*(self._open(prompt, seed) for prompt, seed in episodes))
        try:
            while live := [episode for episode in opened if episode.live]:
                await self._turn(live)
        except BaseException:  # the engine failed or the run was cancelled: free what episodes hold
            await asyncio.shield(asyncio.gather(*(self._release(episode) for episode in opened)))
            raise
        return list(await asyncio.gather(*(self._close(episode) for episode in opened)))

    async def _open(self, prompt: Prompt, seed: int) -> Episode:
        episode = Episode(prompt, seed, deadline=self.clock() + self.bounds.episode_timeout_s)
        try:
            env = self.factory(prompt, seed)
        except Exception as exc:
            guard.failed(episode, "create", f"{type(exc).__name__}: {exc}", exc_info=True)
            episode.end("error")
            return episode
        if not isinstance(env, Environment):
            guard.failed(episode, "create", f"the factory made a {type(env).__name__}, not an Environment")
            episode.end("error")
            return episode
        episode.env = env
        called = await guard.call(episode, "start", env.start, self.bounds.step_timeout_s, self.clock)
        if not called.failed and not called.timed_out:
            if problem := opening_problem(called.value):
                guard.failed(episode, "start", problem)
            elif (ids := self._encode(episode, opening := cast(Opening, called.value), None)) is not None:
                if ids:
                    episode.begin(opening_text(opening), ids)
                    return episode
                guard.failed(episode, "start", "the first message is no tokens at all")
        episode.end("error")
        return episode

    def _room(self, episode: Episode) -> int:
        """How many tokens the episode's next model turn may sample."""
        budget = self.bounds.max_tokens - len(episode.tokens)
        return min(self.bounds.max_turn_tokens, budget, self.generate.max_context - len(episode.context()))

    def _full(self, episode: Episode, more: int = 0) -> Ending | None:
        """Why the episode, with `more` ids appended, would have no room for one model token; None
        while it has."""
        if len(episode.tokens) + more >= self.bounds.max_tokens:
            return "token_budget"
        if len(episode.context()) + more >= self.generate.max_context:
            return "context"
        return None

    async def _turn(self, live: list[Episode]) -> None:
        """One model turn of every live episode within its bounds, then the environments' replies."""
        ready = []
        for episode in live:
            if self.clock() >= episode.deadline:
                episode.end("episode_timeout")
            elif full := self._full(episode):
                if episode.model_turns == 0:
                    guard.no_room(episode, full, self.bounds.max_tokens, self.generate.max_context)
                episode.end(full)
            else:
                ready.append(episode)
        if not ready:
            return
        generated = await self.generate(
            [episode.context() for episode in ready],
            [turn_seed(episode.seed, episode.model_turns) for episode in ready],
            [self._room(episode) for episode in ready],
        )
        for episode, turn in zip(ready, generated, strict=True):
            episode.add_model_turn(turn, self.codec.decode_response(turn.tokens))
        await asyncio.gather(*(self._answer(e, turn) for e, turn in zip(ready, generated, strict=True)))

    async def _answer(self, episode: Episode, turn: Generated) -> None:
        """The environment's reply to the model's turn, appended unless the episode ends here."""
        if not turn.tokens:  # the engine had no room after all
            episode.end("context")
            return
        if not turn.finished and (full := self._full(episode)):
            episode.end(full)  # cut by the bound, not at the turn's own limit: no reply
            return
        reply = await self._step(episode, episode.turns[-1].text)
        if reply is None:
            return
        episode.record_reply(reply)
        if reply.done:
            episode.end("done")
        elif episode.model_turns >= self.bounds.max_turns:
            episode.end("max_turns")
        elif (ids := self._encode(episode, reply.message, turn.finished)) is None:
            episode.end("error")
        elif full := self._full(episode, len(ids)):
            episode.end(full)  # no room left for the model to answer the message
        else:
            episode.add_message(reply.message, ids)

    async def _step(self, episode: Episode, text: str) -> Reply | None:
        """The environment's reply, a timeout's message in its place; None when the episode ended."""
        env = episode.env
        assert env is not None  # a live episode has its environment
        called = await guard.call(
            episode, "step", lambda: env.step(text), self.bounds.step_timeout_s, self.clock
        )
        if called.timed_out and called.past_deadline:
            episode.end("episode_timeout")
        elif called.timed_out:
            return Reply(guard.timeout_message(self.bounds.step_timeout_s))
        elif isinstance(called.value, Reply):
            reward = called.value.reward
            if reward is None or (isinstance(reward, int | float) and math.isfinite(reward)):
                return called.value
            guard.failed(episode, "step", f"a turn reward of {reward!r}, not a finite number: none kept")
            return replace(called.value, reward=None)
        else:
            if not called.failed:
                guard.failed(episode, "step", f"step gave a {type(called.value).__name__}, not a Reply")
            episode.end("error")
        return None

    def _encode(self, episode: Episode, message: Opening, finished: bool | None) -> list[int] | None:
        """A message's ids (`finished` None: the first message); None, logged, when the tokenizer
        cannot take it (a character outside a character tokenizer's alphabet)."""
        try:
            if finished is None:
                return self.codec.encode_prompt(message)
            assert isinstance(message, str)  # a reply is one message
            return self.codec.encode_reply(message, finished)
        except Exception as exc:
            guard.failed(episode, "encode", f"{type(exc).__name__}: {exc}", exc_info=True)
            return None

    async def _close(self, episode: Episode) -> EpisodeResult:
        """Score the episode (`on_error` when its environment failed) and close its environment."""
        env = episode.env
        score = self._on_error()
        if env is not None and episode.ended != "error":
            transcript = episode.transcript()
            called = await guard.call(
                episode, "score", lambda: env.score(transcript), self.bounds.step_timeout_s, self.clock, False
            )
            if isinstance(called.value, Score) and _finite(called.value):
                score = called.value
            elif not called.failed and not called.timed_out:
                guard.failed(episode, "score", f"score gave {called.value!r}, not a Score of finite numbers")
        await self._release(episode)
        return episode.result(score)

    async def _release(self, episode: Episode) -> None:
        if episode.env is not None:
            await guard.call(
                episode, "close", episode.env.close, self.bounds.step_timeout_s, self.clock, False
            )

    def _on_error(self) -> Score:
        value = self.bounds.on_error
        return Score(reward=value, correct=0.0, parts={"environment": value})


def _finite(score: Score) -> bool:
    values = [score.reward, score.correct, *score.parts.values()]
    return all(isinstance(v, int | float) and math.isfinite(v) for v in values)
