"""Versions of the weights in a GPU's memory, for the rollout workers on the trainer's own device (CUDA
IPC): a version goes from the trainer's parameters to a worker's engine without leaving the device.

```
 publisher (the trainer's process, its learner on a CUDA device):
   take(nbytes) ─► a slot's buffer: nbytes on the device, exported once (its CUDA IPC handle), with an
      empty memfd as its lock; a slot free when no worker holds it (flock LOCK_EX|LOCK_NB succeeds)
      and it is not the newest version's; a new one while there are fewer than MAX_SLOTS, else none
      (that version reaches the workers through host memory alone)
   the version's safetensors image written into it on the device (model/device_image.py)
   write(k, buffer) ─► its digest on the device (`device_digest`, which also waits for the copies)
      ─► unlocked ─► DeviceSlot(lock, device uuid, handle, nbytes, digest), offered in k's WeightMeta
 worker (its engine on the device of that uuid, on the publisher's host):
   the lock through /proc/<pid>/fd/<fd> ─► flock LOCK_SH|LOCK_NB (refused while the slot is written)
   ─► the buffer (its handle opened once a slot and kept while the publisher holds the slot) ─► size
   and device digest equal to the DeviceSlot's ─► its tensors loaded ─► the slot held until the
   worker has loaded another version
```

Invariant: as for slots of host memory (transport/shared_memory.py): a buffer is written only under
the publisher's exclusive lock, taken only when no worker holds it; a worker holds it from before its
digest until it has loaded another version, so what it loads is what the digest names and nothing
changes under an engine computing with it. A buffer lives as long as the publisher's process (CUDA
frees it with the last process that maps it); nothing is named in any file system.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
import xxhash
from torch import Tensor

from cadence.transport.shared_memory import (
    SharedError,
    SharingImpossible,
    hold_shared,
    host_identity,
    locked_memfd,
    open_slot,
    shared_locks,
    sharing_problem,
    slot_alive,
    try_lock,
)
from cadence.wire.messages import DeviceSlot, SharedSlot, WeightMeta

MAX_SLOTS = 3
"""Device buffers a publisher keeps at most: the version the workers load, the one before (held by a
worker that has not loaded the newer yet) and one to write the next into. Each is a whole version in
the GPU's memory, so there are no more: with all held, a version goes through host memory alone."""

DIGEST_WORDS = 1 << 22
"""The 8-byte words `device_digest` mixes at a time (32 MiB, and a few temporaries of that size)."""

_MASK = (1 << 64) - 1


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


_K0, _K1, _K2 = (_signed(k) for k in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB))


