"""How long a worker may hold an assignment before another worker is given it.

```
 consume: a group took t s (assignment ─► trainer) ─► took(t): the slowest so far, and the last
                                                      RECENT times (their median: the typical group)
 held past deadline() ─────► back to the queue, for any worker (DispatchCore.expire): rollout.hold_s,
                             else 4 x the slowest group, never under `floor`
 held past early() while ──► given to that idle worker as well (DispatchCore.take_over): EARLY x the
 nothing is queued and       typical group, never under `early_floor`; None before any group is seen.
 another worker that asked   The period's prompts first, else (no eval prompt pending) an eval
 for work holds none         round's; a worker that sat on what it was given takes nothing over
```

Invariant: a period that waits only on assignments one worker sits on, while another worker asks for
work, waits at most `early()` (a few typical groups) before they are handed out again; the first
result to reach the trainer is trained, a later one dropped as a duplicate, so a re-issue costs
compute, never a group twice (an eval answer: the first is taken, a later one refused).
"""

from __future__ import annotations

import statistics
from collections import deque

RECENT = 32  # the group times the typical one is the median of
EARLY = 4.0  # an idle worker takes over what was held this many typical groups


class Hold:
    """`fixed` seconds (`rollout.hold_s`), or, with 0, 4 x the slowest group seen from its assignment
    to the trainer, never under `floor` (before any group is seen: `floor`). `early_floor`: the least
    an assignment is held before an idle worker takes it over (a liveness timeout)."""

    def __init__(self, fixed: float = 0.0, floor: float = 60.0, early_floor: float = 10.0) -> None:
        self.fixed = fixed
        self.floor = floor
        self.early_floor = early_floor
        self.slowest = 0.0
        self.recent: deque[float] = deque(maxlen=RECENT)

    def took(self, seconds: float) -> None:
        """A group reached the trainer `seconds` after its assignment."""
        self.slowest = max(self.slowest, seconds)
        self.recent.append(seconds)

    def deadline(self) -> float:
        return self.fixed if self.fixed > 0 else max(4 * self.slowest, self.floor)

    def typical(self) -> float | None:
        """The median of the last `RECENT` group times (None before any)."""
        return statistics.median(self.recent) if self.recent else None

    def early(self) -> float | None:
        """How long an assignment is held before an idle worker takes it over (None before any group
        is seen: only the hold applies)."""
        typical = self.typical()
        return None if typical is None else max(EARLY * typical, self.early_floor)
