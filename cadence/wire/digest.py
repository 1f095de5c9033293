"""The two digests of a version's weights: sha256, its identity (`VersionReady`, summaries, checkpoints),
and xxh3-128, what every transfer is checked against (`WeightMeta`, `WeightUpload`, `BroadcastPlan`).

Invariant: both are pure functions of the safetensors bytes, so any two actors agree on them.
"""

from __future__ import annotations

import hashlib

import xxhash


def checksum(data: bytes | bytearray) -> str:
    """The sha256 of a version's bytes: its identity in logs, summaries and checkpoints."""
    return hashlib.sha256(data).hexdigest()


def digest(data: bytes | bytearray | memoryview) -> str:
    """The xxh3-128 of a version's bytes: what a transfer is checked against. It catches any corruption
    a checksum can (128 bits), at a twentieth of sha256's CPU time, which a worker would otherwise
    spend on every version; who may send at all is CURVE's business, not the checksum's."""
    return xxhash.xxh3_128_hexdigest(data)
