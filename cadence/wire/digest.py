"""The two digests of weights: sha256, the identity of a saved checkpoint (summaries, `RunDone`), and
xxh3-128, a published version's identity and what every transfer is checked against (`VersionReady`,
`WeightMeta`, `WeightUpload`, `BroadcastPlan`); it costs a twentieth of sha256, off the critical path.

Invariant: both are pure functions of the safetensors bytes, so any two actors agree on them.
"""

from __future__ import annotations

import hashlib

import xxhash


def checksum(data: bytes | bytearray) -> str:
    """The sha256 of a checkpoint's weights bytes: its identity in summaries and logs."""
    return hashlib.sha256(data).hexdigest()


def digest(data: bytes | bytearray | memoryview) -> str:
    """The xxh3-128 of a version's bytes: what a transfer is checked against. It catches any corruption
    a checksum can (128 bits), at a twentieth of sha256's CPU time, which a worker would otherwise
    spend on every version; who may send at all is CURVE's business, not the checksum's."""
    return xxhash.xxh3_128_hexdigest(data)
