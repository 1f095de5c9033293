"""The episode runner: a batch of episodes run turn by turn, each at its own pace, token in and token
out; their turns decode together (`turn_gate.py`): the batch's first turns in one call, and each next
turn joins the running call as soon as its environment has replied (where the engine can).

```
 for each (prompt, seed), on an event loop of its own (`episode_loop.py`):
   env = factory(prompt, seed); env.setting = (the template's tool format, step_timeout_s)
   ids = encode_prompt(await env.start(), env.tools())
 each episode, while live:
   past its time, its token budget or the engine's context ─► ended (episode_timeout, token_budget, context)
   gate.turn(its context, turn seed, room) ─► + model ids (mask 1, their log-probs)
   reply = await env.step(text)    (timed out: "[tool timed out after 2.0 s]")
     done ─► ended "done"; the model's max_turns ─► "max_turns"; raised ─► "error"
     else each text cut at max_message_chars (a marker the model reads; logged), then
          + encode_reply(message) or encode_results(tool results) (mask 0), if budget and context
          keep room for a model token (else logged, and said in the transcript)
 each: score = await env.score(transcript) (an "error" episode: Bounds.on_error); await env.close()
```

Invariant: every episode given comes back, in order, ended and scored; its turns, and so its
result, depend on its own prompt, seed and environment and the batch's shared opening, never on when
the other episodes' turns ran; a context only grows by the ids
the engine sampled and the ids `encode_reply` gave, never by decoding and encoding again, and never
past `max_tokens` after the prompt nor past the engine's `max_context` in all; an
environment's failure ends its own episode only (logged, scored `on_error`); the engine's is raised,
once every environment is closed.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace

import structlog

from cadence.tasks.base import Prompt, Score
from cadence.tasks.environments import guard
from cadence.tasks.environments.base import (
    Ending,
    Environment,
    EnvironmentFactory,
    Opening,
    Reply,
    Setting,
    opening_problem,
    opening_text,
)
from cadence.tasks.environments.bounds import Bounds, truncate
from cadence.tasks.environments.episode_loop import EpisodeLoop
from cadence.tasks.environments.episode_record import Episode, EpisodeResult
from cadence.tasks.environments.generation import Generate, Generated, TurnCodec, turn_seed
from cadence.tasks.environments.turn_gate import TurnGate, all_or_none, common_beginning

log = structlog.get_logger()


class EpisodeRunner:
    def __init__(
        self,
        factory: EnvironmentFactory,
        generate: Generate,
        codec: TurnCodec,
        bounds: Bounds,
        clock: Callable[[], float] = time.monotonic,
        waits: guard.Waits | None = None,
    ) -> None:
        self.factory = factory
        self.generate = generate
        self.codec = codec
        self.bounds = bounds
        self.clock = clock
        self.waits = guard.WallTime(clock, waits)  # every call of start, step, score and close timed
        self.engine_calls = 0  # of the last batch: the engine's calls
        self.joined_turns = 0  # of the last batch: turns that joined a running call

    async def run(self, episodes: Sequence[tuple[Prompt, int]]) -> list[EpisodeResult]:
        """Run one episode for each (prompt, sample seed) to its end; their results in order
        (`env_wall_s` then holds the wall seconds in which any of their environment calls ran)."""
        self.waits = guard.WallTime(self.clock, self.waits.also)
        opened = await asyncio.gather(*(self._open(prompt, seed) for prompt, seed in episodes))
        contexts = [episode.context() for episode in opened if episode.live]
        gate = TurnGate(
            self.generate,
            lambda: sum(episode.live for episode in opened),
            self.bounds.max_turn_tokens,
            common_beginning(contexts),
        )
        try:
            await all_or_none([self._play(episode, gate) for episode in opened], gate.run())
        except BaseException:  # the engine failed or the run was cancelled: free what episodes hold
            await asyncio.shield(asyncio.gather(*(self._release(episode) for episode in opened)))
            raise
        self.engine_calls, self.joined_turns = gate.calls, gate.joined
        return list(await asyncio.gather(*(self._close(episode) for episode in opened)))

    async def _open(self, prompt: Prompt, seed: int) -> Episode:
        episode = Episode(prompt, seed, self.clock() + self.bounds.episode_timeout_s, loop=EpisodeLoop())
        bound = self.bounds.step_timeout_s
        made = await guard.call(episode, "create", _maker(self.factory, prompt, seed), bound, self.clock)
        env = made.value
        if not isinstance(env, Environment):
            if not made.failed and not made.timed_out:  # those are logged already
                guard.failed(
                    episode, "create", f"the factory made a {type(env).__name__}, not an Environment"
                )
            episode.end("error")
            return episode
        episode.env = env
        env.setting = Setting(self.codec.tool_format, bound)

        async def start() -> tuple[Opening, list[dict[str, object]]]:
            return await env.start(), [dict(schema) for schema in env.tools()]

        called = await guard.call(episode, "start", start, bound, self.clock, waits=self.waits)
        if called.value is not None:
            opening, tools = called.value
            if problem := opening_problem(opening):
                guard.failed(episode, "start", problem)
            elif (ids := self._encode_opening(episode, opening, tools)) is not None:
                if ids:
                    episode.begin(opening_text(opening), ids)
                    return episode
                guard.failed(episode, "start", "the first message is no tokens at all")
        episode.end("error")
        return episode

    @property
    def env_wall_s(self) -> float:
        return self.waits.seconds

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

    async def _play(self, episode: Episode, gate: TurnGate) -> None:
        """The episode's model turns within its bounds, each followed by its environment's reply."""
        try:
            while episode.live:
                if self.clock() >= episode.deadline:
                    episode.end("episode_timeout")
                elif full := self._full(episode):
                    if episode.model_turns == 0:
                        guard.no_room(episode, full, self.bounds.max_tokens, self.generate.max_context)
                    episode.end(full)
                else:
                    context = episode.context()
                    reach = len(context) + self.bounds.max_tokens - len(episode.tokens)
                    seed = turn_seed(episode.seed, episode.model_turns)
                    turn = await gate.turn(context, seed, self._room(episode), reach)
                    episode.add_model_turn(turn, self.codec.decode_response(turn.tokens))
                    await self._answer(episode, turn)
        finally:
            gate.poke()

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
        else:
            reply = self._cut(episode, reply)
            if (ids := self._encode(episode, reply, turn.finished)) is None:
                episode.end("error")
            elif full := self._full(episode, len(ids)):
                guard.over_budget(episode, len(ids), self.bounds.max_tokens - len(episode.tokens))
                episode.note(f"[not shown to the model: a message of {len(ids)} tokens, past the {full}]")
                episode.end(full)  # no room left for the model to answer the message
            else:
                episode.add_message(reply.text, ids)

    def _cut(self, episode: Episode, reply: Reply) -> Reply:
        """The reply with each text longer than `max_message_chars` cut, a marker saying so (logged)."""
        limit = self.bounds.max_message_chars
        texts = reply.tool_results or (reply.message,)
        if all(len(text) <= limit for text in texts):
            return reply
        guard.truncated(episode, [len(text) for text in texts], limit)
        cut = tuple(truncate(text, limit) for text in texts)
        return replace(reply, tool_results=cut) if reply.tool_results else replace(reply, message=cut[0])

    async def _step(self, episode: Episode, text: str) -> Reply | None:
        """The environment's reply, a timeout's message in its place; None when the episode ended."""
        env = episode.env
        assert env is not None  # a live episode has its environment
        called = await guard.call(
            episode, "step", lambda: env.step(text), self.bounds.step_timeout_s, self.clock, waits=self.waits
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

    def _encode_opening(
        self, episode: Episode, opening: Opening, tools: list[dict[str, object]]
    ) -> list[int] | None:
        """The opening's ids with the tools declared; None, logged, when the tokenizer cannot take it."""
        return self._safely(episode, lambda: self.codec.encode_prompt(opening, tools))

    def _encode(self, episode: Episode, reply: Reply, finished: bool) -> list[int] | None:
        """A reply's ids: its tool results as the template's tool messages, else its message."""
        if reply.tool_results:
            return self._safely(episode, lambda: self.codec.encode_results(reply.tool_results, finished))
        return self._safely(episode, lambda: self.codec.encode_reply(reply.message, finished))

    def _safely(self, episode: Episode, encode: Callable[[], list[int]]) -> list[int] | None:
        """`encode()`; None, logged, when the tokenizer cannot take the text (a character outside a
        character tokenizer's alphabet, a special token's text where a template rewrites contents)."""
        try:
            return encode()
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
                episode,
                "score",
                lambda: env.score(transcript),
                self.bounds.step_timeout_s,
                self.clock,
                False,
                self.waits,
            )
            if isinstance(called.value, Score) and _finite(called.value):
                score = called.value
            elif not called.failed and not called.timed_out:
                guard.failed(episode, "score", f"score gave {called.value!r}, not a Score of finite numbers")
        await self._release(episode)
        return episode.result(score)

    async def _release(self, episode: Episode) -> None:
        if episode.env is not None:
            close = episode.env.close
            await guard.call(
                episode, "close", close, self.bounds.step_timeout_s, self.clock, False, self.waits
            )
        if episode.loop is not None:
            episode.loop.close()

    def _on_error(self) -> Score:
        value = self.bounds.on_error
        return Score(reward=value, correct=0.0, parts={"environment": value})


def _maker(factory: EnvironmentFactory, prompt: Prompt, seed: int) -> Callable[[], Awaitable[object]]:
    async def make() -> object:
        return factory(prompt, seed)

    return make


def _finite(score: Score) -> bool:
    values = [score.reward, score.correct, *score.parts.values()]
    return all(isinstance(v, int | float) and math.isfinite(v) for v in values)
