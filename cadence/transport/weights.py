"""Weights as safetensors bytes, served in bounded chunks and checked against a digest.

Invariant: `pull_weights` returns its buffer only when the buffer has the announced size and its
`digest` (the xxh3-128 of its pieces) equals the one the publisher announced for that version; anything else raises
`WeightError` naming the version and the peer. Chunks are served as views of the stored bytes and
travel as payload frames (see `cadence.wire.messages`), so neither side copies them into messages.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from cadence.transport.endpoint import Client
from cadence.wire.buffer import Buffer
from cadence.wire.digest import Digest, digest
from cadence.wire.messages import (
    Message,
    Payload,
    WeightChunk,
    WeightChunkRequest,
    WeightMeta,
    WeightQuery,
    WeightUpload,
)
from cadence.wire.roles import upload_ticket

T = TypeVar("T")


class WeightError(RuntimeError):
    """Weights could not be had or did not verify."""


@dataclass(frozen=True)
class StoredVersion:
    version: int
    data: bytes | Buffer
    digest: str


class WeightStore:
    """The last `keep` published versions, each split into chunks of `chunk_bytes`; `evicted(data)`
    is told the bytes of a version it lets go (a `BufferPool`'s `give`)."""

    def __init__(
        self, chunk_bytes: int, keep: int, evicted: Callable[[bytes | Buffer], None] | None = None
    ) -> None:
        self.chunk_bytes = chunk_bytes
        self.keep = keep
        self.evicted = evicted
        self._versions: OrderedDict[int, StoredVersion] = OrderedDict()

    def put(self, version: int, data: bytes | Buffer, announced: str | None = None) -> StoredVersion:
        """Hold `version`; with `announced`, only if the bytes' `digest` equals it."""
        xxh = digest(data)
        if announced is not None and announced != xxh:
            raise WeightError(f"version {version}: checksum {xxh[:12]} != announced {announced[:12]}")
        stored = StoredVersion(version, data, xxh)
        self._versions[version] = stored
        while len(self._versions) > self.keep:
            _, old = self._versions.popitem(last=False)
            if self.evicted is not None and old.data is not data:
                self.evicted(old.data)
        return stored

    def get(self, version: int) -> StoredVersion | None:
        return self._versions.get(version)

    @property
    def latest(self) -> int | None:
        return next(reversed(self._versions)) if self._versions else None

    def meta(self, version: int) -> WeightMeta:
        stored = self._versions.get(version)
        if stored is None:
            return WeightMeta(version, False, 0, "", self.chunk_bytes, 0)
        chunks = max(1, -(-len(stored.data) // self.chunk_bytes))
        return WeightMeta(version, True, len(stored.data), stored.digest, self.chunk_bytes, chunks)

    def chunk(self, version: int, index: int) -> WeightChunk | None:
        stored = self._versions.get(version)
        if stored is None or index < 0 or index * self.chunk_bytes >= max(len(stored.data), 1):
            return None
        start = index * self.chunk_bytes
        return WeightChunk(version, index, memoryview(stored.data)[start : start + self.chunk_bytes])


async def query_weights(client: Client, version: int, timeout_s: float, device: bool = False) -> WeightMeta:
    """The publisher's description of `version` (where it holds it, a worker on its host maps it);
    `device`: a description of its device buffer alone will do (`WeightQuery`)."""
    await client.send(WeightQuery(version, device))
    return await _expect(client, WeightMeta, version, timeout_s)


async def pull_weights(
    client: Client,
    version: int,
    timeout_s: float,
    window: int = 4,
    alloc: Callable[[int], bytearray] | None = None,
) -> bytearray:
    """Fetch `version` from the publisher behind `client`, `window` chunks in flight, and verify it;
    with `alloc`, into the buffer `alloc(nbytes)` gives (a pool's), else into one that grows.

    Each chunk is copied once, from the received frame to the end of one buffer as soon as every chunk
    before it is in, and hashed in a worker thread, so the digest is done about when the last chunk
    arrives. The buffer is returned only once its checksum matched.
    """
    await client.send(WeightQuery(version))
    meta = await _expect(client, WeightMeta, version, timeout_s)
    if not meta.available:
        raise WeightError(f"publisher {client.address} does not hold version {version}")
    if meta.chunk_bytes <= 0 or meta.chunks != max(1, -(-meta.nbytes // meta.chunk_bytes)):
        raise WeightError(
            f"version {version} from {client.address}: {meta.chunks} chunks of {meta.chunk_bytes} bytes "
            f"cannot hold {meta.nbytes} bytes"
        )
    assembly = _Assembly(meta.nbytes, meta.chunk_bytes, None if alloc is None else alloc(meta.nbytes))
    next_index = 0
    while next_index < min(window, meta.chunks):
        await client.send(WeightChunkRequest(version, next_index))
        next_index += 1
    while assembly.received < meta.chunks:
        chunk = await _expect(client, WeightChunk, version, timeout_s)
        if not 0 <= chunk.index < meta.chunks:
            raise WeightError(
                f"version {version} from {client.address}: chunk {chunk.index} of {meta.chunks}"
            )
        size = assembly.size(chunk.index)
        if len(chunk.data) != size:
            raise WeightError(
                f"version {version} from {client.address}: chunk {chunk.index} of {len(chunk.data)} bytes,"
                f" expected {size}"
            )
        if not assembly.add(chunk.index, chunk.data):
            continue  # a duplicate, left over from an earlier pull: its request was answered already
        if next_index < meta.chunks:
            await client.send(WeightChunkRequest(version, next_index))
            next_index += 1
    if await assembly.hexdigest() != meta.digest:
        raise WeightError(f"version {version} from {client.address} failed its checksum")
    return assembly.data


class _Assembly:
    """Chunks that arrive in any order, appended to one buffer in order, and their digest.

    A new buffer grows as chunks are appended, so its pages are first touched while later chunks are
    still on the wire rather than all before the first request; a given `buffer` (of exactly the
    size, its pages touched by an earlier version) is written in place. Each appended chunk (the received
    frame, kept until then) is hashed in a worker thread, one update at a time and in order; hashlib
    releases the GIL, so the loop goes on receiving meanwhile.
    """

    def __init__(self, nbytes: int, chunk_bytes: int, buffer: bytearray | None = None) -> None:
        if buffer is not None and len(buffer) != nbytes:
            raise ValueError(f"a buffer of {len(buffer)} bytes for {nbytes}")
        self.data = bytearray() if buffer is None else buffer
        self._in_place = buffer is not None
        self._nbytes = nbytes
        self._chunk_bytes = chunk_bytes
        self._early: dict[int, Payload] = {}  # chunks that came before one they follow
        self._appended = 0  # chunks [0, _appended) are in `data`
        self._unhashed: list[Payload] = []
        self._hash = Digest()
        self._job: asyncio.Future[None] | None = None
        self.received = 0

    def size(self, index: int) -> int:
        return min(self._chunk_bytes, self._nbytes - index * self._chunk_bytes)

    def add(self, index: int, data: Payload) -> bool:
        """Take chunk `index`; False if it was already in (and nothing changes)."""
        if index < self._appended or index in self._early:
            return False
        self._early[index] = data
        self.received += 1
        while self._appended in self._early:
            part = self._early.pop(self._appended)
            if self._in_place:
                start = self._appended * self._chunk_bytes
                self.data[start : start + len(part)] = part
            else:
                self.data += part
            self._unhashed.append(part)
            self._appended += 1
        self._hash_next()
        return True

    def _hash_next(self) -> None:
        if (self._job is not None and not self._job.done()) or not self._unhashed:
            return
        parts, self._unhashed = self._unhashed, []
        self._job = asyncio.get_running_loop().run_in_executor(None, self._update, parts)
        self._job.add_done_callback(lambda _: self._hash_next())

    def _update(self, parts: list[Payload]) -> None:
        for part in parts:
            self._hash.update(part)

    async def hexdigest(self) -> str:
        """The digest of the chunks appended so far, once they are hashed."""
        while True:
            if self._job is not None and not self._job.done():
                await self._job
            elif self._unhashed:
                self._hash_next()
            else:
                return self._hash.hexdigest()


PULL_REPLIES: tuple[type[Message], ...] = (WeightMeta, WeightChunk)
"""What a pull (or an upload) takes from the publisher: a version's description and its chunks."""


async def _expect(client: Client, kind: type[T], version: int, timeout_s: float) -> T:
    while True:
        try:
            env = await asyncio.wait_for(client.recv(), timeout_s)
        except TimeoutError:
            raise WeightError(
                f"publisher {client.address} silent for {timeout_s:.1f}s while sending version {version}"
            ) from None
        msg = env.message
        if isinstance(msg, kind) and getattr(msg, "version", None) == version:
            return msg


async def upload_weights(
    client: Client, version: int, data: bytes | Buffer, chunk_bytes: int, timeout_s: float, key: str = ""
) -> str:
    """Hand `version` to a publisher in another process, each chunk with the ticket made with the
    trainer's `key`; returns its digest once the publisher holds it. The chunks are views of `data`,
    sent without copies. A publisher that has not yet been told the trainer's key (the dispatcher
    tells it after the trainer registers) refuses the chunks: the upload is sent again until it is
    stored, for up to `timeout_s`."""
    xxh = digest(data)
    chunks = max(1, -(-len(data) // chunk_bytes))
    shown = upload_ticket(key, version, chunks, xxh) if key else ""
    view = memoryview(data)
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        for index in range(chunks):
            part = view[index * chunk_bytes : (index + 1) * chunk_bytes]
            await client.send(WeightUpload(version, index, chunks, xxh, part, shown))
        await client.send(WeightQuery(version))  # answered after the upload: one peer's frames stay in order
        meta = await _expect(client, WeightMeta, version, timeout_s)
        if meta.available and meta.digest == xxh:
            return xxh
        if asyncio.get_running_loop().time() >= deadline:
            raise WeightError(f"publisher {client.address} did not store version {version}")
        await asyncio.sleep(min(0.5, timeout_s / 10))
