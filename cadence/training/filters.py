"""Group filters: which arriving groups a period trains, decided before any training from what the
group's samples earned (`sampling.filters`).

```
 zero_variance ─► every reward of the group equal: its advantages are all 0, it carries no gradient
                  (DAPO's dynamic sampling)
 reward_range ──► its mean reward outside [low, high] (too easy, too hard)
 package.module:function ─► the user's: function(GroupOutcome) -> bool, True keeps the group
```

Invariant: a filter sees only the group's outcome (rewards, correctness, sampled lengths, endings),
never the weights, so the verdict on a group is the same whoever applies it, whenever; a group is
filtered by the first filter (in `sampling.filters` order) that throws it away, and that filter's name
is its reason; a user's filter that raises, or returns something other than a bool, is logged with its
traceback and keeps the group (a broken filter must not empty the periods).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import structlog

from cadence.config.targets import load_callable
from cadence.wire.messages import GroupResult
from cadence.wire.rows import per_sample

log = structlog.get_logger()


@dataclass(frozen=True)
class GroupOutcome:
    """What a filter sees of one group, one entry a sample: `rewards` and `correct` as scored,
    `lengths` its sampled tokens (an episode's model tokens, not the environment's), `truncated` whether
    it was cut at its token limit rather than ended, `endings` why each episode ended (empty for a
    single-turn group)."""

    period: int
    prompt_id: int
    rewards: tuple[float, ...]
    correct: tuple[float, ...]
    lengths: tuple[int, ...]
    truncated: tuple[bool, ...]
    endings: tuple[str, ...] = ()

    @classmethod
    def of(cls, group: GroupResult) -> GroupOutcome:
        n = len(group.rewards)
        masks = group.masks or [[1] * len(c) for c in group.completions]
        cut = per_sample([int(t) for t in group.truncated], group.episode_of, n) if group.truncated else []
        truncated = tuple(c > 0 for c in cut) if cut else (False,) * n
        lengths = per_sample([sum(mask) for mask in masks], group.episode_of, n)  # an episode's rows'
        endings = tuple(group.episodes.endings) if group.episodes is not None else ()
        return cls(
            period=group.period,
            prompt_id=group.prompt_id,
            rewards=tuple(group.rewards),
            correct=tuple(group.correct),
            lengths=tuple(lengths),
            truncated=truncated,
            endings=endings,
        )


GroupFilter = Callable[[GroupOutcome], bool]
"""A filter: True keeps the group."""


def zero_variance(outcome: GroupOutcome) -> bool:
    """Keep a group whose rewards differ: one whose rewards are all equal has no advantage to learn."""
    return len(set(outcome.rewards)) > 1


def reward_range(low: float, high: float) -> GroupFilter:
    """Keep a group whose mean reward lies in [low, high]."""

    def keeps(outcome: GroupOutcome) -> bool:
        mean = sum(outcome.rewards) / len(outcome.rewards)
        return low <= mean <= high

    return keeps


def load_filter(name: str, key: str = "sampling.filters") -> GroupFilter:
    """The user's filter `package.module:function`; `ConfigError` naming it when it does not load."""
    return load_callable(name, key, name, "a function")


class Filters:
    """The run's filters by name, in order (`named`: (reason, filter) pairs)."""

    def __init__(self, named: Sequence[tuple[str, GroupFilter]] = ()) -> None:
        self.named = list(named)

    @classmethod
    def of(cls, names: Sequence[str], low_high: Sequence[float] = (0.0, 1.0)) -> Filters:
        """The filters `sampling.filters` names (a user's imported now: a bad name fails the start)."""
        built: list[tuple[str, GroupFilter]] = []
        for name in names:
            if name == "zero_variance":
                built.append((name, zero_variance))
            elif name == "reward_range":
                built.append((name, reward_range(low_high[0], low_high[1])))
            else:
                built.append((name, load_filter(name)))
        return cls(built)

    def __bool__(self) -> bool:
        return bool(self.named)

    def reason(self, group: GroupResult) -> str | None:
        """The name of the first filter that throws `group` away, or None: the group is kept."""
        if not self.named:
            return None
        outcome = GroupOutcome.of(group)
        for name, keeps in self.named:
            try:
                verdict = keeps(outcome)
                if not isinstance(verdict, bool):
                    raise TypeError(f"returned {type(verdict).__name__}, not a bool")
            except Exception as exc:
                log.error(
                    "filter_failed",
                    filter=name,
                    period=group.period,
                    prompt_id=group.prompt_id,
                    error=repr(exc),
                    exc_info=True,
                )
                continue
            if not verdict:
                return name
        return None
