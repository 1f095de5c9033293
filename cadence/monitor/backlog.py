"""The log hub's backlog: the run's last lines, kept for the followers that join, in blocks each encoded
once for all of them.

```
 extend(lines) ─► appended to the newest block (a new one past `block_lines` or `block_bytes`);
                  the oldest lines dropped past `lines` lines or `max_bytes` bytes in all
 frames(n)     ─► the messages of the last n lines, oldest first: each whole block's own encoding,
                  made at the first ask after it changed and handed to every follower after;
                  the oldest block's tail alone, if n starts inside it, encoded for this ask
```

Invariant: it holds at most `lines` lines and `max_bytes` bytes of lines; a follower is sent the last
lines it asked for, in order; every follower that asks while a block is unchanged is sent that block's
same frames, which ZeroMQ sends from the buffer without a copy (`copy=False`), so a follower that
never reads makes the hub hold no copy of the backlog of its own: at most one block's tail
(`block_bytes`) encoded for it alone.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from cadence.wire.messages import LogBatch, Payload

Encode = Callable[[LogBatch], list[Payload]]


@dataclass
class _Block:
    lines: list[str] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    start: int = 0  # lines before it are dropped
    frames: list[Payload] | None = None  # its encoding, while it holds the same lines

    @property
    def live(self) -> int:
        return len(self.lines) - self.start


class Backlog:
    """The last `lines` lines (and at most `max_bytes` of them), as `LogBatch`es from `host` encoded by
    `encode` (the server's, so they go out as they are)."""

    def __init__(
        self,
        encode: Encode,
        host: str,
        lines: int = 5000,
        max_bytes: int = 64 << 20,
        block_lines: int = 2000,
        block_bytes: int = 1 << 20,
    ) -> None:
        self.encode = encode
        self.host = host
        self.max_lines = lines
        self.max_bytes = max_bytes
        self.block_lines = block_lines
        self.block_bytes = block_bytes
        self.encodings = 0  # blocks (or tails) encoded so far
        self._blocks: deque[_Block] = deque()
        self._count = 0
        self._bytes = 0
        self._block_bytes = 0  # the newest block's

    def extend(self, lines: Iterable[str]) -> None:
        for line in lines:
            size = len(line.encode("utf-8", "surrogatepass"))
            last = self._blocks[-1] if self._blocks else None
            if (
                last is None
                or len(last.lines) >= self.block_lines
                or self._block_bytes + size > self.block_bytes
            ):
                last = _Block()
                self._blocks.append(last)
                self._block_bytes = 0
            last.lines.append(line)
            last.sizes.append(size)
            last.frames = None
            self._block_bytes += size
            self._count += 1
            self._bytes += size
        while self._count > self.max_lines or self._bytes > self.max_bytes:
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        first = self._blocks[0]
        self._count -= 1
        self._bytes -= first.sizes[first.start]
        first.start += 1
        first.frames = None
        if not first.live:
            self._blocks.popleft()
            if not self._blocks:
                self._block_bytes = 0

    def frames(self, n: int) -> list[list[Payload]]:
        """The messages of the last `n` lines (all it holds, if fewer), oldest first."""
        out: list[list[Payload]] = []
        need = min(n, self._count)
        for block in reversed(self._blocks):
            if need <= 0:
                break
            if block.live <= need:
                if block.frames is None:
                    block.frames = self._encode(block.lines[block.start :])
                out.append(block.frames)
                need -= block.live
            else:  # the oldest lines asked for start inside this block: its tail alone
                out.append(self._encode(block.lines[len(block.lines) - need :]))
                need = 0
        out.reverse()
        return out

    def _encode(self, lines: list[str]) -> list[Payload]:
        self.encodings += 1
        return self.encode(LogBatch("backlog", self.host, "", lines, 0))

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[str]:
        for block in self._blocks:
            yield from block.lines[block.start :]

    def __contains__(self, line: object) -> bool:
        return any(line == held for held in self)
