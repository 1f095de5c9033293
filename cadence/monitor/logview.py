"""`cadence logs`: the structured events of every actor of a run, merged in time order, filtered.

From a run folder (`cadence logs DIR [-f]`) it reads every `logs/*.jsonl`; from a live run anywhere
(`cadence logs --connect ADDRESS --run-id ID -f`) it subscribes to the dispatcher, which streams
every actor's events (logstream.py).

Invariant: events are printed in order of their `time` field across all actors; when following,
an event is held back `hold_s` before printing, so that one arriving a little late from another
actor still takes its place in order; filters never change the order, only what is shown.
"""

from __future__ import annotations

import asyncio
import fnmatch
import heapq
import itertools
import json
import os
import re
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from cadence.log import short_exception
from cadence.monitor.run_dir import read_new_lines

if TYPE_CHECKING:
    from cadence.transport.endpoint import Client

_SHOWN_FIRST = ("ts", "actor", "level", "event")
_HIDDEN = ("time", "host", "pid")
LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}


@dataclass(frozen=True)
class Filter:
    """Which events to show: actor name prefixes, event name patterns, a period range, a lowest level."""

    actors: tuple[str, ...] = ()
    events: tuple[str, ...] = ()
    periods: tuple[int, int] | None = None  # inclusive
    level: str = "info"

    def accepts(self, event: dict[str, Any]) -> bool:
        if LEVELS.get(str(event.get("level", "info")), 20) < LEVELS[self.level]:
            return False
        actor = str(event.get("actor", ""))
        if self.actors and not any(actor == a or actor.startswith(a) for a in self.actors):
            return False
        name = str(event.get("event", ""))
        if self.events and not any(fnmatch.fnmatchcase(name, e) for e in self.events):
            return False
        if self.periods is not None:
            period = event.get("period")
            if not isinstance(period, int) or not self.periods[0] <= period <= self.periods[1]:
                return False
        return True


def parse_periods(text: str, open_ended: bool = True) -> tuple[int, int]:
    """`7`, or `3:9` (both included); with `open_ended` also `:9` (from 0) and `3:` (to the end)."""
    match = re.fullmatch(r"\s*(\d*)\s*(?::\s*(\d*)\s*)?", text)
    if match is None or not (match.group(1) or match.group(2)):
        raise ValueError(f"periods want N or A:B, got {text!r}")
    first, last = match.group(1), match.group(2)
    colon = match.group(2) is not None
    if not open_ended and (not first or (colon and not last)):
        raise ValueError(f"periods want N or A:B, got {text!r}")
    low = int(first) if first else 0
    high = int(last) if last else (1 << 62 if colon else low)
    if high < low:
        raise ValueError(f"periods {text!r} is empty: A:B shows periods A to B, so B must not be below A")
    return low, high


def read_events(files: dict[Path, int]) -> list[dict[str, Any]]:
    """New complete lines of each file since its offset (offsets are advanced), as events."""
    events = []
    for path in sorted(files):
        new, files[path] = read_new_lines(path, files[path])
        events.extend(new)
    events.sort(key=_time)
    return events


def _time(event: dict[str, Any]) -> float:
    t = event.get("time", 0.0)
    return float(t) if isinstance(t, int | float) else 0.0


def format_event(event: dict[str, Any], as_json: bool = False) -> str:
    if as_json:
        return json.dumps(event, default=str)
    head = " ".join(str(event.get(k, "-")) for k in _SHOWN_FIRST)
    rest = " ".join(
        f"{k}={v}"
        for k, v in event.items()
        if k not in _SHOWN_FIRST and k not in _HIDDEN and k != "exception"
    )
    line = f"{head} {rest}".rstrip()
    stacks = event.get("exception")
    if isinstance(stacks, list):
        return line + "\n" + short_exception(stacks)
    if isinstance(stacks, str):  # a traceback rendered as text
        return line + "\n" + "\n".join(stacks.strip().splitlines()[-3:])
    return line


