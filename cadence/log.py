"""Structured logs: one event name and key-value fields, to a JSON-lines file and the console.

Invariant: every event an actor logs reaches `logs/<actor>.jsonl` as one JSON object a line with
`time` (epoch seconds), `ts`, `actor`, `host`, `pid`, `level` and `event`, whatever the console shows.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import time
from collections.abc import MutableMapping
from pathlib import Path
from typing import IO, Any

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def configure_logging(actor: str, log_dir: Path | None, console_level: str = "info") -> None:
    """Send this process's structlog events to `log_dir/<actor>.jsonl` and to stderr."""
    sink: IO[str] | None = None
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        sink = open(log_dir / f"{actor}.jsonl", "a", buffering=1, encoding="utf-8")  # noqa: SIM115
    static = {"actor": actor, "host": socket.gethostname(), "pid": os.getpid()}
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
        if sink is not None:
            sink.write(json.dumps(event, default=str) + "\n")
        if _LEVELS.get(event.get("level", "info"), logging.INFO) < console_min:
            raise structlog.DropEvent
        shown = {k: v for k, v in event.items() if k not in ("time", "host", "pid")}
        return render(_, __, shown)

    structlog.configure(
        processors=[structlog.contextvars.merge_contextvars, structlog.processors.add_log_level, stamp, tee],
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
        cache_logger_on_first_use=False,
    )
