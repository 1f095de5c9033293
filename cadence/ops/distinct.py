"""The samples of a group the loss needs computed: each distinct sample that carries gradient, once,
with its count.

Every objective's loss is a sum over samples of a term that depends only on the sample's tokens, its
mask, its advantage and its old log-probs (ops/losses.py), and, for a row of a sample split in several,
its sample's sampled tokens. So

- a sample whose advantage is exactly 0 adds exactly 0 to the loss and to its gradient, unless a KL
  term to a reference is added (`drop_zero` False then): a group whose rewards are all equal, the
  common case once a prompt is mastered or hopeless, needs no forward and no backward at all;
- samples of one group with the same tokens, mask, advantage and old log-probs add the same term: it
  is computed once and weighted by their count (short answers repeat often). Two samples of the same
  tokens with other masks (a token the model sampled in one, an environment wrote in the other) are
  two samples; an environment token's old log-prob is never read (ops/losses.py), so it is not
  compared. A sample all of whose tokens are an environment's has no term at all: it is dropped.

Invariant: with `weights` the counts, Σ over `distinct_samples`' picks of weight × term equals the
sum over every sample of its term, up to float summation order (k × x for x + … + x); every sample
either is a pick or equals one, or (with `drop_zero`) has advantage 0, or has tokens and none sampled.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from cadence.ops.sampled import Masks, check_masks


def distinct_samples(
    completions: Sequence[Sequence[int]],
    advantages: Sequence[float],
    old_logprobs: Sequence[Sequence[float]] | None,
    drop_zero: bool,
    masks: Masks = None,
    engine_logprobs: Sequence[Sequence[float]] | None = None,
    sample_tokens: Sequence[int] | None = None,
) -> list[tuple[int, int]]:
    """(index, count) of each distinct sample of one group, in the order of first appearance: the index
    of its first occurrence and how many samples it stands for. `masks`: each completion's sampled
    tokens (None: all); `engine_logprobs`: the sampler's log-probs where the loss reads them beside the
    old ones (a rollout correction's weights, ops/correction.py), compared as the old ones are; `sample_tokens`: each row's sample's sampled tokens where a sample
    spans several rows (ops/losses.py), a row's term depending on them."""
    if len(advantages) != len(completions):
        raise ValueError(f"{len(advantages)} advantages for {len(completions)} completions")
    if old_logprobs is not None and len(old_logprobs) != len(completions):
        raise ValueError(f"{len(old_logprobs)} old log-prob lists for {len(completions)} completions")
    check_masks(completions, masks)
    first: dict[Hashable, int] = {}
    counts: dict[int, int] = {}
    for i, (tokens, advantage) in enumerate(zip(completions, advantages, strict=True)):
        mask = tuple(masks[i]) if masks is not None else None
        if (drop_zero and advantage == 0.0) or (mask and not any(mask)):  # advantage 0, or no sampled token
            continue
        key = (
            tuple(tokens),
            mask,
            advantage,
            _read(old_logprobs[i], mask) if old_logprobs is not None else None,
            _read(engine_logprobs[i], mask) if engine_logprobs is not None else None,
            sample_tokens[i] if sample_tokens is not None else None,
        )
        index = first.setdefault(key, i)
        counts[index] = counts.get(index, 0) + 1
    return list(counts.items())


def _read(old: Sequence[float], mask: tuple[int, ...] | None) -> tuple[float, ...]:
    """The old log-probs the loss reads: those of the sampled tokens."""
    if mask is None:
        return tuple(old)
    return tuple(lp for lp, m in zip(old, mask, strict=False) if m)
