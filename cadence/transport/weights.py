"""Weights as safetensors bytes, served in bounded chunks and checked against a sha256.

Invariant: `pull_weights` returns bytes only when their sha256 equals the checksum the publisher
announced for that version; anything else raises `WeightError` naming the version and the peer.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import TypeVar

from cadence.messages import WeightChunk, WeightChunkRequest, WeightMeta, WeightQuery
from cadence.transport.endpoint import Client

T = TypeVar("T")


class WeightError(RuntimeError):
    """Weights could not be had or did not verify."""


def checksum(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class StoredVersion:
    version: int
    data: bytes
    sha256: str


class WeightStore:
    """The last `keep` published versions, each split into chunks of `chunk_bytes`."""

    def __init__(self, chunk_bytes: int, keep: int) -> None:
        self.chunk_bytes = chunk_bytes
        self.keep = keep
        self._versions: OrderedDict[int, StoredVersion] = OrderedDict()

    def put(self, version: int, data: bytes, sha256: str | None = None) -> StoredVersion:
        digest = checksum(data)
        if sha256 is not None and sha256 != digest:
            raise WeightError(f"version {version}: checksum {digest[:12]} != announced {sha256[:12]}")
        stored = StoredVersion(version, data, digest)
        self._versions[version] = stored
        while len(self._versions) > self.keep:
            self._versions.popitem(last=False)
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
        return WeightMeta(version, True, len(stored.data), stored.sha256, self.chunk_bytes, chunks)

    def chunk(self, version: int, index: int) -> WeightChunk | None:
        stored = self._versions.get(version)
        if stored is None or index < 0 or index * self.chunk_bytes >= max(len(stored.data), 1):
            return None
        start = index * self.chunk_bytes
        return WeightChunk(version, index, stored.data[start : start + self.chunk_bytes])


async def pull_weights(client: Client, version: int, timeout_s: float, window: int = 4) -> bytes:
    """Fetch `version` from the publisher behind `client`, `window` chunks in flight, and verify it."""
    await client.send(WeightQuery(version))
    meta = await _expect(client, WeightMeta, version, timeout_s)
    if not meta.available:
        raise WeightError(f"publisher {client.address} does not hold version {version}")
    parts: dict[int, bytes] = {}
    next_index = 0
    while next_index < min(window, meta.chunks):
        await client.send(WeightChunkRequest(version, next_index))
        next_index += 1
    while len(parts) < meta.chunks:
        chunk = await _expect(client, WeightChunk, version, timeout_s)
        if not 0 <= chunk.index < meta.chunks:
            raise WeightError(
                f"version {version} from {client.address}: chunk {chunk.index} of {meta.chunks}"
            )
        parts[chunk.index] = chunk.data
        if next_index < meta.chunks:
            await client.send(WeightChunkRequest(version, next_index))
            next_index += 1
    data = b"".join(parts[i] for i in range(meta.chunks))
    if len(data) != meta.nbytes or checksum(data) != meta.sha256:
        raise WeightError(f"version {version} from {client.address} failed its checksum")
    return data


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
    client: Client, version: int, data: bytes, chunk_bytes: int, timeout_s: float
) -> str:
    """Hand `version` to a publisher in another process; returns its sha256 once the publisher holds it."""
    from cadence.messages import WeightUpload

    sha = checksum(data)
    chunks = max(1, -(-len(data) // chunk_bytes))
    for index in range(chunks):
        part = data[index * chunk_bytes : (index + 1) * chunk_bytes]
        await client.send(WeightUpload(version, index, chunks, sha, part))
    await client.send(WeightQuery(version))  # answered after the upload: one peer's frames stay in order
    meta = await _expect(client, WeightMeta, version, timeout_s)
    if not meta.available or meta.sha256 != sha:
        raise WeightError(f"publisher {client.address} did not store version {version}")
    return sha
