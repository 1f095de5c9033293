"""What a rollout worker asks of an engine (`RolloutEngine`; `TurnEngine` for multi-turn episodes), and
the built-in engine behind both interfaces.

Invariant: an engine generates only with the weights it was last given (`load` or `load_state`);
the worker decides which version that is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from cadence.model.checkpoint import state_dict_from_bytes
from cadence.model.engine import (
    Completion,
    GroupEnded,
    JoiningGroups,
    SamplingParams,
    StoppedGroups,
    TorchEngine,
)
from cadence.model.thread_invariance import alike_at_threads
from cadence.wire.buffer import Buffer


class RolloutEngine(Protocol):
    def load(self, weights: bytes | Buffer) -> None:
        """Take the weights of a version as safetensors bytes (pulled from the publisher). An engine
        may compute with a bytearray's bytes themselves until its next load: the caller leaves them
        unchanged while anything views them (a `BufferPool` hands such a buffer out again only then)."""
        ...

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        """Take the weights of a version as HF-named tensors (received by broadcast)."""
        ...

    def generate(self, prompt: list[int], seeds: list[int]) -> list[Completion]: ...

    def generate_many(
        self,
        groups: list[tuple[list[int], list[int]]],
        temperature: float | None = None,
        *,
        ended: GroupEnded | None = None,
        stopped: StoppedGroups | None = None,
    ) -> list[list[Completion]]:
        """`generate` of each (prompt, seeds), computed together where the engine can batch them;
        `temperature`: this call's instead of the engine's own (held-out evaluation; 0 is greedy).

        `ended(i, completions)`, called on the generating thread before the call returns, is told
        group `i` (an index into `groups`) as soon as every sample of it has ended (eos or the token
        limit), with exactly what the call returns for it: every group not stopped once (a group of
        no seeds too, with []), in the order the groups end (ties in index order). `stopped()`, asked
        between two of the engine's steps, names the groups to stop now (it may grow, and may name
        groups already ended: those are ignored): a stopped group's samples stop computing at once, it
        is never told to `ended`, and the call returns [] for it; once every group has ended or
        stopped, the call returns. Neither changes any sample of the others."""
        ...


@runtime_checkable
class TurnEngine(RolloutEngine, Protocol):
    """An engine that runs episodes' turns: a token limit a call, and how many positions a context
    (prompt and new tokens) may take. The built-in engine is one, and so is vLLM's
    (`cadence.model.vllm_engine.VllmEngine`)."""

    @property
    def max_context(self) -> int:
        """The model's positions: a prompt and the tokens sampled after it together."""
        ...

    def generate_many(
        self,
        groups: list[tuple[list[int], list[int]]],
        temperature: float | None = None,
        max_new_tokens: int | None = None,
        *,
        ended: GroupEnded | None = None,
        stopped: StoppedGroups | None = None,
    ) -> list[list[Completion]]:
        """`RolloutEngine.generate_many` (its `ended` and `stopped` alike), each sample at most
        `max_new_tokens` long (None: the engine's own limit); every prompt with that many new tokens
        fits `max_context`."""
        ...


@runtime_checkable
class LimitedEngine(TurnEngine, Protocol):
    """A `TurnEngine` whose calls take a token limit a group (`limits`, each at most the call's
    `max_new_tokens`), so that the episodes' turns of different room decode in one call, the
    beginning they share, and turns joining while it decodes: the built-in one (`limited`, which a
    runtime check can see)."""

    limited: bool

    def generate_many(
        self,
        groups: list[tuple[list[int], list[int]]],
        temperature: float | None = None,
        max_new_tokens: int | None = None,
        *,
        ended: GroupEnded | None = None,
        stopped: StoppedGroups | None = None,
        joining: JoiningGroups | None = None,
        limits: Sequence[int] | None = None,
        shared: Sequence[int] = (),
        positions: int = 0,
    ) -> list[list[Completion]]:
        """`TurnEngine.generate_many`, group `i` at most `limits[i]` new tokens: the first tokens of
        what a call of `max_new_tokens` samples for it; `shared`: a beginning the prompts share (an
        episode batch's opening), computed once for every prompt that begins with it; `joining` as
        `JoiningEngine`'s (a group may carry its own limit), with `positions` a row for the longer
        prompts that join."""
        ...


@runtime_checkable
class JoiningEngine(RolloutEngine, Protocol):
    """An engine whose calls take groups while they decode (continuous batching across a worker's
    assignments): the built-in one (`joins`, which a runtime check can see: a signature it cannot)."""

    joins: bool

    def generate_many(
        self,
        groups: list[tuple[list[int], list[int]]],
        temperature: float | None = None,
        max_new_tokens: int | None = None,
        *,
        ended: GroupEnded | None = None,
        stopped: StoppedGroups | None = None,
        joining: JoiningGroups | None = None,
    ) -> list[list[Completion]]:
        """`RolloutEngine.generate_many`, and `joining(room)`, asked between two of its steps, gives
        groups (at most `room` prompt tokens, at least one seed) that join the call: told to `ended`
        and returned like its own, at the indices after them in the order they came."""
        ...


@runtime_checkable
class ThreadedEngine(RolloutEngine, Protocol):
    """An engine that can tell whether it computes the same bits with two thread counts (the built-in
    one: `model/thread_invariance.py`); a worker takes more threads than its share only then."""

    pace: Callable[[], None] | None
    """Asked between two decode steps, in the generating thread (a worker sets its thread budget)."""

    def alike_at_threads(self, a: int, b: int) -> bool: ...


class TorchRolloutEngine:
    """The built-in engine behind the worker's `RolloutEngine`, `TurnEngine`, `LimitedEngine`,
    `JoiningEngine` and `ThreadedEngine` interfaces."""

    joins = True
    limited = True

    def __init__(self, engine: TorchEngine, params: SamplingParams) -> None:
        self.engine = engine
        self.params = params

    def load(self, weights: bytes | Buffer) -> None:
        # a bytearray's tensors are views of it: they become the model's weights, no copy
        self.engine.load_state_dict(state_dict_from_bytes(weights), share=isinstance(weights, bytearray))

    def load_state(self, state: Mapping[str, torch.Tensor]) -> None:
        self.engine.load_state_dict(state)

    def alike_at_threads(self, a: int, b: int) -> bool:
        return alike_at_threads(self.engine, a, b)

    @property
    def pace(self) -> Callable[[], None] | None:
        return self.engine.pace

    @pace.setter
    def pace(self, pace: Callable[[], None] | None) -> None:
        self.engine.pace = pace

    def generate(self, prompt: list[int], seeds: list[int]) -> list[Completion]:
        return self.engine.generate(prompt, seeds, self.params)

    @property
    def max_context(self) -> int:
        return self.engine.model.cfg.max_position

    def generate_many(
        self,
        groups: list[tuple[list[int], list[int]]],
        temperature: float | None = None,
        max_new_tokens: int | None = None,
        *,
        ended: GroupEnded | None = None,
        stopped: StoppedGroups | None = None,
        joining: JoiningGroups | None = None,
        limits: Sequence[int] | None = None,
        shared: Sequence[int] = (),
        positions: int = 0,
    ) -> list[list[Completion]]:
        params = self.params.overridden(temperature, max_new_tokens)
        return self.engine.generate_many(
            groups,
            params,
            ended=ended,
            stopped=stopped,
            joining=joining,
            limits=limits,
            shared=shared,
            positions=positions,
        )
