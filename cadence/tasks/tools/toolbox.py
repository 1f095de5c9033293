"""A turn's tool calls run: each found by name, its arguments checked against its schema, run (an
async tool awaited, a sync one on a thread so the episode's event loop stays free) within the time
the turn's step has left, and answered with its result or an error the model reads.

```
 Parsed.calls ─► for each, in order (at most max_calls):
   BadCall                  ─► "error: the call is not valid JSON (...)"                   error
   unknown name             ─► "error: unknown tool 'x'; the tools are: a, b"             error
   arguments off the schema ─► "error: argument 'a' must be an integer, got string '1'"   error
   raised ToolError         ─► "error: <its message>"                                     error
   raised another           ─► "error: ValueError: ..." (tool_failed logged, traceback)   error
   past its time            ─► "error: timed out after 4.5 s" (tool_timed_out logged)     error
   else                     ─► its value: a str as it is, anything else as JSON
 each longer than max_result_chars ─► cut, "[truncated: N characters, the first M shown]"
```

Invariant: `answer` never raises and gives one `Answer` a call, in order; a call's time is bounded by
what is left of `time_s` from the turn's start (a sync tool past it is abandoned on its thread: it
cannot be stopped, only no longer waited for).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from cadence.tasks.environments.bounds import truncate
from cadence.tasks.tools.calls import BadCall, Parsed, ToolCall
from cadence.tasks.tools.schema import Schema, Tool, argument_problem, tool

log = structlog.get_logger()


class ToolError(Exception):
    """Raised by a tool for an error the model should read and act on (a division by zero, a name not
    in a table): its message is the answer, counted as an error, logged without a traceback."""


@dataclass(frozen=True)
class Answer:
    text: str  # what the model reads as the call's tool message
    error: bool


class Toolbox:
    """The tools of an environment, by name; `max_calls` a turn, `max_result_chars` a result."""

    def __init__(
        self,
        tools: Sequence[Tool | Callable[..., Any]],
        max_calls: int = 8,
        max_result_chars: int = 4000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        made = [tool(t) for t in tools]
        self.tools = {t.name: t for t in made}
        if len(self.tools) != len(made):
            raise ValueError(f"two tools share a name: {[t.name for t in made]}")
        if not self.tools:
            raise ValueError("a toolbox needs at least one tool")
        self.max_calls = max_calls
        self.max_result_chars = max_result_chars
        self.clock = clock

    def schemas(self) -> list[Schema]:
        return [t.schema() for t in self.tools.values()]

    async def answer(self, parsed: Parsed, time_s: float) -> list[Answer]:
        """Each call of a turn answered in order, all within `time_s` from now."""
        deadline = self.clock() + time_s
        answers = []
        for call in parsed.calls[: self.max_calls]:
            answers.append(await self._one(call, deadline - self.clock()))
        if len(parsed.calls) > self.max_calls:
            skipped = len(parsed.calls) - self.max_calls
            answers.append(Answer(f"error: at most {self.max_calls} calls a turn; {skipped} not run", True))
        return answers

    async def _one(self, call: ToolCall | BadCall, time_s: float) -> Answer:
        if isinstance(call, BadCall):
            return Answer(f"error: {call.why}", True)
        found = self.tools.get(call.name)
        if found is None:
            return Answer(f"error: unknown tool {call.name!r}; the tools are: {', '.join(self.tools)}", True)
        if problem := argument_problem(found.parameters, call.arguments):
            return Answer(f"error: {found.name}: {problem}", True)
        if time_s <= 0:
            return Answer(f"error: {found.name} not run: the turn's time for tools ran out", True)
        try:
            value = await asyncio.wait_for(_run(found, call.arguments), time_s)
        except TimeoutError:
            log.warning("tool_timed_out", tool=found.name, timeout_s=round(time_s, 3))
            return Answer(f"error: {found.name} timed out after {time_s:.1f} s", True)
        except ToolError as exc:
            log.debug("tool_error", tool=found.name, why=str(exc))
            return Answer(f"error: {exc}", True)
        except Exception as exc:
            log.warning("tool_failed", tool=found.name, why=f"{type(exc).__name__}: {exc}", exc_info=True)
            return Answer(f"error: {type(exc).__name__}: {exc}", True)
        return Answer(self._text(found.name, value), False)

    def _text(self, name: str, value: object) -> str:
        try:
            text = value if isinstance(value, str) else json.dumps(value, default=str)
        except ValueError as exc:  # a circular structure
            text = f"error: the result of {name} cannot be written as JSON ({exc})"
        if len(text) > self.max_result_chars:
            log.warning("tool_result_truncated", tool=name, chars=len(text), kept=self.max_result_chars)
        return truncate(text, self.max_result_chars)


async def _run(found: Tool, arguments: dict[str, Any]) -> Any:
    if found.is_async:
        return await found.function(**arguments)
    return await asyncio.to_thread(found.function, **arguments)
