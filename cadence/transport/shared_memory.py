"""Versions of the weights in shared memory, for the rollout workers on the publisher's own host.

```
 publisher: take(nbytes) ─► a slot (a memfd, mode 0600) holding no kept version, mapped by no worker
            (flock LOCK_EX|LOCK_NB succeeds) and viewed by nothing in this process (no stored
            version, no frame under way), else a new slot ─► the trainer serialises the version into it
            ─► write(k, that slot): no copy (other bytes: one memcpy into a slot so taken) ─► unlocked
            ─► offer(k): SharedSlot(host, pid, fd, name) in the WeightMeta of k
 worker:    same host identity (boot id, network and pid namespaces)? ─► /proc/<pid>/fd/<fd>, whose
            link names the slot ─► flock LOCK_SH|LOCK_NB on a descriptor of its own (refused while
            the slot is rewritten) ─► the slot's mapping (kept from an earlier version of the same
            slot: its page tables are filled already) ─► size and digest equal to the WeightMeta's
            ─► tensors viewing the mapping (no copy) ─► the slot held (LOCK_SH) until the worker has
            loaded another version
```

Invariant: a slot's bytes change only under the publisher's exclusive lock, which it takes only when
no worker holds the slot; a worker holds it from before it checks the digest until it has loaded
another version. So a version a worker loads is the one the digest names, and its tensors do not
change under it. A mapping a worker keeps of a slot it no longer holds sees the slot written again;
it is used again only under the lock and after the digest (a page the worker wrote, private to it,
fails the digest: the slot is mapped afresh). Nothing is named in any file system (/dev/shm
included): a slot's memory goes with the last process that holds its descriptor or a mapping of it,
whether it ends or is killed.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import secrets
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from cadence.transport.activity import Activity
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
    inode: str = ""  # as /proc/locks names it: "<major>:<minor>:<inode>" (hexadecimal device numbers)

    def viewed(self) -> bool:
        """Whether anything of this process views the slot's bytes (a stored version, a frame under
        way, a tensor): each holds a reference to its mapping; the slot's own and the argument here
        are the two always there."""
        return sys.getrefcount(self.view) > 2

    def close(self) -> None:
        with contextlib.suppress(BufferError):  # still viewed: the mapping goes with the last view
            self.view.close()
        os.close(self.fd)


class SharedVersions:
    """The publisher's side: the last `keep` versions written, each in its own slot, offered to the
    workers on this host; slots done with are written again once no worker holds them. Thread-safe:
    the trainer takes a slot in the thread it serialises in while the publisher's loop offers."""

    def __init__(self, keep: int, host: str | None = None) -> None:
        self.keep = keep
        self.host = host_identity() if host is None else host
        self.pid = os.getpid()
        self.prefix = f"cadence-weights-{secrets.token_hex(8)}"  # every slot's name begins with it
        self._made = 0
        self._slots: list[_Slot] = []  # oldest written first
        self._taken: _Slot | None = None  # locked, being filled by the trainer
        self._lock = threading.Lock()
        self.reused = 0
        self.activity = Activity(self.prefix)  # whether the trainer computes now, named in every slot

    def take(self, nbytes: int) -> mmap.mmap:
        """A slot of `nbytes` for the next version's bytes, to be filled and handed to `write` (which
        then copies nothing); OSError when the host has no memory left for a new slot. A slot taken
        before and never written is let go."""
        with self._lock:
            self._let_go_taken()
            self._taken = self._free_slot(nbytes)
            return self._taken.view

    def write(self, version: int, data: bytes | bytearray | memoryview | mmap.mmap) -> SharedSlot:
        """Hold `version`'s bytes and return where the workers find them: the slot `take` gave, when
        `data` is it, else one copy into a free slot; OSError when the host has no memory left for a
        new slot (nothing is offered then)."""
        with self._lock:
            slot = self._taken
            if slot is not None and data is slot.view:
                self._taken = None
            else:
                self._let_go_taken()
                self._taken = slot = self._free_slot(len(data))
                if len(data):
                    slot.view[:] = data  # should it fail, the next take or write lets the slot go
                self._taken = None
            slot.version = version
            fcntl.flock(slot.fd, fcntl.LOCK_UN)
            self._slots.append(slot)
            self._trim()
            return SharedSlot(self.host, self.pid, slot.fd, slot.name, self.activity.fd)

    def offer(self, version: int) -> SharedSlot | None:
        """Where `version` is, while it is one of the kept."""
        with self._lock:
            for slot in self._slots[-self.keep :] if self.keep else ():
                if slot.version == version:
                    return SharedSlot(self.host, self.pid, slot.fd, slot.name, self.activity.fd)
            return None

    def held(self, version: int) -> bool:
        """Whether a worker still holds `version`'s slot (a shared lock on it): a worker lets a version
        go once it has loaded the next. Read from /proc/locks, not by trying a lock, which would refuse
        a worker taking the slot at that instant; False where it cannot be read."""
        with self._lock:
            inode = next((s.inode for s in self._slots if s.version == version), "")
        return bool(inode) and inode in shared_locks()

    def close(self) -> None:
        """Let every slot go (a worker still mapping one keeps its memory until it lets go too)."""
        with self._lock:
            self._let_go_taken()
            for slot in self._slots:
                slot.close()
            self._slots.clear()
            self.activity.close()

    def _free_slot(self, nbytes: int) -> _Slot:
        """A slot of `nbytes` to this process alone (locked), out of the list: one holding no version
        kept once the next is written (the newest keep - 1), else a new one."""
        newest = self._slots[max(0, len(self._slots) - self.keep + 1) :] if self.keep > 1 else []
        kept = {s.version for s in newest}
        for slot in self._slots:
            if slot.nbytes == nbytes and slot.version not in kept and not slot.viewed() and try_lock(slot.fd):
                self._slots.remove(slot)
                self.reused += 1
                slot.version = None
                return slot
        return self._new_slot(nbytes)

    def _let_go_taken(self) -> None:
        """A slot taken and never written (its filling failed) goes back to the free, unlocked."""
        slot, self._taken = self._taken, None
        if slot is not None:
            fcntl.flock(slot.fd, fcntl.LOCK_UN)
            self._slots.insert(0, slot)

    def _new_slot(self, nbytes: int) -> _Slot:
        self._made += 1
        name = f"{self.prefix}-{self._made}"
        fd, inode = locked_memfd(name, nbytes)
        try:
            view = mmap.mmap(fd, max(nbytes, 1))
        except BaseException:
            os.close(fd)
            raise
        return _Slot(fd, name, view, nbytes, inode=inode)

    def _trim(self) -> None:
        """At most `keep` + SPARE_SLOTS slots: the oldest beyond go (their workers keep their memory)."""
        while len(self._slots) > self.keep + SPARE_SLOTS:
            self._slots.pop(0).close()