def show_logs(
    run_dir: Path,
    follow: bool,
    out: TextIO = sys.stdout,
    poll_s: float = 0.25,
    where: Filter = Filter(),
    as_json: bool = False,
) -> int:
    log_dir = run_dir / "logs"
    if not log_dir.is_dir() and not follow:
        print(f"cadence: no logs in {log_dir}", file=sys.stderr)
        return 1
    files: dict[Path, int] = {}
    held = _Held(hold_s=poll_s * 2 if follow else 0.0)
    while True:
        for path in log_dir.glob("*.jsonl") if log_dir.is_dir() else []:
            files.setdefault(path, 0)
        held.add(e for e in read_events(files) if where.accepts(e))
        lines = [format_event(e, as_json) for e in held.ready(time.time() if follow else float("inf"))]
        if lines:
            out.write("\n".join(lines) + "\n")
            out.flush()
        if not follow:
            return 0
        time.sleep(poll_s)


class _Held:
    """Events waiting `hold_s` after their own time, released in time order."""

    def __init__(self, hold_s: float) -> None:
        self.hold_s = hold_s
        self.heap: list[tuple[float, int, dict[str, Any]]] = []
        self.count = itertools.count()

    def add(self, events: Any) -> None:
        for e in events:
            heapq.heappush(self.heap, (_time(e), next(self.count), e))

    def ready(self, now: float) -> list[dict[str, Any]]:
        out = []
        while self.heap and self.heap[0][0] <= now - self.hold_s:
            out.append(heapq.heappop(self.heap)[2])
        return out


async def follow_remote(
    address: str,
    run_id: str,
    follow: bool,
    where: Filter,
    as_json: bool,
    out: TextIO = sys.stdout,
    backlog: int = 1000,
    heartbeat_s: float = 0.5,
    silence_s: float = 10.0,
    keys: Path | None = None,
) -> int:
    """Subscribe to a live run's dispatcher and print its actors' events as they come (over CURVE
    with `keys`, the run's keys folder).

    Without `follow` it prints the backlog and returns; with it, it returns 0 once the run is done
    and the dispatcher has gone quiet, or 1 when the dispatcher stays silent `silence_s` before that.
    """
    from cadence.transport.zmq_socket import ZmqNetwork
    from cadence.wire.messages import Subscribe

    net = ZmqNetwork(run_id, keys=keys)
    client = net.connect(f"logs-{socket.gethostname()}-{os.getpid()}", address)
    held = _Held(hold_s=0.5 if follow else 0.0)
    heard = time.time()
    done_at: float | None = None
    rounds = 0
    try:
        while True:
            rounds += 1
            await client.send(Subscribe(backlog))
            last, ended = await _listen(client, time.time() + heartbeat_s, where, held)
            heard, done_at = last or heard, ended or done_at
            now = time.time()
            quiet = now - heard
            finished = (not follow and rounds >= 2) or (done_at is not None and quiet >= 2.0)
            lines = [format_event(e, as_json) for e in held.ready(float("inf") if finished else now)]
            if lines:
                out.write("\n".join(lines) + "\n")
                out.flush()
            if finished:
                return 0
            if quiet > silence_s:
                print(f"cadence: dispatcher at {address} silent for {quiet:.0f}s", file=sys.stderr)
                return 1
    finally:
        net.close()


async def _listen(
    client: Client, until: float, where: Filter, held: _Held
) -> tuple[float | None, float | None]:
    """Take the dispatcher's log batches until `until`, holding the events `where` accepts: when it
    was last heard from, and when it said the run was done (None for what did not happen)."""
    from cadence.wire.messages import LogBatch

    heard: float | None = None
    done_at: float | None = None
    while (left := until - time.time()) > 0:
        try:
            env = await asyncio.wait_for(client.recv(), left)
        except TimeoutError:
            break
        heard = time.time()
        if not isinstance(env.message, LogBatch):
            continue
        for line in env.message.lines:
            event = _parse(line)
            if event is None:
                continue
            if event.get("event") == "run_done" and event.get("actor") == "dispatcher":
                done_at = heard
            if where.accepts(event):
                held.add([event])
    return heard, done_at


def _parse(line: str) -> dict[str, Any] | None:
    try:
        event = json.loads(line)
    except (json.JSONDecodeError, TypeError):
        return None
    return event if isinstance(event, dict) else None
