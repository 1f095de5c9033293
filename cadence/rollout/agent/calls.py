"""One agent episode's side of the endpoint: each call checked against the episode's bounds, placed in
its sequences (`trace.py`), sampled through the batcher with the episode's seeds, answered.

```
 complete(request, messages)
   temperature and top_p: the batch's (`sampling.py`); n within max_choices; calls < max_turns;
   the prompt (placed; the tools offered unless tool_choice is "none") within the model's positions;
   a token limit of min(max_tokens asked, max_turn_tokens, the positions left, the episode's tokens left)
   ─► seeds: choice_seed(seed, call, choice) ─► batcher ─► each choice cut at its first stop, its
   tool calls read in the template's family (none under tool_choice "none"), its log-probs in
   OpenAI's form when asked ─► recorded in the trace ─► the response (ids, log-probs, version,
   what it was sampled at)
```

Each call is logged as a span (`call`, from its arrival to its answer) on the worker's clock.

Invariant: a call past a bound is refused (an OpenAI error) and the bound is the episode's ending; the
first call's first choice is sampled with the episode's seed, as a single-turn sample is; what a
response says was sampled is exactly what the trace keeps for training.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from cadence.model.tokenizer import TextTokenizer
from cadence.rollout.agent import logprobs
from cadence.rollout.agent.batcher import Batcher
from cadence.rollout.agent.chat import ApiError, ChatRequest, Choice, Said, answer, new_call_id, response
from cadence.rollout.agent.sampling import Sampling
from cadence.rollout.agent.trace import Trace
from cadence.tasks.environments.base import Ending
from cadence.tasks.environments.bounds import Bounds
from cadence.tasks.environments.generation import Generated, turn_seed
from cadence.tasks.tools.calls import Family

log = structlog.get_logger()


@dataclass(frozen=True)
class Serving:
    """What every episode's calls share: the engine's batcher and positions, the bounds, the version,
    what the batch samples at."""

    batcher: Batcher
    tokenizer: TextTokenizer
    bounds: Bounds
    max_context: int
    max_choices: int
    version: int
    model: str
    clock: Callable[[], float] = time.monotonic
    spans: dict[str, Any] | None = None  # each call logged as a span "call" with these fields (the worker's)
    sampling: Sampling = Sampling()


@dataclass
class EpisodeCalls:
    serving: Serving
    trace: Trace
    seed: int
    deadline: float
    calls: int = 0
    tokens: int = 0  # sampled by every call, kept or not
    tool_calls: int = 0
    seconds: float = 0.0  # inside calls, from arrival to answer
    in_call: int = 0
    idle_since: float = 0.0
    bound: Ending | None = None  # the first bound a call was refused at
    activity: asyncio.Event = field(default_factory=asyncio.Event)

    async def complete(self, request: ChatRequest, said: Sequence[Said]) -> dict[str, Any]:
        """The answer to one call of the episode; `ApiError` for a call it may not make."""
        clock = self.serving.clock
        arrived = clock()
        self.in_call += 1
        try:
            return await self._complete(request, said)
        finally:
            self.in_call -= 1
            self.idle_since = clock()
            self.seconds += self.idle_since - arrived
            self.activity.set()
            if self.serving.spans is not None:
                log.debug(
                    "span",
                    kind="call",
                    start=arrived,
                    end=self.idle_since,
                    **self.serving.spans,
                    seed=self.seed,
                )

    async def _complete(self, request: ChatRequest, said: Sequence[Said]) -> dict[str, Any]:
        s, bounds = self.serving, self.serving.bounds
        overridden = s.sampling.overridden(request)
        if request.n > s.max_choices:
            raise ApiError(400, f"n = {request.n}: at most {s.max_choices} choices a call", param="n")
        if self.calls >= bounds.max_turns:
            self._refuse(
                "max_turns", f"the episode has made its {bounds.max_turns} calls (environment.max_turns)"
            )
        placed = self.trace.place(said, request.offered_tools)
        if len(placed.ids) >= s.max_context:
            if placed.parent is None:
                raise ApiError(
                    400,
                    f"the prompt is {len(placed.ids)} tokens: the model's context is {s.max_context}",
                    param="messages",
                    code="context_length_exceeded",
                )
            self._refuse("context", f"the conversation fills the model's {s.max_context} positions")
        budget = bounds.max_tokens - placed.held(self.trace.nodes)
        room = min(
            request.token_limit or bounds.max_turn_tokens,
            bounds.max_turn_tokens,
            s.max_context - len(placed.ids),
            budget,
        )
        if room < 1:
            self._refuse(
                "token_budget", f"the episode holds its {bounds.max_tokens} tokens (environment.max_tokens)"
            )
        call, self.calls = self.calls, self.calls + 1
        seeds = [choice_seed(self.seed, call, j) for j in range(request.n)]
        made = await s.batcher.sample([(placed.ids, seed, room) for seed in seeds], len(placed.ids) + budget)
        family = self.trace.renderer.family if request.reads_calls else None
        choices = [self._choice(g, request.stops, family, bool(request.logprobs)) for g in made]
        for choice, generated in zip(choices, made, strict=True):
            said_back = choice.said
            self.tool_calls += len(said_back.calls)
            self.tokens += len(choice.tokens)
            finished = (
                choice.finish_reason == "stop" and generated.finished and choice.tokens == generated.tokens
            )
            self.trace.record(placed, said_back, choice.tokens, choice.logprobs, finished)
        extension = {"version": s.version, **s.sampling.extension(overridden)}
        return response(s.model, placed.ids, choices, new_call_id(), extension)

    def _refuse(self, bound: Ending, why: str) -> None:
        self.bound = self.bound or bound
        raise ApiError(400, f"{why}: no more calls are answered in this episode", code=bound)

    def _choice(self, generated: Generated, stops: list[str], family: Family | None, openai: bool) -> Choice:
        """A sample as a choice: cut at its first stop string, its calls read in `family`'s form, its
        log-probs in OpenAI's form when `openai`."""
        tokens, lps = generated.tokens, generated.logprobs
        tokenizer = self.serving.tokenizer
        text = tokenizer.decode_response(tokens)
        reason = "stop" if generated.finished else "length"
        cut = _first_stop(text, stops)
        if cut is not None:
            keep = next(
                k
                for k in range(len(tokens) + 1)
                if _first_stop(tokenizer.decode_response(tokens[:k]), stops) is not None
            )
            text, tokens, lps, reason = text[:cut], tokens[:keep], lps[:keep], "stop"
        shown = logprobs.content(tokenizer, tokens, lps) if openai else None
        return Choice(text, tokens, lps, reason, answer(text, family), shown)


def _first_stop(text: str, stops: list[str]) -> int | None:
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found) if found else None


def choice_seed(seed: int, call: int, choice: int) -> int:
    """The seed of choice `choice` of call `call` (0-based) of the episode of sample seed `seed`: the
    episode runner's `turn_seed(seed, call)` for the first choice, a stable 63-bit hash of all three
    for the others (never another call's first choice's)."""
    if choice == 0:
        return turn_seed(seed, call)
    key = f"{seed}:{call}:{choice}".encode()
    digest = hashlib.blake2b(key, digest_size=8, person=b"cadence-choice").digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)
