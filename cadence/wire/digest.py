"""The two digests of weights: sha256, the identity of a saved checkpoint (summaries, `RunDone`), and
the pieces' xxh3-128, a published version's identity and what every transfer is checked against
(`VersionReady`, `WeightMeta`, `WeightUpload`, the slots of shared memory).

```
 bytes ─► pieces of PIECE_BYTES (the last shorter; empty bytes: one empty piece)
       ─► xxh3-128 of each (in threads, which xxhash lets run together: hashlib and xxhash release
          the GIL) ─► xxh3-128 of their 16-byte digests, in order, and the length (8 bytes, little-endian)
```

A publisher and a worker each hash a version on the critical path of every period; by pieces they
hash it on every core (538 MB: 0.034 s on one core of an AMD EPYC, 0.02-0.025 s on two). `Digest` takes
the same bytes in parts of any size (a pull's chunks) and gives the same digest.

Invariant: both are pure functions of the bytes, so any two actors agree on them.
"""

from __future__ import annotations

import functools
import hashlib
import mmap
import os
import struct
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

import xxhash

PIECE_BYTES = 1 << 24
"""The bytes of one piece: small enough that a version of a small model spreads over the threads."""

THREADS = 4
"""At most this many threads hash one buffer's pieces (memory bandwidth caps what more would give)."""


def checksum(data: bytes | bytearray | mmap.mmap) -> str:
    """The sha256 of a checkpoint's weights bytes: its identity in summaries and logs."""
    return hashlib.sha256(data).hexdigest()


def digest(data: bytes | bytearray | memoryview | mmap.mmap) -> str:
    """The digest of a version's bytes (their pieces' xxh3-128): what a transfer is checked against.
    It catches any corruption a checksum can (128 bits), at a twentieth of sha256's CPU time, which a
    worker would otherwise spend on every version; who may send at all is CURVE's business, not the
    checksum's."""
    view = memoryview(data).cast("B")
    n = len(view)
    pieces = [view[i : i + PIECE_BYTES] for i in range(0, n, PIECE_BYTES)] or [view]
    if len(pieces) == 1:
        return _combine([xxhash.xxh3_128_digest(pieces[0])], n)
    return _combine(_threads().map(xxhash.xxh3_128_digest, pieces), n)


class Digest:
    """`digest` of bytes given in parts of any size, in order (`update`), when they end (`hexdigest`)."""

    def __init__(self) -> None:
        self._pieces: list[bytes] = []
        self._piece = xxhash.xxh3_128()
        self._filled = 0  # bytes in the piece under way
        self._total = 0

    def update(self, data: bytes | bytearray | memoryview | mmap.mmap) -> None:
        view = memoryview(data).cast("B")
        while len(view):
            take = min(len(view), PIECE_BYTES - self._filled)
            self._piece.update(view[:take])
            self._filled += take
            self._total += take
            view = view[take:]
            if self._filled == PIECE_BYTES:
                self._pieces.append(self._piece.digest())
                self._piece, self._filled = xxhash.xxh3_128(), 0

    def hexdigest(self) -> str:
        last = [self._piece.digest()] if self._filled or not self._pieces else []
        return _combine([*self._pieces, *last], self._total)


def _combine(pieces: Iterable[bytes], nbytes: int) -> str:
    return xxhash.xxh3_128_hexdigest(b"".join(pieces) + struct.pack("<Q", nbytes))


@functools.cache
def _threads() -> ThreadPoolExecutor:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return ThreadPoolExecutor(max(1, min(THREADS, cores)), thread_name_prefix="digest")
