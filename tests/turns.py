"""What the tests of episodes on an engine share: a `TurnEngine` that keeps every sample it gave, and the
check that an episode's ids are exactly those samples and the environment's messages between them,
token in, token out."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from cadence.model.engine import (
    Completion,
    GroupEnded,
    JoinedGroup,
    SamplingParams,
    StoppedGroups,
    TorchEngine,
)
from cadence.model.rollout_engine import TurnEngine
from cadence.tasks.environments.generation import TurnCodec, turn_seed
from cadence.wire.buffer import Buffer


@dataclass(frozen=True)
class Asked:
    """One sample an engine gave: the prompt it was asked with, its call's token limit, what it gave."""

    prompt: list[int]
    max_new_tokens: int | None
    completion: Completion


class RecordingTurns:
    """`engine`, keeping every sample of every `generate_many` call by its seed (`asked`)."""

    def __init__(self, engine: TurnEngine) -> None:
        self.engine = engine
        self.asked: dict[int, Asked] = {}

    @property
    def max_context(self) -> int:
        return self.engine.max_context

    def load(self, weights: bytes | Buffer) -> None:
        self.engine.load(weights)

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        self.engine.load_state(state)

    def generate(self, prompt: list[int], seeds: list[int]) -> list[Completion]:
        return self.generate_many([(prompt, seeds)])[0]

    def generate_many(
        self,
        groups: list[tuple[list[int], list[int]]],
        temperature: float | None = None,
        max_new_tokens: int | None = None,
        *,
        ended: GroupEnded | None = None,
        stopped: StoppedGroups | None = None,
    ) -> list[list[Completion]]:
        out = self.engine.generate_many(groups, temperature, max_new_tokens, ended=ended, stopped=stopped)
        for (prompt, seeds), completions in zip(groups, out, strict=True):
            for seed, completion in zip(seeds, completions, strict=True):
                assert seed not in self.asked, f"seed {seed} asked twice"
                self.asked[seed] = Asked(list(prompt), max_new_tokens, completion)
        return out


def check_episode(
    engine: RecordingTurns,
    seed: int,
    prompt: Sequence[int],
    tokens: Sequence[int],
    mask: Sequence[int],
    logprobs: Sequence[float],
    transcript: Sequence[str],
    codec: TurnCodec,
    max_turn_tokens: int,
) -> None:
    """The episode of sample seed `seed` (its ids after `prompt`, mask, log-probs and messages: the first,
    then model and environment alternating) is its model turns exactly as `engine` sampled them, each
    asked with exactly the ids before it, within `max_turn_tokens` and the engine's positions, and
    between two turns the environment's message as `codec` encodes it; the mask is 1 on the sampled
    ids alone, the log-probs the engine's there and 0.0 at the environment's."""
    turns = len(transcript) // 2
    assert turns >= 1
    ids: list[int] = []
    want_mask: list[int] = []
    want_logprobs: list[float] = []
    for turn in range(turns):
        asked = engine.asked[turn_seed(seed, turn)]
        assert asked.prompt == [*prompt, *ids], f"turn {turn} was not asked with the ids held before it"
        limit = asked.max_new_tokens
        assert limit is not None and 1 <= limit <= max_turn_tokens
        assert len(asked.prompt) + limit <= engine.max_context
        sampled = asked.completion
        assert 1 <= len(sampled.tokens) <= limit and len(sampled.logprobs) == len(sampled.tokens)
        assert sampled.finished or len(sampled.tokens) == limit  # stopped on eos or at its limit
        ids += sampled.tokens
        want_mask += [1] * len(sampled.tokens)
        want_logprobs += sampled.logprobs
        if turn < turns - 1:  # answered, and the model took another turn: the message is in the context
            message = codec.encode_reply(transcript[2 + 2 * turn], sampled.finished)
            ids += message
            want_mask += [0] * len(message)
            want_logprobs += [0.0] * len(message)
    assert list(tokens) == ids
    assert list(mask) == want_mask
    assert list(logprobs) == want_logprobs
    assert len(prompt) + len(tokens) <= engine.max_context


class JoinWaiting(TorchEngine):
    """The built-in engine whose first call that takes joins waits (at most 20 s), once a row of it has
    ended, until something is offered to join it: a join however fast the engine is beside the
    environments or agents that ask. Counts its calls (`calls`) and the groups that joined (`joined`)."""

    calls = 0
    joined = 0

    def generate_many(
        self, groups: Sequence[tuple[Sequence[int], Sequence[int]]], params: SamplingParams, **kwargs: Any
    ) -> list[list[Completion]]:
        self.calls += 1
        ended, joining = kwargs.get("ended"), kwargs.get("joining")
        if ended is not None and joining is not None:
            told, waits = [0], not self.joined

            def counted(i: int, completions: list[Completion]) -> None:
                told[0] += 1
                ended(i, completions)

            def waiting(room: int) -> Sequence[JoinedGroup]:
                more, deadline = joining(room), time.monotonic() + 20
                while waits and told[0] and not more and not self.joined and time.monotonic() < deadline:
                    time.sleep(0.005)
                    more = joining(room)
                self.joined += len(more)
                return more

            kwargs |= {"ended": counted, "joining": waiting}
        return super().generate_many(groups, params, **kwargs)
