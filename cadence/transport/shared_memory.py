"""Versions of the weights in shared memory, for the rollout workers on the publisher's own host.

```
 publisher: write(k, bytes) ─► a slot (a memfd, mode 0600) holding no kept version and mapped by no
            worker (flock LOCK_EX|LOCK_NB succeeds), else a new slot ─► one memcpy ─► unlocked
            ─► offer(k): SharedSlot(host, pid, fd, name) in the WeightMeta of k
 worker:    same host identity (boot id, network and pid namespaces)? ─► /proc/<pid>/fd/<fd>, whose
            link names the slot ─► flock LOCK_SH|LOCK_NB (refused while the slot is rewritten)
            ─► size and xxh3-128 equal to the WeightMeta's ─► tensors viewing the mapping (no copy)
            ─► the slot held (LOCK_SH) until the worker has loaded another version
```

Invariant: a slot's bytes change only under the publisher's exclusive lock, which it takes only when
no worker holds the slot; a worker holds it from before it checks the digest until it has loaded
another version. So a version a worker loads is the one the digest names, and its tensors do not
change under it. Nothing is named in any file system (/dev/shm included): a slot's memory goes with
the last process that holds its descriptor or a mapping of it, whether it ends or is killed.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from cadence.wire.digest import digest
from cadence.wire.messages import SharedSlot, WeightMeta

SPARE_SLOTS = 2
"""Slots kept beyond the kept versions' (the ones some worker still held when a version was written)."""


class SharedError(RuntimeError):
    """A version could not be taken from shared memory (the worker pulls it instead)."""


class SharingImpossible(SharedError):
    """This worker cannot map the publisher's memory at all: it pulls every version."""


def host_identity() -> str:
    """The kernel and the namespaces a process reaches another's memfd through: the boot id, and the
    network and pid namespaces (a process the network sees as another host is served as one)."""
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    spaces = [str(os.stat(f"/proc/self/ns/{kind}").st_ino) for kind in ("net", "pid")]
    return "/".join([boot, *spaces])


def sharing_problem() -> str | None:
    """Why this host cannot share versions (no memfd, no /proc, a sandbox refusing either); None if it can."""
    if not hasattr(os, "memfd_create"):
        return "no memfd_create on this platform"
    try:
        host_identity()
        fd = os.memfd_create("cadence-probe", os.MFD_CLOEXEC)
        try:
            os.close(os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC))
        finally:
            os.close(fd)
    except OSError as err:
        return f"{type(err).__name__}: {err}"
    return None


@dataclass
class _Slot:
    fd: int
    name: str
    view: mmap.mmap
    nbytes: int
    version: int | None = None

    def close(self) -> None:
        self.view.close()
        os.close(self.fd)


