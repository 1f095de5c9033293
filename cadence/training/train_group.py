"""A GRPO group as the learner takes it (`TrainGroup.of` a `GroupResult`, with no copy of its lists): one prompt, its completions and their rewards, and what the
sampler knew of them (old log-probs; which tokens the model sampled and which an environment wrote).

Invariant: every per-completion list (`rewards`, `old_logprobs`, `advantages`, `masks`) lines up with
`completions`, and `pick` keeps it so: a completion travels with its reward, old log-probs, advantage
and mask to whichever rank or micro-batch takes it. The fields are plain lists, so a group crosses
between ranks as a msgpack dict (`TrainGroup(**fields)`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from cadence.ops.advantages import group_advantages
from cadence.ops.sampled import check_masks, sampled_lengths
from cadence.wire.messages import GroupResult


@dataclass(frozen=True)
class TrainGroup:
    """One GRPO group as the learner needs it; `old_logprobs` are the sampler's, one list a completion,
    or None to take the detached policy's; `advantages`, one a completion, when these completions are a
    share of a larger group (whose rewards they come from), or None to compute them from `rewards`;
    `masks`, one list a completion and one entry a token, 1 where the model sampled the token and 0
    where an environment wrote it (context only: no loss, ops/sampled.py), or None: all sampled."""

    prompt: list[int]
    completions: list[list[int]]
    rewards: list[float]
    old_logprobs: list[list[float]] | None = None
    advantages: list[float] | None = None
    masks: list[list[int]] | None = None

    def __post_init__(self) -> None:
        check_masks(self.completions, self.masks)

    @classmethod
    def of(cls, group: GroupResult, sampler_logprobs: bool) -> TrainGroup:
        """The learner's view of a group as the wire carries it: its prompt, completions, rewards and
        masks, with the sampler's log-probs as the old policy's when `sampler_logprobs` (else the
        detached policy's)."""
        old = group.logprobs if sampler_logprobs else None
        return cls(group.prompt_tokens, group.completions, group.rewards, old, masks=group.masks or None)

    def advantage_list(self, scale: bool) -> list[float]:
        """The given advantages, or the group's own from its rewards (`scale`: divided by their std)."""
        if self.advantages is not None:
            return list(self.advantages)
        return group_advantages(torch.tensor(self.rewards, dtype=torch.float32), scale=scale).tolist()

    def sampled_lengths(self) -> list[int]:
        """The tokens of each completion the model sampled: what a token-level normaliser counts."""
        return sampled_lengths(self.completions, self.masks)

    def pick(self, index: Sequence[int], advantages: Sequence[float]) -> TrainGroup:
        """The completions at `index` (in that order) as a group of their own, with `advantages`
        (those of the whole group) made explicit, each with its old log-probs and mask."""
        old, masks = self.old_logprobs, self.masks
        return TrainGroup(
            self.prompt,
            [self.completions[i] for i in index],
            [self.rewards[i] for i in index],
            [old[i] for i in index] if old is not None else None,
            [advantages[i] for i in index],
            [masks[i] for i in index] if masks is not None else None,
        )


def sampled_tokens(groups: Sequence[TrainGroup]) -> list[int]:
    """The sampled tokens of every completion of `groups`, in order: the lengths `step_normaliser`
    (ops/losses.py) takes, environment tokens left out."""
    return [n for g in groups for n in g.sampled_lengths()]
