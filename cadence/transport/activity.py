"""Whether the trainer computes now, for the rollout workers on its host: one byte in shared memory.

```
 trainer's process: Activity(prefix) ─ a memfd of one page (mode 0600), named after the slots of its
                    shared versions; its byte 1 while a computation of the trainer runs
                    (MicroBatches.compute), 0 while it waits; 1 until a trainer first says so (a
                    publisher of its own process serves no trainer here); its descriptor named in
                    every SharedSlot
 worker:            a slot of that publisher mapped (same host, its checks) ─► ActivityReader: the
                    page mapped read-only through /proc/<pid>/fd/<fd>, whose link must name the
                    activity of the slot's publisher ─► busy() between two decode steps
```

Invariant: what a worker reads here chooses only how many threads it computes with, and only where
its engine computes the same bits with either count (`model/thread_invariance.py`): no sample and no
weight depends on it. A page the publisher let go, or one a worker cannot open, reads as busy (the
worker keeps its share). Nothing is named in any file system: the page goes with the last process
that holds it.
"""

from __future__ import annotations

import contextlib
import mmap
import os

from cadence.wire.messages import SharedSlot

PAGE = mmap.PAGESIZE


def activity_name(prefix: str) -> str:
    """The memfd name of the activity of the publisher whose slots begin with `prefix`."""
    return f"{prefix}-activity"


class Activity:
    """The trainer's side: `set(busy)` from any thread; `fd` is what the SharedSlots name."""

    def __init__(self, prefix: str) -> None:
        self.name = activity_name(prefix)
        self.fd = os.memfd_create(self.name, os.MFD_CLOEXEC)
        try:
            os.fchmod(self.fd, 0o600)
            os.ftruncate(self.fd, PAGE)
            self._view: mmap.mmap | None = mmap.mmap(self.fd, PAGE)
            self._view[0] = 1  # busy until a trainer says it waits
        except BaseException:
            os.close(self.fd)
            raise

    def set(self, busy: bool) -> None:
        view = self._view
        if view is None:
            return
        with contextlib.suppress(ValueError):  # closed meanwhile by the publisher's loop
            view[0] = 1 if busy else 0

    def close(self) -> None:
        view, self._view = self._view, None
        if view is not None:
            view.close()
            os.close(self.fd)


class ActivityReader:
    """A worker's view of the trainer's activity on its host (the publisher of `slot`)."""

    def __init__(self, slot: SharedSlot) -> None:
        if slot.activity is None:
            raise OSError("the publisher names no activity")
        self.pid = slot.pid
        path = f"/proc/{slot.pid}/fd/{slot.activity}"
        prefix = slot.name.rsplit("-", 1)[0]
        if os.readlink(path) != f"/memfd:{activity_name(prefix)} (deleted)":
            raise OSError(f"{path} is not the activity of {prefix}")
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            self._view = mmap.mmap(fd, PAGE, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        self.prefix = prefix

    @staticmethod
    def of(slot: SharedSlot) -> ActivityReader | None:
        """The reader of `slot`'s publisher's activity, or None where it cannot be opened."""
        try:
            return ActivityReader(slot)
        except (OSError, ValueError):
            return None

    def names(self, slot: SharedSlot) -> bool:
        """Whether `slot` comes from the publisher this reader reads."""
        return slot.pid == self.pid and slot.name.rsplit("-", 1)[0] == self.prefix

    def busy(self) -> bool:
        try:
            return self._view[0] != 0
        except ValueError:  # closed
            return True

    def close(self) -> None:
        self._view.close()
