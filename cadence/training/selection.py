"""Which of a period's arriving groups are trained: each is resolved, kept or filtered
(`cadence.training.filters`), in the order `sampling.order` says, until the period has its B kept
groups or every prompt it could issue is resolved.

```
 arrive(group) ─► order = "arrival": resolved now
               ─► order = "prompt":  held until every prompt before it (by its index in the period's
                                     prompt stream, id - period x stream) is resolved, then resolved
 resolve ─► a filter throws it away ─► (group, reason): consumed, counted, never trained
         ─► kept ─► (group, None): trained; the B-th kept closes the period
 closed ─► a group still held, or arriving later, is stopped: never trained
 every prompt of the stream resolved with fewer than B kept ─► closed short: the period steps with
                                                               the groups it kept
```

Invariant: with `order = "prompt"` the kept groups are the first B kept ones in prompt order whatever
the arrival order, so sync and periodic runs train the same groups; a group is resolved at most once,
and none after the period closes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

from cadence.training.filters import Filters
from cadence.wire.messages import GroupResult

Verdict = tuple[GroupResult, str | None]
"""A resolved group, and the filter that threw it away (None: kept, to be trained)."""


@dataclass(frozen=True)
class SelectionRule:
    """What the trainer reads of `[sampling]` (built by `launch/settings.py`): `stream`, the prompts a
    period may issue (0: B, no over-sampling), `order`, and the `filters`."""

    stream: int = 0
    order: Literal["arrival", "prompt"] = "arrival"
    filters: Filters = field(default_factory=Filters)


class Selection:
    """The groups of `period`: `batch` (B) are trained; `stream`: the prompts the period may issue (its
    prompt ids are period x stream + index, index < stream)."""

    def __init__(
        self,
        period: int,
        batch: int,
        stream: int,
        order: Literal["arrival", "prompt"] = "arrival",
        filters: Filters | None = None,
    ) -> None:
        self.period = period
        self.batch = batch
        self.stream = stream
        self.order = order
        self.filters = filters or Filters()
        self.kept = 0
        self.filtered: Counter[str] = Counter()
        self.resolved = 0
        self.closed = batch <= 0
        self._held: dict[int, GroupResult] = {}  # prompt order: arrived, waiting for an earlier prompt
        self._next = 0  # prompt order: the index resolved next

    @property
    def short(self) -> bool:
        """Closed with fewer than B kept groups: every prompt it could issue was resolved."""
        return self.closed and self.kept < self.batch

    def index(self, group: GroupResult) -> int:
        """The group's place in the period's prompt stream."""
        return group.prompt_id - self.period * self.stream

    def arrive(self, group: GroupResult) -> list[Verdict]:
        """The verdicts this arrival settles, in the order they are settled (none once closed)."""
        if self.closed:
            return []
        index = self.index(group)
        if self.order == "arrival" or not 0 <= index < self.stream:
            return self._resolve(group)
        self._held[index] = group
        out: list[Verdict] = []
        while not self.closed and self._next in self._held:
            out += self._resolve(self._held.pop(self._next))
            self._next += 1
        return out

    def held(self) -> list[GroupResult]:
        """The groups arrived and not resolved (prompt order): once closed, the stopped ones."""
        return [self._held[i] for i in sorted(self._held)]

    def _resolve(self, group: GroupResult) -> list[Verdict]:
        reason = self.filters.reason(group)
        self.resolved += 1
        if reason is None:
            self.kept += 1
        else:
            self.filtered[reason] += 1
        self.closed = self.kept >= self.batch or self.resolved >= self.stream
        return [(group, reason)]
