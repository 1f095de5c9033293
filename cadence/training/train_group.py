"""A GRPO group as the learner takes it (`TrainGroup.of` a `GroupResult`, with no copy of its lists): one prompt, its completions and their rewards, and what the
sampler knew of them (its log-probs, as the old policy's or only to measure and correct the gap between
the engine and the learner; which tokens the model sampled and which an environment wrote).

A sample may be several completions (rows): an agent's episode whose calls formed several token
sequences (`episode_of`, as the wire carries it). Its reward is counted once in the group's advantages
and every row of it carries that advantage; a token-level normaliser counts its sampled tokens, a
sample-level one counts it once (`sampled_tokens`: one length a sample), and each row's term knows its
sample's sampled tokens (`sample_tokens`, ops/losses.py), so a sample's rows train as the sample would.

Invariant: every per-completion list (`old_logprobs`, `advantages`, `masks`, `engine_logprobs`,
`sample_tokens`) lines up with `completions`, `rewards` with the samples (`episode_of`; one a
completion without it), and `pick` keeps it so: a completion travels with its old log-probs,
advantage, mask and its sample's tokens to whichever rank or micro-batch takes it. The fields are plain
lists, so a group crosses between ranks as a msgpack dict (`TrainGroup(**fields)`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from cadence.ops.advantages import group_advantages
from cadence.ops.sampled import check_masks, sampled_lengths
from cadence.wire.messages import GroupResult
from cadence.wire.rows import per_sample, row_samples


@dataclass(frozen=True)
class TrainGroup:
    """One GRPO group as the learner needs it; `old_logprobs` are the sampler's, one list a completion,
    or None to take the detached policy's; `advantages`, one a completion, when these completions are a
    share of a larger group (whose rewards they come from), or None to compute them from `rewards`;
    `masks`, one list a completion and one entry a token, 1 where the model sampled the token and 0
    where an environment wrote it (context only: no loss, ops/sampled.py), or None: all sampled;
    `engine_logprobs`, the sampler's log-probs when they are not the old policy's (one step a period):
    what the learner measures its own against (ops/mismatch.py) and corrects for (ops/correction.py);
    `episode_of`, each completion's sample (its index in `rewards`), or None: completion i is sample i;
    `sample_tokens`, one a completion, the sampled tokens of its sample when given (a share of a larger
    group), else counted from `episode_of` and the masks."""

    prompt: list[int]
    completions: list[list[int]]
    rewards: list[float]
    old_logprobs: list[list[float]] | None = None
    advantages: list[float] | None = None
    masks: list[list[int]] | None = None
    engine_logprobs: list[list[float]] | None = None
    episode_of: list[int] | None = None
    sample_tokens: list[int] | None = None

    def __post_init__(self) -> None:
        check_masks(self.completions, self.masks)

    @classmethod
    def of(cls, group: GroupResult, sampler_logprobs: bool) -> TrainGroup:
        """The learner's view of a group as the wire carries it: its prompt, completions, rewards and
        masks, with the sampler's log-probs as the old policy's when `sampler_logprobs` (else the
        detached policy's, and the sampler's as `engine_logprobs`)."""
        old = group.logprobs if sampler_logprobs else None
        engine = None if sampler_logprobs or not group.logprobs else group.logprobs
        masks = group.masks or None
        rows = group.episode_of or None
        return cls(
            group.prompt_tokens,
            group.completions,
            group.rewards,
            old,
            masks=masks,
            engine_logprobs=engine,
            episode_of=rows,
        )

    def engine_list(self) -> list[list[float]] | None:
        """The sampler's log-probs, however the group carries them (as the old policy's or not)."""
        return self.old_logprobs if self.old_logprobs is not None else self.engine_logprobs

    def advantage_list(self, scale: bool) -> list[float]:
        """The given advantages, or the group's own from its rewards, one a sample (`scale`: divided by
        their std), each completion its sample's."""
        if self.advantages is not None:
            return list(self.advantages)
        own = group_advantages(torch.tensor(self.rewards, dtype=torch.float32), scale=scale).tolist()
        return [own[s] for s in row_samples(self.episode_of or (), len(self.completions))]

    def sampled_lengths(self) -> list[int]:
        """The tokens of each completion the model sampled."""
        return sampled_lengths(self.completions, self.masks)

    def sample_lengths(self) -> list[int]:
        """The sampled tokens of each sample, its completions' together: what a normaliser counts (a
        share of a group, `pick`'s: one a completion)."""
        return per_sample(self.sampled_lengths(), self.episode_of or (), len(self.rewards))

    def sample_token_list(self) -> list[int] | None:
        """Each completion's sample's sampled tokens, or None when every completion is a sample."""
        if self.sample_tokens is not None:
            return list(self.sample_tokens)
        if self.episode_of is None:
            return None
        totals = self.sample_lengths()
        return [totals[s] for s in self.episode_of]

    def pick(self, index: Sequence[int], advantages: Sequence[float]) -> TrainGroup:
        """The completions at `index` (in that order) as a group of their own, each its own sample,
        with `advantages` (those of the whole group, one a completion) and its sample's sampled tokens
        made explicit, each with its old log-probs and mask."""
        old, masks, engine = self.old_logprobs, self.masks, self.engine_logprobs
        samples = row_samples(self.episode_of or (), len(self.completions))
        tokens = self.sample_token_list()
        return TrainGroup(
            self.prompt,
            [self.completions[i] for i in index],
            [self.rewards[samples[i]] for i in index],
            [old[i] for i in index] if old is not None else None,
            [advantages[i] for i in index],
            [masks[i] for i in index] if masks is not None else None,
            [engine[i] for i in index] if engine is not None else None,
            sample_tokens=[tokens[i] for i in index] if tokens is not None else None,
        )


def sampled_tokens(groups: Sequence[TrainGroup]) -> list[int]:
    """The sampled tokens of every sample of `groups`, in order (a sample of several completions: their
    sum): the lengths `step_normaliser` (ops/losses.py) takes, environment tokens left out."""
    return [n for g in groups for n in g.sample_lengths()]


def logprob_rows(
    groups: Sequence[TrainGroup], like: Tensor, given: Callable[[TrainGroup], list[list[float]] | None]
) -> tuple[Tensor, Tensor]:
    """[S, T] rows of each completion's `given(group)` log-probs (groups in order, a completion's row
    from its first token), `like`'s detached values wherever a group gives none; and [S, 1] bool, the
    rows that were given."""
    rows = like.detach().clone()
    had = torch.zeros((rows.shape[0], 1), dtype=torch.bool, device=rows.device)
    row = 0
    for g in groups:
        lists = given(g)
        for values in lists or []:
            rows[row, : len(values)] = torch.tensor(values, dtype=rows.dtype, device=rows.device)
            had[row] = True
            row += 1
        row += 0 if lists else len(g.completions)
    return rows, had
