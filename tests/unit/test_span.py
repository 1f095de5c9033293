"""The span helper logs exactly the fields `cadence timeline` reads, timed by the injected clock; calls
that may overlap (a batch's environment calls) are logged as one span a stretch in which any runs."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable

import pytest
import structlog

from cadence.monitor.span import Overlapping, span


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


def counting() -> Callable[[], float]:
    """A clock that reads 1.0, 2.0, 3.0, ...: each reading is later than the one before."""
    return itertools.count(1.0).__next__


async def test_overlapping_calls_are_one_stretch_and_a_turn_of_the_loop_without_any_ends_it() -> None:
    waits = Overlapping(counting(), "environment", period=4, eval=False)
    release = asyncio.Event()

    async def call(wait: bool) -> None:
        with waits.inside():
            if wait:
                await release.wait()

    with structlog.testing.capture_logs() as logs:
        tasks = [asyncio.create_task(call(True)) for _ in range(3)]
        await asyncio.sleep(0)  # all three inside
        assert waits.running == 3 and logs == []
        release.set()
        await asyncio.gather(*tasks)
        await asyncio.sleep(0)  # a turn of the loop with none running: the stretch is logged
        assert logs == [
            {
                "event": "span",
                "log_level": "debug",
                "kind": "environment",
                "start": 1.0,
                "end": 2.0,
                "period": 4,
                "eval": False,
                "calls": 3,
            }
        ]
        await call(False)  # a later call: a stretch of its own
        waits.close()
    assert [(e["start"], e["end"], e["calls"]) for e in logs] == [(1.0, 2.0, 3), (3.0, 4.0, 1)]


async def test_calls_run_back_to_back_by_gather_are_one_stretch() -> None:
    waits = Overlapping(counting(), "environment", period=0)

    async def call() -> None:
        with waits.inside():  # no await inside: each runs whole before the next begins
            pass

    with structlog.testing.capture_logs() as logs:
        await asyncio.gather(*(call() for _ in range(5)))
        await asyncio.sleep(0)
        await asyncio.gather(*(call() for _ in range(2)))
        waits.close()
        waits.close()  # nothing open: nothing more
    assert [(e["start"], e["end"], e["calls"]) for e in logs] == [(1.0, 6.0, 5), (7.0, 9.0, 2)]


def test_a_call_that_raises_counts_and_without_an_event_loop_each_call_is_a_stretch() -> None:
    waits = Overlapping(counting(), "environment", period=1)
    with structlog.testing.capture_logs() as logs:
        with pytest.raises(ValueError), waits.inside():
            raise ValueError("the tool failed")
        with waits.inside():
            pass
    assert [(e["kind"], e["start"], e["end"], e["calls"]) for e in logs] == [
        ("environment", 1.0, 2.0, 1),
        ("environment", 3.0, 4.0, 1),
    ]
