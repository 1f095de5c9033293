"""The ledger of one period's prompts: where each prompt is, and the transitions between.

```
  add(prompts) ─► QUEUED (at the back: a refill of an over-sampled period)
            assign(worker)              consume(period, ids)
  QUEUED ─────────────────► ASSIGNED ─────────────────────► CONSUMED
    ▲                          │
    └──────────────────────────┘
       requeue(worker): back to the front of the queue, in prompt order
       expire(before): the same for every prompt assigned before then (a worker that held it too long)
  QUEUED ─── consume ──► CONSUMED  (a group the trainer took from a worker declared lost meanwhile)
  QUEUED, ASSIGNED ─── stop(period) ──► STOPPED (the period has its groups: the rest is not needed)
```

Invariant: every prompt of the open period is in exactly one state, an assigned one held by exactly
one worker; the queue holds exactly the queued prompts, in the order they go out; a `consume` of
another period changes nothing; nothing survives `open` or `close` of a period; a stopped prompt is
never handed out again.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from cadence.tasks.base import Prompt


class State(enum.Enum):
    QUEUED = "queued"
    ASSIGNED = "assigned"
    CONSUMED = "consumed"
    STOPPED = "stopped"


@dataclass
class Entry:
    prompt: Prompt
    state: State = State.QUEUED
    worker: bytes | None = None  # the route of the worker holding it, while assigned
    since: float = 0.0  # when it was assigned (the caller's clock)


class Ledger:
    """The prompts of the open period (none before the first and after `close`)."""

    def __init__(self) -> None:
        self.period = -1
        self._entries: dict[int, Entry] = {}
        self._queue: deque[int] = deque()

    def open(self, period: int, prompts: Sequence[Prompt]) -> None:
        """Period `period` starts with `prompts`, all queued in their order; the last one's are gone."""
        self.period = period
        self._entries = {p.prompt_id: Entry(p) for p in prompts}
        if len(self._entries) != len(prompts):
            raise ValueError(f"period {period}: prompt ids repeat")
        self._queue = deque(p.prompt_id for p in prompts)

    def add(self, prompts: Sequence[Prompt]) -> None:
        """More prompts of the open period, queued after the others in their order."""
        if any(p.prompt_id in self._entries for p in prompts):
            raise ValueError(f"period {self.period}: prompt ids repeat")
        for p in prompts:
            self._entries[p.prompt_id] = Entry(p)
            self._queue.append(p.prompt_id)

    @property
    def issued(self) -> int:
        """The prompts the open period has queued so far, wherever they are now."""
        return len(self._entries)

    def stop(self, period: int) -> dict[bytes, list[int]]:
        """Period `period` is closed: its queued and assigned prompts are stopped. The ids each worker
        held, by its route (none for another period)."""
        if period != self.period:
            return {}
        held: dict[bytes, list[int]] = {}
        for pid, entry in sorted(self._entries.items()):
            if entry.state is State.ASSIGNED and entry.worker is not None:
                held.setdefault(entry.worker, []).append(pid)
            if entry.state in (State.QUEUED, State.ASSIGNED):
                entry.state, entry.worker = State.STOPPED, None
        self._queue.clear()
        return held

    def close(self) -> None:
        """Nothing is handed out any more: the periods are complete, or the trainer is gone."""
        self._entries.clear()
        self._queue.clear()

    @property
    def queued(self) -> int:
        return len(self._queue)

    def state(self, prompt_id: int) -> State | None:
        entry = self._entries.get(prompt_id)
        return None if entry is None else entry.state

    def held_by(self, worker: bytes) -> list[int]:
        """The ids `worker` holds, in prompt order."""
        return sorted(i for i, e in self._entries.items() if e.state is State.ASSIGNED and e.worker == worker)

    def holding(self, worker: bytes) -> int:
        """How many prompts `worker` holds."""
        return sum(1 for e in self._entries.values() if e.state is State.ASSIGNED and e.worker == worker)

    def assign(self, worker: bytes, count: int, now: float = 0.0) -> list[Prompt]:
        """The first `count` queued prompts (fewer when fewer are queued), now held by `worker` since
        `now`."""
        given: list[Prompt] = []
        while self._queue and len(given) < count:
            entry = self._entries[self._queue.popleft()]
            entry.state, entry.worker, entry.since = State.ASSIGNED, worker, now
            given.append(entry.prompt)
        return given

    def held_since(self, prompt_id: int) -> float | None:
        """When the assigned prompt `prompt_id` was handed out (None: not assigned)."""
        entry = self._entries.get(prompt_id)
        return entry.since if entry is not None and entry.state is State.ASSIGNED else None

    def expire(self, before: Callable[[bytes], float]) -> dict[bytes, list[int]]:
        """The prompts a worker was assigned before `before(worker)` go back to the front of the queue,
        in prompt order: their ids, by the route of the worker that held them."""
        cutoff = {w: before(w) for w in {e.worker for e in self._entries.values() if e.worker is not None}}
        late = sorted(
            i
            for i, e in self._entries.items()
            if e.state is State.ASSIGNED and e.worker is not None and e.since < cutoff[e.worker]
        )
        held: dict[bytes, list[int]] = {}
        for pid in late:
            entry = self._entries[pid]
            assert entry.worker is not None
            held.setdefault(entry.worker, []).append(pid)
            entry.state, entry.worker = State.QUEUED, None
        self._queue.extendleft(reversed(late))
        return held

    def consume(self, period: int, prompt_ids: Iterable[int]) -> int:
        """The trainer took these prompts of `period`: consumed, wherever they were. How many changed."""
        if period != self.period:
            return 0
        taken = 0
        for pid in prompt_ids:
            entry = self._entries.get(pid)
            if entry is None or entry.state in (State.CONSUMED, State.STOPPED):
                continue
            if entry.state is State.QUEUED:
                self._queue.remove(pid)
            entry.state, entry.worker = State.CONSUMED, None
            taken += 1
        return taken

    def requeue(self, worker: bytes) -> int:
        """What `worker` holds goes back to the front of the queue, in prompt order; how many."""
        back = self.held_by(worker)
        for pid in back:
            entry = self._entries[pid]
            entry.state, entry.worker = State.QUEUED, None
        self._queue.extendleft(reversed(back))
        return len(back)
