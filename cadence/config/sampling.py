"""The `[sampling]` section: over-sampled periods, the groups that teach nothing filtered out as they
arrive, and the rest of a period stopped once it has its B kept groups.

Invariant: with `oversample = 0` and no filter a period issues exactly its B prompts, as a run without
this section does (the same prompts, ids and samples); every prompt a period issues, kept or thrown
away, is generated with that period's weights. No torch here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from cadence.config.fields import Rule, doc

BUILT_IN_FILTERS = ("zero_variance", "reward_range")
"""The filters `sampling.filters` names without a module (`cadence.training.filters`)."""


@dataclass(frozen=True)
class SamplingConfig:
    """A period's prompts beyond its B trained groups. `oversample` more are queued with the B; a
    group is filtered as it reaches the trainer (`filters`): consumed, counted, written to the samples
    with its reason, never trained, and not counted toward B; when too few are left to reach B, the
    dispatcher draws more, up to `ceiling` x B prompts; once B groups are kept the period closes and
    its other prompts are stopped, queued or half generated. See docs/how-it-works.md."""

    oversample: float = doc(
        0.0,
        "prompts queued with a period's B beyond it, as a share of B (0.25: B/4 more, rounded up); the"
        " first B groups kept close the period and the rest are stopped",
        Rule(ge=0, finite=True),
    )
    filters: list[str] = doc(
        [],
        "group filters, applied to a group as it arrives: zero_variance (every reward equal: no"
        " gradient), reward_range (mean reward outside sampling.reward_range), or a function"
        " `package.module:function` taking a `cadence.training.filters.GroupOutcome` and returning"
        " True to keep the group",
    )
    reward_range: list[float] = doc(
        [0.0, 1.0], "reward_range filter: a group is kept when its mean reward lies in [low, high]"
    )
    ceiling: float = doc(
        3.0,
        "with over-sampling or a filter: the most prompts a period issues, refills included, as a"
        " multiple of B; a period still short of B kept groups then steps with those it kept",
        Rule(ge=1, finite=True),
    )
    order: Literal["arrival", "prompt"] = doc(
        "arrival",
        "which groups are kept, and the order they are trained in: arrival (the first B kept groups to"
        " arrive, trained as they come, together with whatever came while the trainer was busy: fastest,"
        " favours prompts whose groups end early, and two runs part in their last bits, then in their"
        " samples) or prompt (the first B kept in prompt order, with or without over-sampling: a group is"
        " trained once every earlier prompt is resolved, the micro-batches cut by"
        " trainer.micro_batch_tokens and the step's share alone; a run is reproducible bit for bit"
        " whatever the workers and their timing, and sync and periodic give the same weights)",
    )

    @property
    def on(self) -> bool:
        """Whether a period may issue more prompts than its B."""
        return self.oversample > 0 or bool(self.filters)

    def extra(self, batch: int) -> int:
        """The prompts queued beyond the period's `batch` at its start."""
        return math.ceil(self.oversample * batch - 1e-9)

    def issued_at_most(self, batch: int) -> int:
        """The prompts a period of `batch` may issue in all: its prompt stream's length."""
        if not self.on:
            return batch
        return max(math.ceil(self.ceiling * batch - 1e-9), batch + self.extra(batch))
