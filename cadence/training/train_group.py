"""A GRPO group as the learner takes it (`TrainGroup.of` a `GroupResult`, with no copy of its lists): one prompt, its completions and their rewards, and what the
sampler knew of them (its log-probs, as the old policy's or only to measure and correct the gap between
the engine and the learner; which tokens the model sampled and which an environment wrote).

Invariant: every per-completion list (`rewards`, `old_logprobs`, `advantages`, `masks`,
`engine_logprobs`) lines up with
`completions`, and `pick` keeps it so: a completion travels with its reward, old log-probs, advantage
and mask to whichever rank or micro-batch takes it. The fields are plain lists, so a group crosses
between ranks as a msgpack dict (`TrainGroup(**fields)`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from cadence.ops.advantages import group_advantages
from cadence.ops.sampled import check_masks, sampled_lengths
from cadence.wire.messages import GroupResult


@dataclass(frozen=True)
class TrainGroup:
    """One GRPO group as the learner needs it; `old_logprobs` are the sampler's, one list a completion,
    or None to take the detached policy's; `advantages`, one a completion, when these completions are a
    share of a larger group (whose rewards they come from), or None to compute them from `rewards`;
    `masks`, one list a completion and one entry a token, 1 where the model sampled the token and 0
    where an environment wrote it (context only: no loss, ops/sampled.py), or None: all sampled;
    `engine_logprobs`, the sampler's log-probs when they are not the old policy's (one step a period):
    what the learner measures its own against (ops/mismatch.py) and corrects for (ops/correction.py)."""

    prompt: list[int]
    completions: list[list[int]]
    rewards: list[float]
    old_logprobs: list[list[float]] | None = None
    advantages: list[float] | None = None
    masks: list[list[int]] | None = None
    engine_logprobs: list[list[float]] | None = None

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
        return cls(
            group.prompt_tokens, group.completions, group.rewards, old, masks=masks, engine_logprobs=engine
        )

    def engine_list(self) -> list[list[float]] | None:
        """The sampler's log-probs, however the group carries them (as the old policy's or not)."""
        return self.old_logprobs if self.old_logprobs is not None else self.engine_logprobs

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
        old, masks, engine = self.old_logprobs, self.masks, self.engine_logprobs
        return TrainGroup(
            self.prompt,
            [self.completions[i] for i in index],
            [self.rewards[i] for i in index],
            [old[i] for i in index] if old is not None else None,
            [advantages[i] for i in index],
            [masks[i] for i in index] if masks is not None else None,
            [engine[i] for i in index] if engine is not None else None,
        )


def sampled_tokens(groups: Sequence[TrainGroup]) -> list[int]:
    """The sampled tokens of every completion of `groups`, in order: the lengths `step_normaliser`
    (ops/losses.py) takes, environment tokens left out."""
    return [n for g in groups for n in g.sampled_lengths()]


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
