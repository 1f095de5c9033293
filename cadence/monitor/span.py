"""Timing one piece of an actor's work as a `span` log event, the unit of `cadence timeline`.

```
 with span(clock, "train", period=3, groups=2) as s:
     ...work...
 ─► log.debug("span", kind="train", start=…, end=…, period=3, groups=2) ; s.duration
```

Invariant: a span is logged once, when its work has ended without raising, with exactly the fields
`kind`, `start`, `end` (both read from the injected clock) and those it was given; the reader is
`monitor/pictures/spans.py`. Work that raises logs no span.
"""

from __future__ import annotations

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
