"""`cadence logs DIR [-f]`: the JSON-lines logs of every actor of a run, merged in time order.

Invariant: events are printed in order of their `time` field across all actors' files; with
`follow`, lines appended later are printed as they appear, each file read from where it was left.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, TextIO

from cadence.run_dir import read_new_lines

_SHOWN_FIRST = ("ts", "actor", "level", "event")
_HIDDEN = ("time", "host", "pid")


def read_events(files: dict[Path, int]) -> list[dict[str, Any]]:
    """New complete lines of each file since its offset (offsets are advanced), as events."""
    events = []
    for path in sorted(files):
        new, files[path] = read_new_lines(path, files[path])
        events.extend(new)
    events.sort(key=lambda e: e.get("time", 0.0))
    return events


def format_event(event: dict[str, Any]) -> str:
    head = " ".join(str(event.get(k, "-")) for k in _SHOWN_FIRST)
    rest = " ".join(f"{k}={v}" for k, v in event.items() if k not in _SHOWN_FIRST and k not in _HIDDEN)
    return f"{head} {rest}".rstrip()


def show_logs(run_dir: Path, follow: bool, out: TextIO = sys.stdout, poll_s: float = 0.25) -> int:
    log_dir = run_dir / "logs"
    if not log_dir.is_dir() and not follow:
        print(f"cadence: no logs in {log_dir}", file=sys.stderr)
        return 1
    files: dict[Path, int] = {}
    while True:
        for path in log_dir.glob("*.jsonl") if log_dir.is_dir() else []:
            files.setdefault(path, 0)
        for event in read_events(files):
            print(format_event(event), file=out, flush=True)
        if not follow:
            return 0
        time.sleep(poll_s)
