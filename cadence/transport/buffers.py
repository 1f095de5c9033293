"""Large byte buffers used again, version after version, instead of allocated afresh.

A fresh 540 MB `bytearray` is mapped by glibc from new pages, and filling it faults in every page:
here 0.56 s against 0.05 s to fill one already touched. The serialised weights of each version (the
trainer) and the assembled ones (a rollout worker) are such buffers, so a pool keeps a few that are
done with and hands one back out for the next version of the same size.

Invariant: a buffer is handed out again only while the pool holds the one reference to it: a
memoryview (a chunk in a ZeroMQ frame still being sent), a tensor made by `torch.frombuffer` (a loaded
state dict's) or any other holder of it keeps it out of `take`.
"""

from __future__ import annotations

import mmap
import sys


class BufferPool:
    """At most `keep` buffers given back, for `take` to hand out again."""

    def __init__(self, keep: int = 2) -> None:
        self.keep = keep
        self._free: list[bytearray] = []
        self.reused = 0

    def take(self, nbytes: int) -> bytearray:
        """A buffer of exactly `nbytes`: a given-back one nobody else holds any more, else a new one."""
        for i in range(len(self._free)):
            # the references: the pool's list and getrefcount's argument, nothing else
            if len(self._free[i]) == nbytes and sys.getrefcount(self._free[i]) == 2:
                self.reused += 1
                return self._free.pop(i)
        return bytearray(nbytes)

    def give(self, buffer: bytes | bytearray | memoryview | mmap.mmap) -> None:
        """`buffer` is done with (its owner keeps no reference); only bytearrays are kept, the newest."""
        if isinstance(buffer, bytearray) and self.keep > 0 and all(b is not buffer for b in self._free):
            self._free.append(buffer)
            del self._free[: -self.keep]
