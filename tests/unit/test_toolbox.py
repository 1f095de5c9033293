"""A turn's calls run and answered: unknown tools, wrong arguments, raising and hanging tools (async
and sync), too many calls and huge results each become a message the model reads, counted as errors."""

from __future__ import annotations

import asyncio
import threading

import pytest
import structlog

from cadence.tasks.tools.calls import BadCall, Parsed, ToolCall
from cadence.tasks.tools.toolbox import Answer, Toolbox, ToolError

pytestmark = pytest.mark.timeout(30)
RELEASE = threading.Event()


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def echo(text: str) -> str:
    """Echo a text."""
    await asyncio.sleep(0)
    return text


def divide(a: int, b: int) -> float:
    """Divide."""
    if b == 0:
        raise ToolError("division by zero")
    return a / b


def crash(x: int) -> int:
    """Raise."""
    raise KeyError(x)


async def hang() -> str:
    """Never answer."""
    await asyncio.sleep(3600)
    return ""


def block() -> str:
    """Block its thread until released."""
    RELEASE.wait(30)
    return "released"


def table() -> dict[str, object]:
    """A table."""
    return {"a": [1, 2], "b": None}


BOX = Toolbox([add, echo, divide, crash, hang, block, table], max_calls=3, max_result_chars=100)


async def answer(*calls: ToolCall | BadCall, time_s: float = 5.0) -> list[Answer]:
    return await BOX.answer(Parsed(list(calls)), time_s)


async def test_good_calls_are_answered_with_their_values_sync_and_async() -> None:
    got = await answer(
        ToolCall("add", {"a": 2, "b": 3}), ToolCall("echo", {"text": "hi"}), ToolCall("table", {})
    )
    assert got == [Answer("5", False), Answer("hi", False), Answer('{"a": [1, 2], "b": null}', False)]


async def test_every_bad_call_is_an_error_message_the_model_reads() -> None:
    with structlog.testing.capture_logs() as logs:
        got = await answer(
            ToolCall("mul", {"a": 1}),
            ToolCall("add", {"a": "2", "b": 3}),
            BadCall("the call is not valid JSON (x)"),
        )
        got += await answer(ToolCall("divide", {"a": 1, "b": 0}), ToolCall("crash", {"x": 4}))
    assert got == [
        Answer(
            "error: unknown tool 'mul'; the tools are: add, echo, divide, crash, hang, block, table", True
        ),
        Answer("error: add: argument 'a' must be an integer, got string '2'", True),
        Answer("error: the call is not valid JSON (x)", True),
        Answer("error: division by zero", True),
        Answer("error: KeyError: 4", True),
    ]
    failed = [line for line in logs if line["event"] == "tool_failed"]
    assert [(line["tool"], line["exc_info"]) for line in failed] == [("crash", True)]


async def test_a_hanging_tool_is_cut_at_the_turns_time_and_the_next_call_is_not_run() -> None:
    got = await answer(ToolCall("hang", {}), ToolCall("add", {"a": 1, "b": 1}), time_s=0.2)
    assert got[0].error and got[0].text.startswith("error: hang timed out after")
    assert got[1] == Answer("error: add not run: the turn's time for tools ran out", True)


async def test_a_blocking_sync_tool_is_cut_and_the_loop_stays_free() -> None:
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    ticker = asyncio.create_task(tick())
    try:
        (got,) = await answer(ToolCall("block", {}), time_s=0.3)
    finally:
        ticker.cancel()
        RELEASE.set()  # the abandoned thread ends
    assert got.error and got.text.startswith("error: block timed out after")
    assert ticks > 1  # the loop ran while the tool blocked its thread


async def test_calls_past_max_calls_are_not_run_and_say_so() -> None:
    got = await answer(*[ToolCall("add", {"a": i, "b": 0}) for i in range(5)])
    assert [a.text for a in got] == ["0", "1", "2", "error: at most 3 calls a turn; 2 not run"]


async def test_a_huge_result_is_cut_with_a_marker_and_logged() -> None:
    with structlog.testing.capture_logs() as logs:
        (got,) = await answer(ToolCall("echo", {"text": "y" * 50_000}))
    assert got.text == "y" * 100 + "\n[truncated: 50000 characters, the first 100 shown]"
    cut = [line for line in logs if line["event"] == "tool_result_truncated"]
    assert [(line["chars"], line["log_level"]) for line in cut] == [(50_000, "warning")]


def test_a_toolbox_refuses_duplicate_names_and_no_tools() -> None:
    with pytest.raises(ValueError, match="two tools share a name"):
        Toolbox([add, add])
    with pytest.raises(ValueError, match="at least one tool"):
        Toolbox([])
