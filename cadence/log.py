"""Structured logs: one event name and key-value fields, to a JSON-lines file and the console.

Invariant: every event an actor logs reaches `logs/<actor>.jsonl` as one JSON object a line with
`time` (epoch seconds), `ts`, `actor`, `host`, `pid`, `level` and `event`, whatever the console shows;
with a `LogStream`, the same line is also queued for the dispatcher (bounded: the oldest lines give
way and are counted when nobody drains it). A line the disk refuses (full, or gone) is dropped and
counted, never raised into the actor: once lines go through again, a `log_lines_dropped` line says how
many went (`FileSink`), so a full disk costs log lines first, never the actor. An event logged with `exc_info=True` (or `log.exception`)
carries its traceback as the structured field `exception` (structlog's dict tracebacks: a list of
exceptions, the one caught first and then those it came from, each with `exc_type`, `exc_value` and `frames` of `filename`,
`lineno`, `name`); the console shows it short: the last frames and the exception line.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import sys
import time
from collections import deque
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import Any

import structlog

# events a peer can provoke at will: a few a second reach the log, the rest are counted
THROTTLED = (
    "unexpected_message",
    "message_from_unregistered_peer",
    "agent_call_refused",
    "registration_deferred",
)

# frames of the raised exception the console (and `cadence logs`) shows; the JSON keeps them all
SHORT_FRAMES = 2

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


class LogStream:
    """This process's log lines waiting to be sent to the dispatcher."""

    def __init__(self, actor: str, path: str, capacity: int = 50_000) -> None:
        self.actor = actor
        self.host = socket.gethostname()
        self.path = path
        self.lines: deque[str] = deque(maxlen=capacity)
        self.dropped = 0

    def put(self, line: str) -> None:
        if len(self.lines) == self.lines.maxlen:
            self.dropped += 1
        self.lines.append(line)

    def take(self, limit: int) -> tuple[list[str], int]:
        """Up to `limit` lines, oldest first, and the count dropped since the last take."""
        out = [self.lines.popleft() for _ in range(min(limit, len(self.lines)))]
        dropped, self.dropped = self.dropped, 0
        return out, dropped


class FileSink:
    """A JSON-lines log file that never fails its writer: each line is one `os.write` on an appended
    file; a line the disk refuses is dropped and counted (`dropped`), and once one goes through again
    a line made by `note(count)` is written first. The first refusal is said once on stderr."""

    def __init__(self, path: Path, note: Callable[[int], str]) -> None:
        self.path = path
        self.note = note
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.dropped = 0  # lines refused since the last one that went through
        self.dropped_total = 0
        self.torn = False  # a line went out in part: the next one starts on a line of its own
        self.error = ""

    def write(self, line: str) -> bool:
        """Append `line` (one JSON object, without its newline); whether it was written."""
        if self.dropped and not self._put(self.note(self.dropped)):
            return self._refused()
        self.dropped = 0
        return self._put(line) or self._refused()

    def _refused(self) -> bool:
        if not self.dropped_total:
            print(f"cadence: {self.path}: cannot write ({self.error}): log lines are dropped and counted"
                  " until it can", file=sys.stderr)  # fmt: skip
        self.dropped += 1
        self.dropped_total += 1
        return False

    def _put(self, line: str) -> bool:
        data = (("\n" if self.torn else "") + line + "\n").encode()
        done = 0
        try:
            while done < len(data):
                done += os.write(self.fd, data[done:])
        except OSError as err:
            self.error = os.strerror(err.errno or errno.EIO)
            self.torn = self.torn or done > 0
            return False
        self.torn = False
        return True

    def close(self) -> None:
        os.close(self.fd)


def dropped_note(static: dict[str, Any]) -> Callable[[int], str]:
    """The `log_lines_dropped` line of an actor's log file (its fields as every event's)."""

    def note(count: int) -> str:
        now = time.time()
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1e3):03d}Z"
        event = {"event": "log_lines_dropped", "dropped": count, "level": "warning", "time": now, "ts": ts}
        return json.dumps({**event, **static})

    return note


