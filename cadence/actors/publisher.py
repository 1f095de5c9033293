"""The weight publisher: holds the last published versions and serves them in checksummed chunks.

```
 session (transport/session.py): Register, heartbeats, until the dispatcher's Shutdown
 trainer (same process) ─ buffer(n): a slot of shared memory (else a pool's) to serialise k into
                       ─ publish(k, bytes) ─► store[k] (its digest) ─► returns the digest
 dispatcher ─ TrainerKey(key) ─► uploads must carry tickets made with it (wire/roles.py)
 trainer (elsewhere) ── WeightUpload(k, i/n, ticket) ─► the ticket? the sizes? (else refused)
                        ─► assembled, verified ─► store[k]; partial uploads: at most
                        weights.max_upload_bytes together, each freed after a liveness of silence
 with a broadcaster: publish(k, bytes, tensors) also broadcasts k to the members (transport/broadcast.py)
 with shared versions: store[k] held in the slot it was serialised into (transport/shared_memory.py;
                       other bytes, an upload's, copied into one), named in k's WeightMeta for the
                       workers on this host to map
 with device versions (the trainer's tensors on a GPU): publish(k, bytes, tensors) also writes k's
                       image into a buffer on that GPU (transport/device_memory.py), named in k's
                       WeightMeta for the workers on the same device; or, first, publish_on_device(k,
                       tensors): k's image written there, announced at once; its host bytes copied
                       from that image and stored in the background; meanwhile a WeightQuery(k,
                       device) is answered with the device buffer alone, any other once they are in
 worker ─ BroadcastJoin ─► a member from the next version on
 worker ─ WeightQuery(k) ─► WeightMeta(k, size, digest, chunks) ; WeightChunkRequest(k, i) ─► WeightChunk
```

Invariant: a version is served only once complete and verified, and uploaded only by the registered
trainer; a request for a version not held gets `available=False`, never partial bytes.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import msgspec
import structlog

from cadence.transport.endpoint import Server
from cadence.transport.session import Session
from cadence.transport.weights import WeightError, WeightStore
from cadence.wire.buffer import Buffer
from cadence.wire.meaning import upload_problem
from cadence.wire.messages import (
    BroadcastJoin,
    Envelope,
    Message,
    Payload,
    TrainerKey,
    WeightChunkRequest,
    WeightQuery,
    WeightUpload,
)
from cadence.wire.roles import valid_ticket

if TYPE_CHECKING:
    from torch import Tensor

    from cadence.model.safetensors_bytes import Layout
    from cadence.transport.broadcast import BroadcastRoot
    from cadence.transport.device_memory import DeviceVersions
    from cadence.transport.shared_memory import SharedVersions

log = structlog.get_logger()


@dataclass(frozen=True)
class PublisherSettings:
    """What the publisher reads of the run's configuration (built by `launch/settings.py`): partial
    uploads together hold at most `max_upload_bytes`, and one silent for `upload_timeout_s` is freed."""

    max_upload_bytes: int = 64 << 30
    upload_timeout_s: float = 10.0


@dataclass
class _Partial:
    """An upload under way: its chunks so far, their bytes, and when the last came."""

    chunks: int
    digest: str
    parts: dict[int, Payload] = field(default_factory=dict)
    nbytes: int = 0
    last: float = 0.0


class Publisher:
    """`session`: with the dispatcher, registered as "publisher" at `server`'s address; `shared`:
    where each version is also written for the workers on this host (None: the host cannot share,
    or `weights.share_on_host` is off); `device`: where each version is also written for the
    workers on the trainer's GPU, in `device_dtype` (None: the trainer is not on one, or it cannot
    share)."""

    HANDLERS: ClassVar[Mapping[type[Message], Callable[[Publisher, bytes, str, Any], Awaitable[None]]]]
    """The handler of every message type its server takes (set below the class)."""
    SESSION_HANDLERS: ClassVar[Mapping[type[Message], Callable[[Publisher, Any], None]]]
    """What it takes from the dispatcher on its session, beside `Session.TAKES`."""

    def __init__(
        self,
        server: Server,
        session: Session,
        store: WeightStore,
        broadcaster: BroadcastRoot | None = None,
        settings: PublisherSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
        shared: SharedVersions | None = None,
        alloc: Callable[[int], bytearray] = bytearray,
        device: DeviceVersions | None = None,
        device_dtype: str | None = None,
    ) -> None:
        self.server = server
        self.shared = shared
        self.device, self.device_dtype = device, device_dtype
        self._device_layout: Layout | None = None  # where the tensors go in a device image
        self.alloc = alloc
        self.session = session
        self.store = store
        self.broadcaster = broadcaster
        self.settings = settings or PublisherSettings()
        self.clock = clock
        self.trainer_key = ""  # told by the dispatcher: uploads must carry tickets made with it
        self._uploads: dict[int, _Partial] = {}
        self._storing: dict[int, asyncio.Event] = {}  # versions on the device, their host bytes not in yet
        self._host: asyncio.Task[None] | None = None  # storing the last version's host bytes
        self._held: set[asyncio.Task[None]] = set()  # queries answered once the host bytes are in
        for kind, handler in self.SESSION_HANDLERS.items():
            session.on(kind, functools.partial(handler, self))

    def _told(self, msg: TrainerKey) -> None:
        if msg.key != self.trainer_key:
            self._uploads.clear()  # a new trainer: what the old one left half done is void
        self.trainer_key = msg.key

    async def publish(
        self, version: int, data: Buffer | bytes, tensors: Mapping[str, Tensor] | None = None
    ) -> str:
        """Make `version` available for pulls; with a broadcaster and the `tensors`, also broadcast
        them to the members; with device versions and the `tensors`, also write them on their GPU.
        Its digest (xxh3-128 by pieces: a full sha256 would cost a 135M model a third of a
        second of the critical path; the final checkpoint's sha256 is the run's identity)."""
        await self.stored()
        stored = self.store.put(version, data)
        self._share(version, data)
        if self.device is not None and tensors is not None:
            await asyncio.to_thread(self._share_device, version, tensors)
        if self.broadcaster is not None and tensors is not None:
            await self.broadcaster.broadcast(version, tensors)
        return stored.digest

    async def publish_on_device(self, version: int, tensors: Mapping[str, Tensor]) -> int | None:
        """Make `version` available on the tensors' GPU first, for it to be announced at once: its
        image written there (the workers on that device take it now), its host bytes copied from
        that image, stored and shared in the background (the other workers are answered once they
        are in). Its size; None when it is not on the device (no device versions, a broadcast to
        feed, every buffer held): then `publish` it as usual."""
        await self.stored()
        if self.device is None or self.broadcaster is not None:
            return None
        image = await asyncio.to_thread(self._share_device, version, tensors)
        if image is None:
            return None
        done = self._storing[version] = asyncio.Event()
        self._host = asyncio.create_task(self._store_image(version, image, done))
        return image.numel()

    async def stored(self) -> None:
        """Until the host bytes of the last version published on the device first are stored (what
        failed there raised here)."""
        task, self._host = self._host, None
        if task is not None:
            await task

    async def _store_image(self, version: int, image: Tensor, done: asyncio.Event) -> None:
        begin = self.clock()
        try:
            data = await asyncio.to_thread(self._host_bytes, image)
            self.store.put(version, data)
            self._share(version, data)
            log.info(
                "version_stored", version=version, nbytes=len(data), host_s=round(self.clock() - begin, 4)
            )
        except Exception as err:  # said now; raised to the trainer by its next publish (`stored`)
            log.error("version_store_failed", version=version, error=repr(err))
            raise
        finally:
            del self._storing[version]
            done.set()

    def _host_bytes(self, image: Tensor) -> Buffer:
        from cadence.model.device_image import copy_to_host

        data = self.buffer(image.numel())
        copy_to_host(image, data)
        return data

    def buffer(self, nbytes: int) -> Buffer:
        """Where the trainer serialises the next version (from its computing thread): a slot of shared
        memory while the publisher shares, so `publish` offers it to the workers on this host without
        a copy; else (or where the host has no memory left for a slot) `alloc`'s buffer."""
        shared = self.shared
        if shared is not None:
            try:
                return shared.take(nbytes)
            except OSError as err:
                self._stop_sharing(err, version=None)
        return self.alloc(nbytes)

    def held(self, version: int) -> bool:
        """Whether a worker on this host still holds `version` in shared memory (it lets a version go
        once it has loaded the next one)."""
        shared = self.shared
        return shared is not None and shared.held(version)

    def computing(self, busy: bool) -> None:
        """Tell the workers on this host whether the trainer computes now (from any thread): there
        they may take the cores it leaves (`transport/activity.py`)."""
        shared = self.shared
        if shared is not None:
            shared.activity.set(busy)

    def _share(self, version: int, data: Buffer | bytes) -> None:
        """Write `version` for the workers on this host too (no copy when `data` is the slot `buffer`
        gave); where the host has no memory left for it, stop sharing (one line): every worker pulls
        from then on."""
        if self.shared is None:
            return
        try:
            self.shared.write(version, data)
        except OSError as err:
            self._stop_sharing(err, version)

    def _share_device(self, version: int, tensors: Mapping[str, Tensor]) -> Tensor | None:
        """Write `version`'s image on the tensors' GPU for the workers there: the image (None: every
        buffer is held, the workers map it from host memory); where that fails (no device memory
        left), stop (one line): the workers there map every version from host memory from then on."""
        from cadence.model.checkpoint import tensors_layout
        from cadence.model.device_image import image_nbytes, write_image

        device = self.device
        if device is None:
            return None
        try:
            layout = self._device_layout  # the same tensors version after version: laid out once
            if layout is None or not layout.holds(tensors):
                layout = self._device_layout = tensors_layout(tensors, self.device_dtype)
            buffer = device.take(image_nbytes(layout))
            if buffer is None:
                log.debug("device_buffers_held", version=version)
                return None
            device.write(version, write_image(layout, buffer))
            return buffer
        except Exception as err:  # no device memory left (torch.OutOfMemoryError), a driver's refusal
            self.device = None
            log.warning("device_sharing_failed", version=version, error=str(err), fallback="shm")
            device.close()
            return None

    def _stop_sharing(self, err: OSError, version: int | None) -> None:
        shared, self.shared = self.shared, None
        if shared is not None:
            log.warning("shared_memory_failed", version=version, error=str(err), fallback="zmq")
            shared.close()

    async def run(self) -> None:
        try:
            await self.session.run(self._serve(), self._sweep())
        finally:
            if self.shared is not None:
                self.shared.close()
            if self.device is not None:
                self.device.close()

    async def _serve(self) -> None:
        while True:
            peer, env = await self.server.recv()
            try:
                await self._handle(peer, env)
            except Exception as exc:  # contained to this message: the publisher goes on
                log.error(
                    "message_failed", peer=env.sender, type=env.message.TAG, error=repr(exc), exc_info=True
                )

    async def _handle(self, peer: bytes, env: Envelope) -> None:
        msg = env.message
        handler = self.HANDLERS.get(type(msg))
        if handler is None:
            self.server.refuse(
                env.sender, "stranger", msg, f"a stranger may not send {msg.TAG} to the publisher"
            )
            return
        await handler(self, peer, env.sender, msg)

    async def _on_query(self, peer: bytes, sender: str, msg: WeightQuery) -> None:
        storing = self._storing.get(msg.version)
        if storing is not None:  # on the device, not yet in host memory
            on_device = self.device.offer(msg.version) if msg.device and self.device is not None else None
            if on_device is None:
                task = asyncio.create_task(self._answer_stored(peer, sender, msg, storing))
                self._held.add(task)
                task.add_done_callback(self._held.discard)
                return
            meta = self.store.meta(msg.version)
            await self.server.send(
                peer, msgspec.structs.replace(meta, nbytes=on_device.nbytes, device=on_device)
            )
            return
        meta = self.store.meta(msg.version)
        slot = None if self.shared is None or not meta.available else self.shared.offer(msg.version)
        if slot is not None:
            meta = msgspec.structs.replace(meta, shared=slot)
        on_device = None if self.device is None or not meta.available else self.device.offer(msg.version)
        if on_device is not None:
            meta = msgspec.structs.replace(meta, device=on_device)
        await self.server.send(peer, meta)

    async def _answer_stored(self, peer: bytes, sender: str, msg: WeightQuery, stored: asyncio.Event) -> None:
        await stored.wait()
        try:
            await self._on_query(peer, sender, msg)
        except Exception as exc:  # contained to this query, as in `_serve`
            log.error("message_failed", peer=sender, type=msg.TAG, error=repr(exc), exc_info=True)

    async def _on_chunk_request(self, peer: bytes, sender: str, msg: WeightChunkRequest) -> None:
        chunk = self.store.chunk(msg.version, msg.index)
        if chunk is None:
            log.warning("chunk_unavailable", peer=sender, version=msg.version, index=msg.index)
            await self.server.send(peer, self.store.meta(msg.version))
        else:
            await self.server.send(peer, chunk)

    async def _on_join(self, peer: bytes, sender: str, msg: BroadcastJoin) -> None:
        if self.broadcaster is None:
            log.warning("broadcast_not_offered", peer=sender)
        else:
            await self.server.send(peer, self.broadcaster.join(peer, msg.worker))

    async def _on_upload(self, peer: bytes, sender: str, msg: WeightUpload) -> None:
        if not valid_ticket(self.trainer_key, msg.ticket, "upload", msg.version, msg.chunks, msg.digest):
            reason = "no ticket of the registered trainer" if self.trainer_key else "no trainer known yet"
            self.server.refuse(sender, "stranger", msg, reason)
            return
        problem = upload_problem(msg, self.store.chunk_bytes, self.settings.max_upload_bytes)
        partial = self._uploads.get(msg.version)
        if partial is not None and (partial.chunks, partial.digest) != (msg.chunks, msg.digest):
            del self._uploads[msg.version]  # the trainer started this version over
            partial = None
        held = sum(p.nbytes for p in self._uploads.values()) + len(msg.data)
        if problem is None and held > self.settings.max_upload_bytes:
            problem = f"partial uploads would hold {held} bytes, more than {self.settings.max_upload_bytes}"
        if problem is not None:
            self._uploads.pop(msg.version, None)
            self.server.refuse(sender, "trainer", msg, problem)
            return
        if partial is None:
            partial = self._uploads[msg.version] = _Partial(msg.chunks, msg.digest)
        partial.nbytes += len(msg.data) - len(partial.parts.get(msg.index, b""))
        partial.parts[msg.index] = msg.data
        partial.last = self.clock()
        if len(partial.parts) == partial.chunks:
            self._complete(sender, msg.version, partial)

    def _complete(self, sender: str, version: int, partial: _Partial) -> None:
        data = b"".join(partial.parts[i] for i in range(partial.chunks))
        del self._uploads[version]
        try:
            self.store.put(version, data, partial.digest)
        except WeightError as err:
            log.error("upload_refused", peer=sender, version=version, reason=str(err))
            return
        self._share(version, data)
        log.info("version_stored", version=version, nbytes=len(data))

    async def _sweep(self) -> None:
        """Free every partial upload silent for `upload_timeout_s`."""
        while True:
            await asyncio.sleep(self.settings.upload_timeout_s / 4)
            now = self.clock()
            for version, partial in list(self._uploads.items()):
                if now - partial.last > self.settings.upload_timeout_s:
                    del self._uploads[version]
                    log.warning(
                        "upload_abandoned",
                        version=version,
                        chunks=len(partial.parts),
                        of=partial.chunks,
                        nbytes=partial.nbytes,
                    )


Publisher.HANDLERS = {
    WeightQuery: Publisher._on_query,
    WeightChunkRequest: Publisher._on_chunk_request,
    WeightUpload: Publisher._on_upload,
    BroadcastJoin: Publisher._on_join,
}
Publisher.SESSION_HANDLERS = {TrainerKey: Publisher._told}
