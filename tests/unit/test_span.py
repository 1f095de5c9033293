"""The span helper logs exactly the fields `cadence timeline` reads, timed by the injected clock."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import structlog

from cadence.monitor.span import span


def ticking(*times: float) -> Callable[[], float]:
    readings = iter(times)
    return lambda: next(readings)


def test_a_span_logs_kind_start_end_and_its_fields_and_knows_its_duration() -> None:
    clock = ticking(10.0, 12.5)
    with structlog.testing.capture_logs() as logs, span(clock, "train", period=3, groups=2) as timed:
        assert timed.duration == 0.0  # still going on
    assert logs == [
        {
            "event": "span",
            "log_level": "debug",
            "kind": "train",
            "start": 10.0,
            "end": 12.5,
            "period": 3,
            "groups": 2,
        }
    ]
    assert (timed.start, timed.end, timed.duration) == (10.0, 12.5, 2.5)


def test_work_that_raises_logs_no_span() -> None:
    clock = ticking(1.0, 2.0)
    with (
        structlog.testing.capture_logs() as logs,
        pytest.raises(ValueError),
        span(clock, "publish", period=0, version=1),
    ):
        raise ValueError("publish failed")
    assert logs == []
