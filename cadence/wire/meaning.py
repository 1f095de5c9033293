"""What a well-formed message must also mean before an actor acts on it: the checks after the codec.

Invariant: each check is a pure function of the message and the limits its actor knows (the run's
periods, the model's vocabulary, the upload bounds); it returns None for a message that may be
handled, else the reason it may not, and never raises. The codec has already checked every field's
type and the range its type declares (a version, a count, a size, an index, a token id: never
negative; `cadence.wire.messages`); what is checked here depends on the run or on the other fields.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cadence.wire.messages import (
    Consumed,
    EpisodeFigures,
    EvalResult,
    GroupResult,
    RunDone,
    VersionReady,
    WeightUpload,
    WorkRequest,
)
from cadence.wire.rows import per_sample, rows_problem

MAX_CREDITS = 1 << 16
"""The most prompt groups one `WorkRequest` may grant: far above any worker's `rollout.inflight`."""

_JSON_DEPTH = 8

ENDINGS = frozenset({"done", "max_turns", "token_budget", "episode_timeout", "context", "error"})
"""Why an episode may end (`cadence.tasks.environments.base.Ending`, which a test holds this to)."""


def plain_json(value: Any, depth: int = 0) -> bool:
    """Whether `value` is of plain JSON types: str, bool, None, a number, a list of such, or a map of
    str to such, nested at most a few levels (a msgpack ext value or bytes is not)."""
    if depth > _JSON_DEPTH:
        return False
    if value is None or isinstance(value, str | bool | int | float):
        return True
    if isinstance(value, list):
        return all(plain_json(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and plain_json(v, depth + 1) for k, v in value.items())
    return False


def _finite(values: list[float]) -> bool:
    return all(math.isfinite(v) for v in values)


def _in_vocab(tokens: list[int], vocab_size: int) -> bool:
    return all(0 <= t < vocab_size for t in tokens)


def version_ready_problem(msg: VersionReady, periods: int, published: int, first: bool) -> str | None:
    """A version names a period of the run (0 … periods), and metrics of plain JSON; and
    it follows the last one announced (`published`, -1 before any): a trainer announces exactly the
    next version, or the same again. Its `first` announcement (a trainer resumed from its checkpoint)
    may go back to any earlier version, never beyond the next; any, to a dispatcher that has seen
    none (a run resumed as a whole)."""
    if not 0 <= msg.version <= periods:
        return f"version {msg.version} outside the run's 0..{periods}"
    if not plain_json(msg.metrics):
        return "metrics are not plain JSON (numbers, strings, lists and maps)"
    if published >= 0 and msg.version > published + 1:
        return f"version {msg.version} after {published}: a trainer announces the next version"
    if published >= 0 and not first and msg.version < published:
        return f"version {msg.version} after {published}: only a trainer's first announcement goes back"
    return None


def run_done_problem(msg: RunDone, periods: int, announced: int) -> str | None:
    """The run is done only at its last version, once the trainer that says so announced it
    (`announced`: the last version this trainer session announced, -1 for none)."""
    if msg.version != periods:
        return f"version {msg.version}, the run ends at {periods}"
    if announced != periods:
        return f"version {periods} not announced by this trainer (its last announced is {announced})"
    return None


def consumed_problem(msg: Consumed, period: int) -> str | None:
    """The trainer's word on groups of a period up to the open one (`period`; an older one's changes
    nothing), no group named twice in a list (the ledger counts only what it issued)."""
    if msg.period > period:
        return f"period {msg.period} is not open (the open one is {period})"
    if len(set(msg.prompt_ids)) != len(msg.prompt_ids) or len(set(msg.filtered)) != len(msg.filtered):
        return "a prompt id named twice"
    return None


def work_request_problem(msg: WorkRequest) -> str | None:
    if not 0 <= msg.credits <= MAX_CREDITS:
        return f"credits {msg.credits} outside 0..{MAX_CREDITS}"
    return None


@dataclass(frozen=True)
class GroupBounds:
    """What a group may hold in this run, fixed by its settings (0: no bound): token ids below
    `vocab_size` (the model's); `samples` completions (`rollout.group_size`); each completion at most
    `completion_tokens` long (the token limit its worker was given: `rollout.max_new_tokens`, or an
    episode's `environment.max_tokens`); its prompt and any completion together within `positions`
    (the model's); each text (a response, a transcript's messages together) at most `text_chars`; at
    most `rows` rows a sample (an agent's episode of several sequences; 1: every row its own sample)."""

    vocab_size: int
    samples: int = 0
    completion_tokens: int = 0
    positions: int = 0
    text_chars: int = 0
    rows: int = 1


def group_problem(msg: GroupResult, bounds: GroupBounds) -> str | None:
    """A group: at least one sample, its rows mapped onto its samples (`episode_of`: in order, each
    sample with a row, at most `bounds.rows` a sample, only for episodes), as many completions and
    log-prob rows as rows, as many rewards and correctness values as samples, a log-prob a token,
    every token in the vocabulary, every number finite; its size held to the run's (`bounds_problem`);
    and its episodes' masks and figures, when it has them (`episode_problem`). Checked before any
    tensor is made of it."""
    return (
        _rows_problem(msg, bounds.rows)
        or bounds_problem(msg, bounds)
        or _samples_problem(msg, bounds.vocab_size)
        or episode_problem(msg)
    )


def _rows_problem(msg: GroupResult, most: int) -> str | None:
    if not msg.rewards:
        return "no samples" if msg.completions else "no completions"
    if msg.episode_of and msg.episodes is None:
        return "rows of one sample (episode_of) in a group without episodes"
    return rows_problem(msg.episode_of, len(msg.completions), len(msg.rewards), most)


def bounds_problem(msg: GroupResult, bounds: GroupBounds) -> str | None:
    """The group's size against the run's: its samples, each completion's tokens, the prompt and a
    completion together, its texts."""
    n, b = len(msg.rewards), bounds
    if b.samples and n != b.samples:
        return f"{n} samples, the run's groups have {b.samples} (rollout.group_size)"
    longest = max((len(c) for c in msg.completions), default=0)
    if b.completion_tokens and longest > b.completion_tokens:
        return f"a completion of {longest} tokens, beyond the run's token limit of {b.completion_tokens}"
    if b.positions and len(msg.prompt_tokens) + longest > b.positions:
        return (
            f"a prompt of {len(msg.prompt_tokens)} tokens and a completion of {longest}: beyond the"
            f" model's {b.positions} positions"
        )
    transcripts = msg.episodes.transcripts if msg.episodes is not None else []
    texts = [len(t) for t in msg.responses] + [sum(map(len, t)) for t in transcripts]
    texts += [len(msg.prompt), len(msg.answer)]
    if b.text_chars and max(texts) > b.text_chars:
        return f"a text of {max(texts)} characters, beyond the run's {b.text_chars}"
    return None


def _samples_problem(msg: GroupResult, vocab_size: int) -> str | None:
    n, samples = len(msg.completions), len(msg.rewards)
    rows = {"logprobs": len(msg.logprobs)}
    if msg.truncated:
        rows["truncated"] = len(msg.truncated)
    wrong = {name: count for name, count in rows.items() if count != n}
    if wrong:
        return f"{n} completions but {wrong}"
    counts = {
        "correct": len(msg.correct),
        **{f"reward_parts[{k}]": len(v) for k, v in msg.reward_parts.items()},
    }
    if msg.responses:
        counts["responses"] = len(msg.responses)
    wrong = {name: count for name, count in counts.items() if count != samples}
    if wrong:
        return f"{samples} rewards but {wrong}"
    for i, (tokens, logprobs) in enumerate(zip(msg.completions, msg.logprobs, strict=True)):
        if len(tokens) != len(logprobs):
            return f"completion {i}: {len(tokens)} tokens but {len(logprobs)} log-probs"
        if not _in_vocab(tokens, vocab_size):
            return f"completion {i}: a token id outside the vocabulary of {vocab_size}"
        if not _finite(logprobs):
            return f"completion {i}: a log-prob that is not finite"
    if not _in_vocab(msg.prompt_tokens, vocab_size):
        return f"prompt: a token id outside the vocabulary of {vocab_size}"
    numbers = [*msg.rewards, *msg.correct, msg.gen_s, msg.load_s, msg.finished_at]
    if not _finite(numbers) or not all(_finite(v) for v in msg.reward_parts.values()):
        return "a reward, correctness value or time that is not finite"
    return None


def episode_problem(msg: GroupResult) -> str | None:
    """A group's episodes: no masks (every token sampled), or one a completion, as long as it, of 0s
    and 1s, with log-prob 0.0 at every 0 (the environment's tokens were not sampled). A completion
    with a mask holds at least one token, though maybe no 1: an episode the environment ended before
    the model's first token (it failed to start, or left no room) counts in its group's rewards and
    trains no token. Each figure list is empty or one a sample, of sound values (`_figures_problem`),
    each episode's environment tokens its rows' masks' zeros."""
    n, samples = len(msg.completions), len(msg.rewards)
    if msg.masks and len(msg.masks) != n:
        return f"{n} completions but {{'masks': {len(msg.masks)}}}"
    counts = _figure_counts(msg.episodes)
    wrong = {name: count for name, count in counts.items() if count and count != samples}
    if wrong:
        return f"{samples} samples but {wrong}"
    for i, mask in enumerate(msg.masks):
        tokens, logprobs = msg.completions[i], msg.logprobs[i]
        if len(mask) != len(tokens):
            return f"completion {i}: {len(tokens)} tokens but a mask of {len(mask)}"
        if not tokens:
            return f"completion {i}: no token (an episode's completion holds at least one)"
        if any(m not in (0, 1) for m in mask):
            return f"completion {i}: a mask value other than 0 (environment) or 1 (sampled)"
        if any(m == 0 and lp != 0.0 for m, lp in zip(mask, logprobs, strict=True)):
            return f"completion {i}: an environment token (mask 0) with a log-prob other than 0.0"
    if msg.episodes is None:
        return None
    zeros = per_sample([mask.count(0) for mask in msg.masks], msg.episode_of, samples)
    if msg.episodes.env_tokens and msg.episodes.env_tokens != zeros:
        return "environment tokens other than the masks' zeros"
    return _figures_problem(msg.episodes)


def _figure_counts(figures: EpisodeFigures | None) -> dict[str, int]:
    """How long each of the episode figure lists is (0: left empty, or no figures at all)."""
    if figures is None:
        return {}
    lists: dict[str, Sequence[object]] = {
        "turns": figures.turns,
        "tool_calls": figures.tool_calls,
        "tool_errors": figures.tool_errors,
        "env_timeouts": figures.env_timeouts,
        "env_s": figures.env_s,
        "env_tokens": figures.env_tokens,
        "endings": figures.endings,
        "transcripts": figures.transcripts,
        "turn_rewards": figures.turn_rewards,
        "sequences": figures.sequences,
        "call_tokens": figures.call_tokens,
        "call_s": figures.call_s,
    }
    return {name: len(values) for name, values in lists.items()}


def _figures_problem(figures: EpisodeFigures) -> str | None:
    """The values of episode figures already one a sample: times finite and not negative, tool errors
    at most the tool calls, endings of `ENDINGS`, each episode's turn rewards at most its model turns
    long, every one finite or None (counts are never negative: their type says so)."""
    if not all(math.isfinite(s) and s >= 0 for s in [*figures.env_s, figures.env_wall_s]):
        return "an environment time that is not finite and non-negative"
    if not all(math.isfinite(s) and s >= 0 for s in figures.call_s):
        return "a call time that is not finite and non-negative"
    if (
        figures.tool_errors
        and figures.tool_calls
        and any(e > c for e, c in zip(figures.tool_errors, figures.tool_calls, strict=True))
    ):
        return "more tool errors than tool calls"
    if not set(figures.endings) <= ENDINGS:
        return f"an ending outside {sorted(ENDINGS)}"
    for i, rewards in enumerate(figures.turn_rewards):
        if figures.turns and len(rewards) > figures.turns[i]:
            return f"episode {i}: {len(rewards)} turn rewards for {figures.turns[i]} model turns"
        if not _finite([r for r in rewards if r is not None]):
            return f"episode {i}: a turn reward that is not finite"
    return None


def eval_result_problem(msg: EvalResult, samples: int) -> str | None:
    """An eval answer: an eval prompt id (negative), `samples` samples each with a reward, a correctness
    value, a text and a length, every number finite; and its episodes' figures, when it has them: each
    list one a sample, of sound values (`_figures_problem`), an episode's environment tokens at most
    its length."""
    if msg.prompt_id >= 0:
        return f"prompt id {msg.prompt_id} is no eval prompt (eval ids are negative)"
    counts = {
        "rewards": len(msg.rewards),
        "correct": len(msg.correct),
        "responses": len(msg.responses),
        "tokens": len(msg.tokens),
    }
    counts |= {name: count for name, count in _figure_counts(msg.episodes).items() if count}
    wrong = {name: count for name, count in counts.items() if count != samples}
    if wrong:
        return f"{samples} samples expected but {wrong}"
    if not _finite([*msg.rewards, *msg.correct, msg.gen_s]):
        return "a reward, correctness value or time that is not finite"
    if msg.episodes is None:
        return None
    env_tokens = msg.episodes.env_tokens
    if env_tokens and any(e > t for e, t in zip(env_tokens, msg.tokens, strict=True)):
        return "more environment tokens than tokens"
    return _figures_problem(msg.episodes)


def upload_problem(msg: WeightUpload, chunk_bytes: int, max_bytes: int) -> str | None:
    """A chunk of an upload: its index among its chunks, the count within `max_bytes` of chunks of
    `chunk_bytes`, and every chunk but the last exactly `chunk_bytes` long (the last at most)."""
    most = max(1, -(-max_bytes // chunk_bytes))
    if not 1 <= msg.chunks <= most:
        return f"{msg.chunks} chunks, at most {most} of {chunk_bytes} bytes fit the limit of {max_bytes}"
    if not 0 <= msg.index < msg.chunks:
        return f"chunk {msg.index} of {msg.chunks}"
    size = len(msg.data)
    if size > chunk_bytes or (msg.index < msg.chunks - 1 and size != chunk_bytes):
        return f"chunk {msg.index} of {size} bytes, chunks are {chunk_bytes}"
    return None