def locked_memfd(name: str, nbytes: int) -> tuple[int, str]:
    """A new memfd of `nbytes` (its pages allocated now: never a SIGBUS when a write finds no memory),
    mode 0600, locked by this process alone (nobody else can know it yet); with its inode as
    /proc/locks names it ("<major>:<minor>:<inode>", hexadecimal device numbers)."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        os.fchmod(fd, 0o600)
        os.ftruncate(fd, nbytes)
        if nbytes:
            os.posix_fallocate(fd, 0, nbytes)
        fcntl.flock(fd, fcntl.LOCK_EX)
        st = os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise
    return fd, f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"


def try_lock(fd: int) -> bool:
    """The slot behind `fd` to the publisher alone, unless a worker holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def shared_locks() -> set[str]:
    """The files some process holds a shared flock on, as /proc/locks names them (empty where it
    cannot be read)."""
    try:
        with open("/proc/locks") as locks:
            lines = locks.read().splitlines()
    except OSError:
        return set()
    held = set()
    for line in lines:
        fields = line.split()  # "1: FLOCK ADVISORY READ <pid> <major>:<minor>:<inode> 0 EOF"
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[3] == "READ":
            held.add(fields[5])
    return held


class Mapped:
    """A version's bytes mapped by a worker, its slot held until `release`: the engine computes with
    `data` until then, and lets it go only once it has loaded another version. `data` is writable
    but private (copy on write): a tensor written by mistake never changes the publisher's bytes."""

    def __init__(self, fd: int, data: mmap.mmap) -> None:
        self.fd = fd  # the lock's own descriptor: the mapping's holds no lock
        self.data = data

    def release(self) -> None:
        """The slot may be written again (the worker's mapping of it may stay, to be used again)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


@dataclass
class _Kept:
    """A worker's mapping of a slot, kept for the versions the slot will hold again."""

    slot: SharedSlot
    data: mmap.mmap


