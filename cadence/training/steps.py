"""A period's optimizer steps on the learner's side: groups in as the wire gives them, one step out
with the normaliser and learning rate the objective and the schedule fix.

```
 train(groups: GroupResult ...) ─► each as the learner takes it (TrainGroup.of: its prompt, completions,
                                   rewards, masks; the sampler's log-probs when a period takes several
                                   steps) ─► learner.train_groups (summed loss) ; their sampled lengths kept
 step(period, j) ─► normaliser: step_normaliser(objective, normaliser, every kept length (one an
                   episode, its rows' together), max sampled)
                ─► lr: the schedule's at the run's step period x steps_per_period + j (ops/schedule.py)
                ─► learner.step(normaliser, lr) ─► the lengths forgotten
```

Invariant: a step's normaliser counts the sampled tokens (never an environment's) of exactly the
groups trained since the step before, whatever micro-batches they came in and in whatever order, so
the step equals the one a single micro-batch of the same groups gives up to summation order; its
rate depends only on its index in the run, so a resumed run continues the schedule exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from cadence.ops.losses import step_normaliser
from cadence.ops.packing import packed_length
from cadence.ops.schedule import lr_at
from cadence.training.learner import Learner
from cadence.training.train_group import TrainGroup, sampled_tokens
from cadence.wire.messages import GroupResult


@dataclass(frozen=True)
class StepRule:
    """What fixes each optimizer step's normaliser and rate (`trainer.*`, built by `launch/settings.py`):
    `max_sampled_tokens` is the most tokens a sample's model may sample (dr_grpo's constant
    normaliser is it x samples): `rollout.max_new_tokens`, or an episode's `environment.max_tokens`;
    `lr` None leaves the learner's own rate, never changed."""

    objective: str = "dapo"
    normaliser: Literal["tokens", "samples"] = "tokens"
    max_sampled_tokens: int = 1
    steps_per_period: int = 1
    periods: int = 1
    lr: float | None = None
    lr_schedule: str = "constant"
    warmup_periods: int = 0
    min_lr_ratio: float = 0.0

    def lr_at(self, step: int) -> float | None:
        """The learning rate of the run's optimizer step `step` (ops/schedule.py)."""
        if self.lr is None:
            return None
        steps = self.steps_per_period
        total, warmup = self.periods * steps, self.warmup_periods * steps
        return lr_at(step, self.lr, self.lr_schedule, total, warmup, self.min_lr_ratio)

    def normaliser_of(self, lengths: Sequence[int]) -> float:
        """What a step over completions of these sampled lengths divides its summed gradient by."""
        return step_normaliser(self.objective, self.normaliser, lengths, self.max_sampled_tokens)


def group_tokens(group: GroupResult) -> int:
    """The tokens `group` takes in a packed micro-batch (what `trainer.micro_batch_tokens` bounds)."""
    return packed_length(group.prompt_tokens, group.completions)


class Steps:
    """The optimizer steps of `learner` under `rule`: `train` a micro-batch, `step` once its share of
    a period's groups is in. Called on one thread at a time (the trainer's computing thread)."""

    def __init__(self, learner: Learner, rule: StepRule) -> None:
        self.learner = learner
        self.rule = rule
        self._lengths: list[int] = []  # the sampled lengths of the groups trained since the last step
        self.groups = 0  # how many groups have been trained since the last step

    def train(self, groups: Sequence[GroupResult]) -> dict[str, float]:
        """Add the micro-batch's summed loss to the gradients; the learner's statistics of it."""
        sampler = self.rule.steps_per_period > 1  # ratios move only after a period's first step
        batch = [TrainGroup.of(group, sampler_logprobs=sampler) for group in groups]
        stats = self.learner.train_groups(batch)
        self._lengths += sampled_tokens(batch)
        self.groups += len(batch)
        return stats

    def step(self, period: int, index: int) -> tuple[float, dict[str, float]]:
        """Step `index` of `period`: the gradients divided by the normaliser of the groups trained
        since the last step, clipped, stepped at the schedule's rate; the normaliser and the learner's
        statistics of the step."""
        normaliser = self.rule.normaliser_of(self._lengths)
        info = self.learner.step(normaliser, self.rule.lr_at(period * self.rule.steps_per_period + index))
        self._lengths, self.groups = [], 0
        return normaliser, info
