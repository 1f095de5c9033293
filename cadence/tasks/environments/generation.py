"""What the episode runner asks of the rest: an engine that continues token ids, and the chat
template's turn boundaries as token ids. Both are Protocols: the tasks layer imports no model code;
`cadence.model.turns.ChatTurns` is the template side, `cadence.rollout.play.EngineGenerate` the
built-in engine's side.

Invariant (token in, token out): the runner never decodes and re-encodes what it already holds; an
episode's context is the prompt's ids, then each turn's ids exactly as sampled or as `encode_reply`
gave them. `turn_seed(seed, 0) == seed`, so an episode's first turn is the single-turn sample of seed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from cadence.tasks.environments.base import Opening


@dataclass(frozen=True)
class Generated:
    """One model turn: the sampled ids (with the final end-of-turn id if it stopped there) and the
    log-prob of each, as the sampling distribution gave it."""

    tokens: list[int]
    logprobs: list[float]
    finished: bool  # ended on its end-of-turn (eos) token, not at its token limit


class Generate(Protocol):
    @property
    def max_context(self) -> int:
        """The ids a context may hold, the prompt's and the sampled ones together (the model's positions)."""
        ...

    async def __call__(
        self, prompts: Sequence[Sequence[int]], seeds: Sequence[int], max_new_tokens: Sequence[int]
    ) -> list[Generated]:
        """One continuation of each prompt, sample i drawn from `seeds[i]` alone, at most
        `max_new_tokens[i]` tokens (the runner keeps prompt and new tokens within `max_context`)."""
        ...


Row = tuple[Sequence[int], int, int]  # a turn to sample: its context's ids, its seed, its token limit


class Offers(Protocol):
    """Turns offered to a running call (`Streaming.stream`), taken by the engine's thread."""

    def take(self, fits: Callable[[Sequence[int], int], bool]) -> list[Row]:
        """(Any thread.) The turns offered and not taken yet for which `fits(context, limit)`, in the
        order they came; the others stay offered."""
        ...


@runtime_checkable
class Streaming(Generate, Protocol):
    """A `Generate` whose call takes more turns while it decodes and tells each as it ends: an
    episode's next turn joins the running call as soon as its environment has replied."""

    async def stream(
        self,
        rows: Sequence[Row],
        told: Callable[[int, Generated], None],
        offers: Offers,
        steps: int,
        shared: Sequence[int] = (),
        positions: int = 0,
    ) -> None:
        """Sample `rows` together, and the turns `offers` gives while they decode (each at most `steps`
        new tokens); `told(i, turn)`, on the event loop, as turn `i` ends (`i` counts `rows`, then
        the turns taken, in the order taken). Returns once every turn taken has been told (a turn
        the model has no room for at once, with no tokens). `shared`: a beginning every context of
        the batch has, computed once; `positions`: the most a context and its turn will take, so that
        later turns fit the call. A turn's sample depends on its context, seed and limit, `shared`
        and the weights alone, bit for bit, never on what it is decoded beside or when it joins."""
        ...


class TurnCodec(Protocol):
    @property
    def tool_format(self) -> str:
        """How the template's model family writes a tool call: "hermes" or "llama3"."""
        ...

    def encode_prompt(self, opening: Opening, tools: Sequence[Mapping[str, Any]] = ()) -> list[int]:
        """The first user message (or the conversation ending with it) in the chat template, ready for
        the model's first turn, with `tools` (OpenAI-format schemas) declared as the template does."""
        ...

    def encode_results(self, results: Sequence[str], finished: bool) -> list[int]:
        """As `encode_reply`, around `results`: one message in the template's tool role each."""
        ...

    def encode_reply(self, message: str, finished: bool) -> list[int]:
        """The ids between the model's turn and its next one around `message`: the template's end of
        the model's turn (less its eos when `finished`: the model sampled it), the message's header,
        the message, its end, the next model turn's header. Text in `message` is never control: a special
        token's text in it is encoded as plain text."""
        ...

    def decode_response(self, ids: Sequence[int]) -> str:
        """A model turn as the text the environment reads (its final eos dropped)."""
        ...


def turn_seed(seed: int, turn: int) -> int:
    """The seed of model turn `turn` (0-based) of an episode of sample seed `seed`: `seed` itself for
    the first, a stable 63-bit hash of (seed, turn) after it."""
    if turn == 0:
        return seed
    digest = hashlib.blake2b(f"{seed}:{turn}".encode(), digest_size=8, person=b"cadence-turn").digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)