class SharedVersions:
    """The publisher's side: the last `keep` versions written, each in its own slot, offered to the
    workers on this host; slots done with are written again once no worker holds them."""

    def __init__(self, keep: int, host: str | None = None) -> None:
        self.keep = keep
        self.host = host_identity() if host is None else host
        self.pid = os.getpid()
        self.prefix = f"cadence-weights-{secrets.token_hex(8)}"  # every slot's name begins with it
        self._made = 0
        self._slots: list[_Slot] = []  # oldest written first
        self.reused = 0

    def write(self, version: int, data: bytes | bytearray | memoryview) -> SharedSlot:
        """Hold `version`'s bytes (one copy into a slot) and return where the workers find them;
        OSError when the host has no memory left for a new slot (nothing is offered then)."""
        nbytes = len(data)
        # the versions still kept once this one is: the newest keep - 1
        newest = self._slots[max(0, len(self._slots) - self.keep + 1) :] if self.keep > 1 else []
        kept = {s.version for s in newest}
        slot = next(
            (s for s in self._slots if s.nbytes == nbytes and s.version not in kept and _lock(s)), None
        )
        if slot is None:
            slot = self._new_slot(nbytes)
        else:
            self._slots.remove(slot)
            self.reused += 1
        try:
            slot.version = None
            if nbytes:
                slot.view[:] = data
            slot.version = version
        finally:
            fcntl.flock(slot.fd, fcntl.LOCK_UN)
            self._slots.append(slot)  # written or not (then it offers no version), kept to be used again
        self._trim()
        return SharedSlot(self.host, self.pid, slot.fd, slot.name)

    def offer(self, version: int) -> SharedSlot | None:
        """Where `version` is, while it is one of the kept."""
        for slot in self._slots[-self.keep :] if self.keep else ():
            if slot.version == version:
                return SharedSlot(self.host, self.pid, slot.fd, slot.name)
        return None

    def close(self) -> None:
        """Let every slot go (a worker still mapping one keeps its memory until it lets go too)."""
        for slot in self._slots:
            slot.close()
        self._slots.clear()

    def _new_slot(self, nbytes: int) -> _Slot:
        self._made += 1
        name = f"{self.prefix}-{self._made}"
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
        try:
            os.fchmod(fd, 0o600)
            os.ftruncate(fd, nbytes)
            if nbytes:  # the pages now, or an error: never a SIGBUS when a write finds no memory
                os.posix_fallocate(fd, 0, nbytes)
            view = mmap.mmap(fd, max(nbytes, 1))
            fcntl.flock(fd, fcntl.LOCK_EX)  # new: nobody else can know it yet
        except BaseException:
            os.close(fd)
            raise
        return _Slot(fd, name, view, nbytes)

    def _trim(self) -> None:
        """At most `keep` + SPARE_SLOTS slots: the oldest beyond go (their workers keep their memory)."""
        while len(self._slots) > self.keep + SPARE_SLOTS:
            self._slots.pop(0).close()


def _lock(slot: _Slot) -> bool:
    """The slot to the publisher alone, unless a worker holds it."""
    try:
        fcntl.flock(slot.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


class Mapped:
    """A version's bytes mapped by a worker, its slot held until `release` and until nothing views
    `data` any more (the mapping keeps a duplicate of the descriptor, which shares its lock). `data`
    is writable but private (copy on write): a tensor written by mistake never changes the
    publisher's bytes."""

    def __init__(self, fd: int, data: mmap.mmap) -> None:
        self.fd = fd
        self.data = data

    def release(self) -> None:
        """The slot may be written again (the mapping goes once nothing views it)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class SharedReader:
    """A worker's side: maps the versions a publisher on this host offers."""

    def __init__(self, host: str | None = None) -> None:
        self.host = host_identity() if host is None else host

    def reaches(self, slot: SharedSlot) -> bool:
        """Whether the slot is on this host, as far as this worker can tell."""
        return slot.host == self.host

    def map(self, meta: WeightMeta) -> Mapped:
        """The bytes of `meta.version`, verified against `meta.digest`, its slot held; `SharedError`
        when they are not (being written again, another size, a torn or stale slot), and
        `SharingImpossible` when this worker cannot open the publisher's slots at all."""
        slot = meta.shared
        if slot is None or not self.reaches(slot):
            raise SharingImpossible("the publisher is on another host")
        path = f"/proc/{slot.pid}/fd/{slot.fd}"
        try:
            link = os.readlink(path)
        except FileNotFoundError:
            raise SharedError(f"version {meta.version}: its slot {path} is gone") from None
        except OSError as err:
            raise SharingImpossible(f"{path}: {err}") from err
        if link != f"/memfd:{slot.name} (deleted)":
            raise SharedError(f"version {meta.version}: {path} is {link!r}, not the slot {slot.name}")
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            raise SharedError(f"version {meta.version}: its slot {path} is gone") from None
        except OSError as err:
            raise SharingImpossible(f"{path}: {err}") from err
        try:
            return Mapped(fd, _verified(fd, meta))
        except BaseException:
            os.close(fd)
            raise


def _verified(fd: int, meta: WeightMeta) -> mmap.mmap:
    """The slot behind `fd`, locked shared, mapped and checked against `meta`."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise SharedError(f"version {meta.version}: its slot is being written again") from None
    size = os.fstat(fd).st_size
    if size != meta.nbytes or size == 0:
        raise SharedError(f"version {meta.version}: a slot of {size} bytes for {meta.nbytes}")
    data = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    if digest(memoryview(data)) != meta.digest:
        data.close()
        raise SharedError(f"version {meta.version}: the slot failed its checksum (torn or stale)")
    return data