class SharedReader:
    """A worker's side: maps the versions a publisher on this host offers, keeping the mappings of the
    last `mappings` slots it used (their page tables filled: mapping 538 MB afresh costs ~0.03 s)."""

    def __init__(self, host: str | None = None, mappings: int = 4) -> None:
        self.host = host_identity() if host is None else host
        self.mappings = mappings
        self._kept: dict[str, _Kept] = {}  # by slot name, the last used last

    def keeps(self, data: mmap.mmap) -> bool:  # whether `data` is a mapping kept (else let go)
        return any(kept.data is data for kept in self._kept.values())

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
        self._forget_gone()
        fd = open_slot(slot, meta.version)
        try:
            _hold_shared(fd, meta)
            return Mapped(fd, self._verified(slot, meta))
        except BaseException:
            os.close(fd)
            raise

    def _verified(self, slot: SharedSlot, meta: WeightMeta) -> mmap.mmap:
        """The slot's mapping (kept, else new) once its bytes are the version's; a kept one that fails
        (a page this worker wrote) is mapped afresh and checked again."""
        kept = self._kept.pop(slot.name, None)
        fits = kept is not None and kept.slot == slot and len(kept.data) == meta.nbytes
        if kept is not None and fits and digest(kept.data) == meta.digest:
            return self._keep(slot, kept.data)
        if kept is not None:
            _unmap(kept.data)
        data = _mapping(slot, meta)
        if digest(data) != meta.digest:
            _unmap(data)
            raise SharedError(f"version {meta.version}: the slot failed its checksum (torn or stale)")
        return self._keep(slot, data)

    def _keep(self, slot: SharedSlot, data: mmap.mmap) -> mmap.mmap:
        self._kept[slot.name] = _Kept(slot, data)
        while len(self._kept) > self.mappings:
            _unmap(self._kept.pop(next(iter(self._kept))).data)
        return data

    def _forget_gone(self) -> None:
        """Unmap the kept slots the publisher has let go (their memory goes with the last mapping)."""
        for name, kept in list(self._kept.items()):
            if not slot_alive(kept.slot):
                _unmap(self._kept.pop(name).data)


def slot_alive(slot: SharedSlot) -> bool:
    """Whether the publisher still holds the slot named (its descriptor still links to it)."""
    try:
        return os.readlink(_fd_path(slot)) == _link(slot)
    except OSError:
        return False


def _fd_path(slot: SharedSlot) -> str:
    """Where the publisher's descriptor of the slot is seen from another process."""
    return f"/proc/{slot.pid}/fd/{slot.fd}"


def _link(slot: SharedSlot) -> str:
    """What that descriptor's link reads while it is the slot named."""
    return f"/memfd:{slot.name} (deleted)"


def open_slot(slot: SharedSlot, version: int) -> int:
    """A descriptor of the slot, checked to be the one named (`SharedError` when it is gone or another)."""
    path = _fd_path(slot)
    try:
        link = os.readlink(path)
    except FileNotFoundError:
        raise SharedError(f"version {version}: its slot {path} is gone") from None
    except OSError as err:
        raise SharingImpossible(f"{path}: {err}") from err
    if link != _link(slot):
        raise SharedError(f"version {version}: {path} is {link!r}, not the slot {slot.name}")
    try:
        return os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise SharedError(f"version {version}: its slot {path} is gone") from None
    except OSError as err:
        raise SharingImpossible(f"{path}: {err}") from err


def _hold_shared(fd: int, meta: WeightMeta) -> None:
    """The slot behind `fd` locked shared, of the version's size."""
    hold_shared(fd, meta.version)
    size = os.fstat(fd).st_size
    if size != meta.nbytes or size == 0:
        raise SharedError(f"version {meta.version}: a slot of {size} bytes for {meta.nbytes}")


def hold_shared(fd: int, version: int) -> None:
    """The slot behind `fd` locked shared (`SharedError` while the publisher writes it)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise SharedError(f"version {version}: its slot is being written again") from None


def _mapping(slot: SharedSlot, meta: WeightMeta) -> mmap.mmap:
    """A private mapping of the slot through a descriptor of its own, closed once mapped (the mapping
    keeps a duplicate of it, which must hold no lock: the mapping outlives the hold)."""
    fd = open_slot(slot, meta.version)
    try:
        return mmap.mmap(fd, meta.nbytes, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)


def _unmap(data: mmap.mmap) -> None:
    with contextlib.suppress(BufferError):  # still viewed (the engine's weights): unmapped with the last
        data.close()
