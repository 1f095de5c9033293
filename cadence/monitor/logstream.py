"""Log events on the wire: every actor streams its lines to the dispatcher, which keeps them for the
run's own log folder and passes them on to followers (`cadence logs --connect`).

```
 actor: structlog ─► LogStream ─► stream_logs ─ LogBatch ─► dispatcher: LogHub
                                                              ├─► logs/<actor>.jsonl (remote actors)
                                                              ├─► backlog (last N lines)
 follower ─ Subscribe(backlog) every heartbeat ──────────────►└─► LogBatch ─► follower
                                                         (the backlog's blocks: encoded once for all)
                                          (a renewal) ─► Heartbeat ─► follower
```

An actor's batches travel on its own session (`Session.beside`): the dispatcher takes them only from
a registered route, under the name that route registered with (`dispatch.checks`).

Invariant: the hub writes a batch to `logs/<actor>.jsonl` only when that actor is not already writing
the same file itself (another host, or another run folder), so no line is written twice; a follower
that stops renewing its subscription is dropped after the liveness timeout. What a hub keeps, writes
and passes on is bounded in bytes (`LogBounds`, the `monitor.log_*_bytes` settings): a line, a
batch's lines together, an actor name's lines in all, and the run's; what is beyond is dropped,
counted, and said once an actor name (`log_lines_refused`). A batch is encoded once for all its
followers, whose queues share its bytes; so is the backlog (`backlog.py`), bounded in lines and bytes
(`LogBounds.backlog`): a follower that never reads costs the hub no copy of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import structlog

from cadence.log import FileSink, LogStream, dropped_note
from cadence.monitor.backlog import Backlog
from cadence.transport.endpoint import Client, Server
from cadence.wire.messages import Heartbeat, LogBatch, Subscribe

log = structlog.get_logger()

BATCH_LINES = 2000


async def stream_logs(client: Client, stream: LogStream, interval_s: float = 0.2) -> None:
    """Send the stream's lines to the dispatcher in batches, forever; what is left goes out on cancel."""
    try:
        while True:
            await _send_all(client, stream)
            await asyncio.sleep(interval_s)
    finally:
        # best effort: the lines are in the actor's own file whatever happens here
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(_send_all(client, stream)), 1.0)


def _batches(stream: LogStream) -> Iterator[LogBatch]:
    """Everything waiting in `stream`, as batches of at most `BATCH_LINES` lines."""
    while stream.lines or stream.dropped:
        lines, dropped = stream.take(BATCH_LINES)
        yield LogBatch(stream.actor, stream.host, stream.path, lines, dropped)


async def _send_all(client: Client, stream: LogStream) -> None:
    for batch in _batches(stream):
        await client.send(batch)


def _safe_name(actor: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in actor)[:100] or "unnamed"


MAX_FILES = 1024
"""Log files of remote actors a hub opens at most: further actor names' lines are dropped."""
MAX_FOLLOWERS = 64
"""Followers a hub serves at once: a further one is not taken until another's lease ends."""


@dataclass(frozen=True)
class LogBounds:
    """What a hub takes of streamed lines, in bytes (the `monitor.log_*_bytes` settings)."""

    line: int = 64 << 10
    """The longest line (a traceback's event is a few KiB)."""
    batch: int = 4 << 20
    """A batch's lines together: the rest of a larger batch is dropped."""
    actor: int = 1 << 30
    """What it writes and passes on under one actor name in all."""
    run: int = 8 << 30
    """What it writes and passes on for all actor names together."""
    backlog: int = 64 << 20
    """What the backlog for new followers keeps of the last lines (besides its count of lines)."""


