"""The weight publisher: holds the last published versions and serves them in checksummed chunks.

```
 session (transport/session.py): Register, heartbeats, until the dispatcher's Shutdown
 trainer (same process) ─ publish(k, bytes) ─► store[k] (xxh3-128 digest) ─► returns the digest
 trainer (elsewhere) ── WeightUpload(k, i/n) ─► assembled, verified ─► store[k]
 with a broadcaster: publish(k, bytes, tensors) also broadcasts k to the members (transport/broadcast.py)
 worker ─ BroadcastJoin ─► a member from the next version on
 worker ─ WeightQuery(k) ─► WeightMeta(k, size, digest, chunks) ; WeightChunkRequest(k, i) ─► WeightChunk
```

Invariant: a version is served only once complete and verified; a request for a version not held
gets `available=False`, never partial bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import structlog

from cadence.transport.endpoint import Server
from cadence.transport.session import Session
from cadence.transport.weights import WeightError, WeightStore
from cadence.wire.messages import BroadcastJoin, Payload, WeightChunkRequest, WeightQuery, WeightUpload

if TYPE_CHECKING:
    from torch import Tensor

    from cadence.transport.broadcast import BroadcastRoot

log = structlog.get_logger()


class Publisher:
    """`session`: with the dispatcher, registered as "publisher" at `server`'s address."""

    def __init__(
        self,
        server: Server,
        session: Session,
        store: WeightStore,
        broadcaster: BroadcastRoot | None = None,
    ) -> None:
        self.server = server
        self.session = session
        self.store = store
        self.broadcaster = broadcaster
        self._uploads: dict[int, dict[int, Payload]] = {}

    async def publish(self, version: int, data: bytes, tensors: Mapping[str, Tensor] | None = None) -> str:
        """Make `version` available for pulls; with a broadcaster and the `tensors`, also broadcast
        them to the members. Its digest (xxh3-128: a full sha256 would cost a 135M model a third of a
        second of the critical path; the final checkpoint's sha256 is the run's identity)."""
        stored = self.store.put(version, data)
        if self.broadcaster is not None and tensors is not None:
            await self.broadcaster.broadcast(version, tensors)
        return stored.digest

    async def run(self) -> None:
        await self.session.run(self._serve())

    async def _serve(self) -> None:
        while True:
            peer, env = await self.server.recv()
            msg = env.message
            if isinstance(msg, WeightQuery):
                await self.server.send(peer, self.store.meta(msg.version))
            elif isinstance(msg, WeightChunkRequest):
                chunk = self.store.chunk(msg.version, msg.index)
                if chunk is None:
                    log.warning("chunk_unavailable", peer=env.sender, version=msg.version, index=msg.index)
                    await self.server.send(peer, self.store.meta(msg.version))
                else:
                    await self.server.send(peer, chunk)
            elif isinstance(msg, WeightUpload):
                self._upload(env.sender, msg)
            elif isinstance(msg, BroadcastJoin):
                if self.broadcaster is None:
                    log.warning("broadcast_not_offered", peer=env.sender)
                else:
                    await self.server.send(peer, self.broadcaster.join(peer, msg.worker))
            else:
                log.warning("unexpected_message", peer=env.sender, type=msg.TAG)

    def _upload(self, sender: str, msg: WeightUpload) -> None:
        if not 0 <= msg.index < msg.chunks:
            log.warning(
                "upload_chunk_refused", peer=sender, version=msg.version, index=msg.index, chunks=msg.chunks
            )
            return
        parts = self._uploads.setdefault(msg.version, {})
        parts[msg.index] = msg.data
        if len(parts) < msg.chunks:
            return
        data = b"".join(parts[i] for i in range(msg.chunks))
        del self._uploads[msg.version]
        try:
            self.store.put(msg.version, data, msg.digest)
        except WeightError as err:
            log.error("upload_refused", peer=sender, version=msg.version, reason=str(err))
            return
        log.info("version_stored", version=msg.version, nbytes=len(data))
