"""A version's digest: the xxh3-128 of its pieces' xxh3-128, the same whole or in parts."""

from __future__ import annotations

import random
import struct

import pytest
import xxhash

from cadence.wire import digest as digests
from cadence.wire.digest import Digest, digest


@pytest.fixture
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(digests, "PIECE_BYTES", 64)
    return 64


def _by_formula(data: bytes, piece: int) -> str:
    pieces = [data[i : i + piece] for i in range(0, len(data), piece)] or [b""]
    joined = b"".join(xxhash.xxh3_128_digest(p) for p in pieces)
    return xxhash.xxh3_128_hexdigest(joined + struct.pack("<Q", len(data)))


@pytest.mark.parametrize("size", [0, 1, 63, 64, 65, 128, 1000])
def test_the_digest_is_its_formula_and_the_same_in_parts_of_any_size(small_pieces: int, size: int) -> None:
    data = random.Random(size).randbytes(size)
    whole = digest(data)
    assert whole == _by_formula(data, small_pieces)
    assert digest(bytearray(data)) == digest(memoryview(data)) == whole
    for parts in (1, 7, 64, 100):
        stream = Digest()
        for i in range(0, len(data), parts):
            stream.update(data[i : i + parts])
        assert stream.hexdigest() == whole


def test_any_changed_byte_or_length_changes_the_digest(small_pieces: int) -> None:
    data = bytearray(random.Random(0).randbytes(300))
    seen = {digest(data)}
    for at in (0, 63, 64, 200, 299):
        changed = bytearray(data)
        changed[at] ^= 1
        seen.add(digest(changed))
    seen.add(digest(data[:-1]))
    seen.add(digest(data + b"\0"))
    assert len(seen) == 8


def test_a_real_size_spreads_over_pieces_and_agrees_with_the_stream() -> None:
    data = random.Random(1).randbytes(2 * digests.PIECE_BYTES + 12345)
    stream = Digest()
    for i in range(0, len(data), 1 << 20):
        stream.update(memoryview(data)[i : i + (1 << 20)])
    assert stream.hexdigest() == digest(data) == _by_formula(data, digests.PIECE_BYTES)
