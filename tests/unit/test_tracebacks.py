"""A failure is logged with its traceback as a structured field: whole in the JSON file, a few lines
on the console and in `cadence logs`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from cadence.launch.processes import exit_status
from cadence.log import configure_logging, one_line, short_exception
from cadence.monitor.logview import format_event


@pytest.fixture(autouse=True)
def _structlog_defaults() -> Iterator[None]:
    yield
    structlog.reset_defaults()


def _deep(n: int) -> None:
    if n == 0:
        raise TypeError("unsupported operand\nsecond line of the message")
    _deep(n - 1)


def _fail() -> None:
    try:
        _deep(10)
    except TypeError as err:
        raise RuntimeError("the actor broke") from err


def _events(log_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (log_dir / "t.jsonl").read_text().splitlines()]


def test_the_json_line_holds_the_structured_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    configure_logging("t", tmp_path)
    try:
        _fail()
    except RuntimeError:
        structlog.get_logger().error("contained", error="RuntimeError: the actor broke", exc_info=True)
    (event,) = _events(tmp_path)
    assert event["event"] == "contained" and event["error"] == "RuntimeError: the actor broke"
    raised, cause = event["exception"]
    assert raised["exc_type"] == "RuntimeError" and raised["exc_value"] == "the actor broke"
    assert cause["exc_type"] == "TypeError" and cause["is_cause"]
    assert [f["name"] for f in cause["frames"]].count("_deep") == 11
    for frame in raised["frames"] + cause["frames"]:
        assert frame["filename"].endswith(".py") and frame["lineno"] > 0 and frame["name"]
    assert "exc_info" not in event
    console = capsys.readouterr().err
    assert "contained" in console and "RuntimeError: the actor broke" in console
    assert "from TypeError: unsupported operand" in console
    assert "_deep" not in console  # the cause's frames stay in the file
    assert len(console.splitlines()) <= 5


def test_a_failing_actor_is_logged_with_its_traceback(tmp_path: Path) -> None:
    configure_logging("t", tmp_path, console_level="error")
    assert exit_status(_fail) == 1
    (event,) = _events(tmp_path)
    assert event["event"] == "actor_failed" and event["level"] == "error"
    assert event["error"] == "RuntimeError: the actor broke"
    frames = event["exception"][0]["frames"]
    assert frames[-1]["name"] == "_fail" and frames[-1]["filename"] == __file__


def test_logs_shows_a_failure_in_a_few_lines(tmp_path: Path) -> None:
    configure_logging("t", tmp_path, console_level="error")
    exit_status(_fail)
    (event,) = _events(tmp_path)
    text = format_event(event)
    head, *trace = text.splitlines()
    assert "actor_failed" in head and "error=RuntimeError: the actor broke" in head and "frames" not in head
    assert trace[-2:] == ["  RuntimeError: the actor broke", "  from TypeError: unsupported operand"]
    assert len(trace) <= 4 and "_fail" in trace[-3]
    assert json.loads(format_event(event, as_json=True))["exception"] == event["exception"]


def test_one_line_and_short_forms() -> None:
    assert one_line(ValueError("a\nb")) == "ValueError: a"
    assert one_line(ValueError()) == "ValueError"
    assert len(one_line(ValueError("x" * 1000))) == 300
    stacks = [{"exc_type": "E", "exc_value": "", "frames": [{"filename": "f.py", "lineno": 3, "name": "g"}]}]
    assert short_exception(stacks) == "  f.py:3 in g\n  E"
    assert short_exception([]) == "[]"