def _shift(x: Tensor, bits: int) -> Tensor:
    """`x` shifted right by `bits` as unsigned 64-bit words (torch shifts int64 arithmetically)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def device_digest(buffer: Tensor) -> str:
    """The digest of a uint8 `buffer`'s bytes, computed where it lies (a GPU: no copy to the host):
    each 8-byte word (the last zero-padded) offset by its index, mixed (SplitMix64's finaliser, a
    bijection of 64-bit words), summed modulo 2**64 plainly and weighted by 2i + 1; the two sums and
    the length hashed (xxh3-128). Sums modulo 2**64 are the same in any order, so the digest is a
    pure function of the bytes, on any device; a change of any one word changes both sums."""
    n = buffer.numel()
    flat = buffer.reshape(-1)
    whole = n - n % 8
    words = flat[:whole].view(torch.int64) if whole else flat.new_zeros(0, dtype=torch.int64)
    if n % 8:
        tail = flat.new_zeros(8)
        tail[: n % 8] = flat[whole:]
        words = torch.cat([words, tail.view(torch.int64)])
    sums = torch.zeros(2, dtype=torch.int64, device=buffer.device)  # int64 wraps: modulo 2**64
    for start in range(0, words.numel(), DIGEST_WORDS):
        part = words[start : start + DIGEST_WORDS]
        index = torch.arange(start, start + part.numel(), dtype=torch.int64, device=part.device)
        x = part + index * _K0
        x = (x ^ _shift(x, 30)) * _K1
        x = (x ^ _shift(x, 27)) * _K2
        x = x ^ _shift(x, 31)
        sums += torch.stack([x.sum(), (x * (2 * index + 1)).sum()])
    plain, weighted = (int(value) & _MASK for value in sums.tolist())  # one wait for the device
    return xxhash.xxh3_128_hexdigest(struct.pack("<QQQ", plain, weighted, n))


class Exported(NamedTuple):
    """A device buffer as another process opens it (torch's CUDA IPC sharing of its storage)."""

    handle: bytes
    storage_bytes: int
    storage_offset: int
    ref_handle: bytes
    ref_offset: int
    event_handle: bytes
    event_sync: bool


def cuda_export(buffer: Tensor) -> Exported:
    """`buffer`'s storage exported for other processes (`torch.multiprocessing`'s CUDA IPC sharing)."""
    from torch.multiprocessing.reductions import reduce_tensor

    args = reduce_tensor(buffer)[1]
    handle, storage_bytes, storage_offset = args[7], args[8], args[9]
    ref_handle, ref_offset, event_handle, event_sync = args[11], args[12], args[13], args[14]
    return Exported(
        bytes(handle),
        storage_bytes,
        storage_offset,
        bytes(ref_handle),
        ref_offset,
        bytes(event_handle or b""),
        bool(event_sync),
    )


def cuda_open(slot: DeviceSlot, device: torch.device) -> Tensor:
    """The buffer `slot` names, opened on `device` (its uuid checked by the caller): uint8, its whole
    storage. `SharingImpossible` where the publisher is this very process (CUDA opens no handle of
    one's own) or the driver refuses."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    if slot.lock.pid == os.getpid():
        raise SharingImpossible("the publisher is in this process")
    try:
        return rebuild_cuda_tensor(
            torch.Tensor, torch.Size([slot.storage_bytes]), (1,), 0, torch.storage.TypedStorage,
            torch.uint8, device.index, slot.handle, slot.storage_bytes, slot.storage_offset, False,
            slot.ref_handle, slot.ref_offset, slot.event_handle or None, slot.event_sync,
        )  # fmt: skip
    except RuntimeError as err:
        raise SharingImpossible(f"CUDA IPC: {err}") from err


def indexed(device: torch.device) -> torch.device:
    """`device` with its index ("cuda" is the process's current CUDA device)."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def device_uuid(device: torch.device) -> str:
    """The device's UUID: what names one GPU in every process, whatever CUDA_VISIBLE_DEVICES numbers it."""
    return str(torch.cuda.get_device_properties(device).uuid)


def device_sharing_problem(device: torch.device) -> str | None:
    """Why versions cannot be shared on `device` (None: they can)."""
    if device.type != "cuda":
        return f"the device is {device.type}, not CUDA"
    if not torch.cuda.is_available():
        return "CUDA is not available"
    if "expandable_segments:True" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""):
        return "expandable segments (PYTORCH_CUDA_ALLOC_CONF) cannot be shared by IPC handles"
    return sharing_problem()


@dataclass
class _Slot:
    fd: int  # the lock: an empty memfd
    name: str
    inode: str
    buffer: Tensor
    exported: Exported
    version: int | None = None
    digest: str = ""


class DeviceVersions:
    """The publisher's side on `device`: at most MAX_SLOTS buffers there, each version written into a
    free one and offered while it is one of the two newest. `export`: how a buffer is opened to other
    processes (CUDA IPC); `uuid`: the device's (read from it unless given). Thread-safe."""

    def __init__(
        self,
        device: torch.device,
        host: str | None = None,
        uuid: str | None = None,
        export: Callable[[Tensor], Exported] = cuda_export,
    ) -> None:
        self.device = indexed(device)
        self.host = host_identity() if host is None else host
        self.uuid = device_uuid(self.device) if uuid is None else uuid
        self.export = export
        self.pid = os.getpid()
        self.prefix = f"cadence-device-{secrets.token_hex(8)}"
        self._made = 0
        self._slots: list[_Slot] = []  # oldest written first
        self._taken: _Slot | None = None
        self._lock = threading.Lock()
        self.reused = 0

    def take(self, nbytes: int) -> Tensor | None:
        """A buffer of `nbytes` on the device for the next version's image, to be handed to `write`;
        None when every slot is held or the newest (the version then goes through host memory)."""
        with self._lock:
            self._let_go_taken()
            slot = self._free_slot(nbytes)
            if slot is None:
                return None
            self._taken = slot
            return slot.buffer

    def write(self, version: int, buffer: Tensor) -> DeviceSlot:
        """Offer `version`, written into the buffer `take` gave (its digest computed now)."""
        with self._lock:
            slot = self._taken
            if slot is None or buffer is not slot.buffer:
                raise ValueError("a device version is written into the buffer take() gave, and only once")
            self._taken = None
            try:
                slot.digest = device_digest(slot.buffer)
            except BaseException:
                self._slots.insert(0, slot)
                fcntl.flock(slot.fd, fcntl.LOCK_UN)
                raise
            slot.version = version
            fcntl.flock(slot.fd, fcntl.LOCK_UN)
            self._slots.append(slot)
            return self._named(slot)

    def offer(self, version: int) -> DeviceSlot | None:
        """Where `version` is on the device, while it is one of the two newest written."""
        with self._lock:
            for slot in self._slots[-2:]:
                if slot.version == version:
                    return self._named(slot)
            return None

    def held(self, version: int) -> bool:
        """Whether a worker still holds `version`'s buffer."""
        with self._lock:
            inode = next((s.inode for s in self._slots if s.version == version), "")
        return bool(inode) and inode in shared_locks()

    def close(self) -> None:
        """Let every buffer go (a worker that still maps one keeps it until it lets go too)."""
        with self._lock:
            self._let_go_taken()
            for slot in self._slots:
                os.close(slot.fd)
            self._slots.clear()

    def _named(self, slot: _Slot) -> DeviceSlot:
        e = slot.exported
        lock = SharedSlot(self.host, self.pid, slot.fd, slot.name)
        return DeviceSlot(
            lock, self.uuid, e.handle, e.storage_bytes, e.storage_offset, e.ref_handle, e.ref_offset,
            e.event_handle, e.event_sync, slot.buffer.numel(), slot.digest,
        )  # fmt: skip

    def _free_slot(self, nbytes: int) -> _Slot | None:
        newest = self._slots[-1].version if self._slots else None
        for slot in self._slots:
            if slot.buffer.numel() == nbytes and slot.version != newest and try_lock(slot.fd):
                self._slots.remove(slot)
                self.reused += 1
                slot.version = None
                return slot
        if len(self._slots) >= MAX_SLOTS:
            for slot in self._slots:  # one of another size, not held: let go, to make room
                if slot.buffer.numel() != nbytes and slot.version != newest and try_lock(slot.fd):
                    self._slots.remove(slot)
                    os.close(slot.fd)
                    break
            else:
                return None
        return self._new_slot(nbytes)

    def _new_slot(self, nbytes: int) -> _Slot:
        self._made += 1
        name = f"{self.prefix}-{self._made}"
        fd, inode = locked_memfd(name, 0)
        try:
            buffer = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
            return _Slot(fd, name, inode, buffer, self.export(buffer))
        except BaseException:
            os.close(fd)
            raise

    def _let_go_taken(self) -> None:
        slot, self._taken = self._taken, None
        if slot is not None:
            fcntl.flock(slot.fd, fcntl.LOCK_UN)
            self._slots.insert(0, slot)


class HeldBuffer:
    """A version's image in a device buffer, its slot held until `release`; `data`: the image's bytes
    (uint8 on the device), unchanged until then."""

    def __init__(self, fd: int, data: Tensor, settle: Callable[[], None]) -> None:
        self.fd = fd
        self.data = data
        self.settle = settle  # waits for the device's work queued so far (a copy out of `data`)

    def release(self) -> None:
        """The slot may be written again, once what was queued on the device has read it."""
        if self.fd >= 0:
            self.settle()
            os.close(self.fd)
            self.fd = -1


class DeviceReader:
    """A worker's side on `device`: opens the buffers a publisher on this host and this GPU offers,
    keeping each opened while the publisher holds its slot. `open_buffer`: how a slot's buffer is
    opened (CUDA IPC)."""

    def __init__(
        self,
        device: torch.device,
        host: str | None = None,
        uuid: str | None = None,
        open_buffer: Callable[[DeviceSlot, torch.device], Tensor] = cuda_open,
    ) -> None:
        self.device = indexed(device)
        self.host = host_identity() if host is None else host
        self.uuid = device_uuid(self.device) if uuid is None else uuid
        self.open_buffer = open_buffer
        self._opened: dict[str, tuple[DeviceSlot, Tensor]] = {}  # by slot name

    def problem(self, slot: DeviceSlot) -> str | None:
        """Why this worker cannot take versions from `slot`'s publisher at all (None: it can)."""
        if slot.lock.host != self.host:
            return "the publisher is on another host"
        if slot.uuid != self.uuid:
            return "the publisher's version is on another device"
        return None

    def open(self, meta: WeightMeta) -> HeldBuffer:
        """The image of `meta.version`, checked against its device digest, its slot held;
        `SharedError` when it is not to be had (written again, another size, torn or stale) and
        `SharingImpossible` when this worker cannot take the publisher's buffers at all."""
        slot = meta.device
        if slot is None:
            raise SharedError(f"version {meta.version} is not offered on a device")
        problem = self.problem(slot)
        if problem is not None:
            raise SharingImpossible(problem)
        self._forget_gone()
        fd = open_slot(slot.lock, meta.version)
        try:
            hold_shared(fd, meta.version)
            data = self._buffer(slot)[: slot.nbytes]
            if data.numel() != slot.nbytes or device_digest(data) != slot.digest:
                raise SharedError(
                    f"version {meta.version}: the device buffer failed its checksum (torn or stale)"
                )
            return HeldBuffer(fd, data, self._settle)
        except BaseException:
            os.close(fd)
            raise

    def _buffer(self, slot: DeviceSlot) -> Tensor:
        kept = self._opened.get(slot.lock.name)
        if kept is not None and (kept[0].handle, kept[0].storage_offset) == (
            slot.handle,
            slot.storage_offset,
        ):
            return kept[1]
        buffer = self.open_buffer(slot, self.device)
        self._opened[slot.lock.name] = (slot, buffer)
        return buffer

    def _forget_gone(self) -> None:
        """Drop the buffers whose slots the publisher has let go."""
        for name, (slot, _) in list(self._opened.items()):
            if not slot_alive(slot.lock):
                del self._opened[name]

    def _settle(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
