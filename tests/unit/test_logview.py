"""`cadence logs` pieces: filters, period ranges, the time-ordered merge of files and late arrivals."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from cadence.log import LogStream, Throttle
from cadence.monitor.logview import Filter, _Held, format_event, parse_periods, show_logs

EVENTS: list[dict[str, Any]] = [
    {"time": 3.0, "actor": "rollout-0", "level": "debug", "event": "span", "period": 1},
    {"time": 1.0, "actor": "trainer", "level": "info", "event": "optimizer_step", "period": 0},
    {"time": 2.0, "actor": "rollout-1", "level": "warning", "event": "stale_dropped", "period": 2},
    {"time": 4.0, "actor": "dispatcher", "level": "error", "event": "peer_lost"},
]


def shown(where: Filter) -> list[str]:
    return [e["event"] for e in EVENTS if where.accepts(e)]


def test_filters_by_actor_prefix_event_pattern_period_and_level() -> None:
    assert shown(Filter()) == ["optimizer_step", "stale_dropped", "peer_lost"]  # debug hidden
    assert shown(Filter(level="debug")) == ["span", "optimizer_step", "stale_dropped", "peer_lost"]
    assert shown(Filter(actors=("rollout",), level="debug")) == ["span", "stale_dropped"]
    assert shown(Filter(actors=("rollout-1", "dispatcher"))) == ["stale_dropped", "peer_lost"]
    assert shown(Filter(events=("*_dropped", "peer_*"))) == ["stale_dropped", "peer_lost"]
    assert shown(Filter(periods=(1, 2), level="debug")) == ["span", "stale_dropped"]  # no period: out
    assert shown(Filter(level="warning")) == ["stale_dropped", "peer_lost"]


def test_period_ranges() -> None:
    assert parse_periods("7") == (7, 7)
    assert parse_periods("3:9") == (3, 9)
    assert parse_periods(":4") == (0, 4)
    assert parse_periods("5:")[0] == 5 and parse_periods("5:")[1] > 10**9
    with pytest.raises(ValueError, match="N or A:B"):
        parse_periods("x")


def test_held_events_come_out_in_time_order_after_the_hold() -> None:
    held = _Held(hold_s=1.0)
    held.add([{"time": 5.0, "n": 1}, {"time": 3.0, "n": 2}])
    assert held.ready(now=3.5) == []  # 3.0 + hold 1.0 > 3.5
    held.add([{"time": 4.0, "n": 3}])  # arrived late, still takes its place
    assert [e["n"] for e in held.ready(now=5.0)] == [2, 3]
    assert [e["n"] for e in held.ready(now=float("inf"))] == [1]


def test_show_logs_merges_files_filters_and_prints_json(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    for event in EVENTS:
        with (logs / f"{event['actor']}.jsonl").open("a") as f:
            f.write(json.dumps(event) + "\n")
    (logs / "trainer.jsonl").open("a").write('not json\n{"time": 9')  # a torn last line is skipped
    out = io.StringIO()
    assert show_logs(tmp_path, follow=False, out=out, where=Filter(level="debug")) == 0
    assert [line.split()[3] for line in out.getvalue().splitlines()] == [
        "optimizer_step",
        "stale_dropped",
        "span",
        "peer_lost",
    ]
    out = io.StringIO()
    show_logs(tmp_path, follow=False, out=out, where=Filter(events=("peer_lost",)), as_json=True)
    assert [json.loads(line) for line in out.getvalue().splitlines()] == [EVENTS[3]]
    assert format_event(EVENTS[1]).startswith("- trainer info optimizer_step period=0")


def test_a_log_stream_is_bounded_and_counts_what_it_dropped() -> None:
    stream = LogStream("trainer", "/x/trainer.jsonl", capacity=3)
    for i in range(5):
        stream.put(str(i))
    assert stream.take(2) == (["2", "3"], 2)
    assert stream.take(10) == (["4"], 0)


def test_throttle_lets_a_few_a_second_through_and_hands_on_the_count() -> None:
    now = [0.0]
    throttle = Throttle(per_second=2, clock=lambda: now[0])
    assert [throttle.allow() for _ in range(5)] == [(True, 0), (True, 0), (False, 0), (False, 0), (False, 0)]
    now[0] = 1.5
    assert throttle.allow() == (True, 3)
    assert throttle.allow() == (True, 0)
