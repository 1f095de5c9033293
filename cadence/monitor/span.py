"""Timing one piece of an actor's work as a `span` log event, the unit of `cadence timeline`.

```
 with span(clock, "train", period=3, groups=2) as s:
     ...work...
 ─► log.debug("span", kind="train", start=…, end=…, period=3, groups=2) ; s.duration

 waits = Overlapping(clock, "environment", period=3)       calls that may run at once
 with waits.inside(): ...one call...    (any number, on one event loop)
 ─► log.debug("span", kind="environment", start=…, end=…, period=3, calls=n) a stretch ; waits.close()
```

Invariant: a span is logged once, when its work has ended without raising, with exactly the fields
`kind`, `start`, `end` (both read from the injected clock) and those it was given; the reader is
`monitor/pictures/spans.py`. Work that raises logs no span. `Overlapping` logs one span for each
stretch of time in which at least one of its calls runs (a call that raises counts too), with `calls`,
how many began in it; stretches never overlap, and by `close` every call's time is in one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import structlog

log = structlog.get_logger()


@dataclass
class Span:
    start: float
    end: float  # the start until the work has ended

    @property
    def duration(self) -> float:
        """Seconds from start to end (0 while the work is still going on)."""
        return self.end - self.start


@contextmanager
def span(clock: Callable[[], float], kind: str, **fields: Any) -> Iterator[Span]:
    """Measure the block with `clock`; when it ends, log the span of `kind` with `fields`."""
    begin = clock()
    timed = Span(begin, begin)
    yield timed
    timed.end = clock()
    log.debug("span", kind=kind, start=timed.start, end=timed.end, **fields)


class Overlapping:
    """Calls that may run several at once (the environment calls of a batch of episodes, from one event
    loop), logged as a span of `kind` with `fields` for each stretch in which any of them runs. Calls
    that follow one another within one turn of the event loop (steps without an await, run back to back
    by `asyncio.gather`) are one stretch: a stretch ends only once a turn of the loop passes with none
    running. `close` logs the stretch still open."""

    def __init__(self, clock: Callable[[], float], kind: str, **fields: Any) -> None:
        self.clock = clock
        self.kind = kind
        self.fields = fields
        self.running = 0
        self.calls = 0  # begun in the open stretch
        self.start: float | None = None  # of the open stretch; None: none open
        self.end = 0.0  # when its last call ended
        self._ticket = 0  # the flush that may end the open stretch; every call's start voids it

    @contextmanager
    def inside(self) -> Iterator[None]:
        """Count the block as one call (its stretch begins with it unless one is open)."""
        if self.start is None:
            self.start = self.clock()
        self.running += 1
        self.calls += 1
        self._ticket += 1
        try:
            yield
        finally:
            self.running -= 1
            if self.running == 0:
                self.end = self.clock()
                self._ticket += 1
                try:
                    asyncio.get_running_loop().call_soon(self._flush, self._ticket)
                except RuntimeError:  # no event loop: nothing can follow within its turn
                    self._flush(self._ticket)

    def _flush(self, ticket: int) -> None:
        if ticket == self._ticket and self.running == 0:
            self.close()

    def close(self) -> None:
        """Log the open stretch, if no call of it still runs."""
        if self.start is None or self.running:
            return
        log.debug("span", kind=self.kind, start=self.start, end=self.end, **self.fields, calls=self.calls)
        self.start, self.calls = None, 0