def configure_logging(
    actor: str, log_dir: Path | None, console_level: str = "info", stream: LogStream | None = None
) -> None:
    """Send this process's structlog events to `log_dir/<actor>.jsonl`, to stderr, and to `stream`."""
    static = {"actor": actor, "host": socket.gethostname(), "pid": os.getpid()}
    sink: FileSink | None = None
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        sink = FileSink(log_dir / f"{actor}.jsonl", dropped_note(static))
    console_min = _LEVELS[console_level]
    render = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())

    def stamp(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        now = time.time()
        event.setdefault("time", now)
        event.setdefault(
            "ts", time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1e3):03d}Z"
        )
        for key, value in static.items():
            event.setdefault(key, value)
        return event

    def tee(_: Any, __: str, event: MutableMapping[str, Any]) -> str:
        line = json.dumps(event, default=str)
        if sink is not None:
            sink.write(line)
        if stream is not None:
            stream.put(line)
        if _LEVELS.get(event.get("level", "info"), logging.INFO) < console_min:
            raise structlog.DropEvent
        shown = {k: v for k, v in event.items() if k not in ("time", "host", "pid")}
        if isinstance(shown.get("exception"), list):
            shown["exception"] = short_exception(shown["exception"])
        return render(_, __, shown)

    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            throttled(),
            stamp,
            structlog.processors.ExceptionRenderer(
                structlog.tracebacks.ExceptionDictTransformer(show_locals=False, use_rich=False)
            ),
            tee,
        ],
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
        cache_logger_on_first_use=False,
    )


def throttled() -> Callable[[Any, str, MutableMapping[str, Any]], MutableMapping[str, Any]]:
    """A processor that lets a few `THROTTLED` events a second through, counting the rest (`suppressed`)."""
    throttles = {name: Throttle() for name in THROTTLED}

    def throttle(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        limit = throttles.get(event.get("event", ""))
        if limit is not None:
            shown, held = limit.allow()
            if not shown:
                raise structlog.DropEvent
            if held:
                event["suppressed"] = held
        return event

    return throttle


def one_line(exc: BaseException, limit: int = 300) -> str:
    """An exception as a one-line `error` field: its type and the first line of its message (the
    whole message and the traceback go in `exception`, with `exc_info=True`)."""
    lines = str(exc).strip().splitlines()
    return (f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__)[:limit]


def short_exception(stacks: list[dict[str, Any]], frames: int = SHORT_FRAMES) -> str:
    """A structured traceback in a few lines, each indented (so a reader of one event a line can skip
    them): the last `frames` frames of the exception raised, its type and first line, then a line for
    each exception it came from."""
    if not stacks or not isinstance(stacks[0], dict):
        return str(stacks)
    lines = []
    for frame in (stacks[0].get("frames") or [])[-frames:]:
        lines.append(f"  {frame.get('filename')}:{frame.get('lineno')} in {frame.get('name')}")
    for i, stack in enumerate(stacks):
        value = str(stack.get("exc_value", "")).strip().splitlines()
        head = f"{stack.get('exc_type')}: {value[0]}" if value else str(stack.get("exc_type"))
        lines.append(f"  {head}" if i == 0 else f"  from {head}")
    return "\n".join(lines)


class Throttle:
    """At most `per_second` events a second get through; the rest are counted, and the count is
    handed to the next one that does (so a flood costs a few log lines a second, and loses no count)."""

    def __init__(self, per_second: int = 5, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_second = per_second
        self.clock = clock
        self._window = -1e9
        self._in_window = 0
        self._suppressed = 0

    def allow(self) -> tuple[bool, int]:
        """Whether to log this one, and how many were held back before it."""
        now = self.clock()
        if now - self._window >= 1.0:
            self._window, self._in_window = now, 0
        self._in_window += 1
        if self._in_window > self.per_second:
            self._suppressed += 1
            return False, 0
        held, self._suppressed = self._suppressed, 0
        return True, held
