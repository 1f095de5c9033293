"""What the trainer reads of the run's configuration, built by `launch/settings.py`: one hop from the
config to the actor that uses it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from cadence.training.selection import Selection, SelectionRule
from cadence.training.steps import StepRule
from cadence.wire.meaning import GroupBounds


@dataclass(frozen=True)
class TrainerSettings:
    """What the trainer reads of the run's configuration (built by `launch/settings.py`); `steps`:
    what fixes each optimizer step's normaliser and rate, which the learner's side applies."""

    periods: int
    prompts_per_period: int
    mode: Literal["sync", "periodic"]
    micro_batch_tokens: int
    checkpoint_every: int
    bounds: GroupBounds  # what a group may hold (the model's token ids, the run's sizes); else refused
    steps: StepRule
    threads: int = 0  # torch threads while workers generate (0: leave the process's count)
    threads_alone: int = 0  # the period's last micro-batch, step and publish: workers idle (0: the same)
    publish_dtype: str | None = None  # versions published in this dtype (the workers'); None: the learner's
    mismatch_warn_kl: float = 0.0  # a period's engine-learner k3 above it is warned about (0: never)
    trainable_params: int = 0  # what the optimizer moves (every weight, or the adapters), for the row

    sampling: SelectionRule = SelectionRule()

    @property
    def groups_per_step(self) -> int:
        return self.prompts_per_period // self.steps.steps_per_period

    def selection(self, period: int) -> Selection:
        """Which of `period`'s groups are trained (`sampling.*`)."""
        rule = self.sampling
        stream = rule.stream or self.prompts_per_period
        return Selection(period, self.prompts_per_period, stream, rule.order, rule.filters)