class LogHub:
    """The dispatcher's side: files for remote actors, a backlog, and the followers (each bounded)."""

    def __init__(
        self,
        server: Server,
        log_dir: Path,
        clock: Callable[[], float],
        lease_s: float,
        own: LogStream | None = None,
        backlog: int = 5000,
        bounds: LogBounds = LogBounds(),
    ) -> None:
        self.server = server
        self.bounds = bounds
        self.own = own
        self.log_dir = log_dir
        self.clock = clock
        self.lease_s = lease_s
        self.host = socket.gethostname()
        self.backlog = Backlog(server.frames_of, self.host, backlog, bounds.backlog, BATCH_LINES)
        self.followers: dict[bytes, float] = {}  # peer -> lease end
        self.files: dict[str, FileSink | None] = {}
        self.unwritable: set[str] = set()
        self._said_full: set[str] = set()
        self.bytes: dict[str, int] = {}  # what each actor name's lines took so far
        self.total = 0  # what all of them took
        self.refused = 0  # lines beyond the byte bounds
        self._said_refused: set[str] = set()

    async def batch(self, msg: LogBatch) -> None:
        msg = self._bounded(msg)
        if not msg.lines and not msg.dropped:
            return
        self._write(msg)
        self.backlog.extend(msg.lines)
        if msg.dropped:
            log.warning("log_lines_dropped", actor=msg.actor, dropped=msg.dropped)
        if self.followers:
            await self.server.send_each(list(self.followers), msg)

    async def subscribe(self, peer: bytes, sender: str, msg: Subscribe) -> None:
        new = peer not in self.followers
        if new and len(self.followers) >= MAX_FOLLOWERS:
            self._full("followers", sender)
            return
        self.followers[peer] = self.clock() + self.lease_s
        if not new:  # a renewal is answered, so a follower hears the dispatcher while no actor logs
            await self.server.send(peer, Heartbeat("dispatcher"))
            return
        log.info("log_follower_joined", peer=sender, backlog=msg.backlog)
        blocks = self.backlog.frames(msg.backlog)  # each block's frames: the same for every follower
        for frames in blocks:
            await self.server.send_frames(peer, frames)
        if not blocks:
            await self.server.send(peer, Heartbeat("dispatcher"))

    async def tick(self) -> None:
        """Pass on this process's own lines, and drop followers whose lease ran out."""
        self._expire()
        for batch in _batches(self.own) if self.own is not None else ():
            await self.batch(batch)

    def _expire(self) -> None:
        now = self.clock()
        for peer, until in list(self.followers.items()):
            if until < now:
                del self.followers[peer]
                log.info("log_follower_left", peer=peer.decode(errors="replace"))

    def _full(self, what: str, sender: str) -> None:
        """Say once that the hub holds all the `what` it may."""
        if what not in self._said_full:
            self._said_full.add(what)
            log.warning("log_hub_full", what=what, peer=sender, files=MAX_FILES, followers=MAX_FOLLOWERS)

    def _bounded(self, msg: LogBatch) -> LogBatch:
        """`msg` with only the lines within the byte bounds (`self.bounds`); the others counted."""
        b = self.bounds
        used = self.bytes.get(msg.actor, 0)
        kept: list[str] = []
        batch = 0
        for line in msg.lines:
            size = len(line.encode("utf-8", "surrogatepass"))
            if size > b.line or batch + size > b.batch or used + size > b.actor or self.total + size > b.run:
                continue
            kept.append(line)
            batch += size
            used += size
            self.total += size
        self.bytes[msg.actor] = used
        refused = len(msg.lines) - len(kept)
        if refused:
            self.refused += refused
            if msg.actor not in self._said_refused and len(self._said_refused) < MAX_FILES:
                self._said_refused.add(msg.actor)
                log.warning(
                    "log_lines_refused",
                    actor=msg.actor[:100],
                    lines=refused,
                    line_bytes=b.line,
                    batch_bytes=b.batch,
                    actor_bytes=b.actor,
                    run_bytes=b.run,
                    run_used=self.total,
                )
        return msg if not refused else LogBatch(msg.actor, msg.host, msg.path, kept, msg.dropped)

    def _write(self, msg: LogBatch) -> None:
        if msg.actor not in self.files and len(self.files) >= MAX_FILES:
            self._full("files", msg.actor)
            return
        if msg.actor not in self.files:
            own = self.log_dir / f"{_safe_name(msg.actor)}.jsonl"
            local = msg.host == self.host and Path(msg.path).resolve() == own.resolve()
            if local:
                self.files[msg.actor] = None
            else:
                try:
                    own.parent.mkdir(parents=True, exist_ok=True)
                    note = dropped_note({"actor": msg.actor, "host": msg.host})
                    self.files[msg.actor] = FileSink(own, note)
                except OSError as err:  # a full disk: these lines are lost, the next batch tries again
                    if msg.actor not in self.unwritable:
                        self.unwritable.add(msg.actor)
                        log.warning("log_file_unwritable", actor=msg.actor, path=str(own), error=str(err))
                    return
        sink = self.files[msg.actor]
        if sink is None:
            return
        for line in msg.lines:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(event, dict):
                sink.write(json.dumps(event))

    def close(self) -> None:
        for sink in self.files.values():
            if sink is not None:
                sink.close()
