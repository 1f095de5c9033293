"""The log hub's backlog: the last lines in order, bounded in lines and bytes, each unchanged block
encoded once and the same frames handed to every follower."""

from __future__ import annotations

from cadence.monitor.backlog import Backlog
from cadence.wire.messages import LogBatch, Payload, decode_frames, encode_frames


def _encode(msg: LogBatch) -> list[Payload]:
    return encode_frames(msg, "dispatcher", "run")


def _lines(frames: list[list[Payload]]) -> list[str]:
    out: list[str] = []
    for message in frames:
        batch = decode_frames(message).message
        assert isinstance(batch, LogBatch) and batch.actor == "backlog"
        out += batch.lines
    return out


def test_the_last_lines_asked_for_come_in_order_across_blocks() -> None:
    backlog = Backlog(_encode, "h", lines=25, block_lines=4)
    lines = [f"line {i}" for i in range(30)]
    backlog.extend(lines[:13])
    backlog.extend(lines[13:])
    assert (
        list(backlog) == lines[5:] and len(backlog) == 25 and "line 5" in backlog and "line 4" not in backlog
    )
    for n in (0, 1, 3, 4, 5, 11, 25, 100):
        assert _lines(backlog.frames(n)) == lines[30 - min(n, 25) :], n


def test_a_block_is_encoded_once_and_every_follower_gets_the_same_frames() -> None:
    backlog = Backlog(_encode, "h", lines=100, block_lines=10)
    backlog.extend(f"x{i}" for i in range(40))
    first = backlog.frames(40)
    made = backlog.encodings
    for _ in range(8):  # eight more followers: not one more encoding, the very same frames
        again = backlog.frames(40)
        assert all(a is b for a, b in zip(first, again, strict=True))
    assert made == 4 and backlog.encodings == 4
    backlog.extend(["x40"])  # only the block that changed is encoded again
    assert _lines(backlog.frames(41))[-2:] == ["x39", "x40"] and backlog.encodings == 5
    backlog.frames(15)  # a tail of an older block: encoded for that ask alone
    assert backlog.encodings == 6


def test_the_backlog_keeps_at_most_its_bytes_dropping_the_oldest() -> None:
    backlog = Backlog(_encode, "h", lines=1000, max_bytes=1000, block_lines=100, block_bytes=300)
    backlog.extend(f"{i:03d}" + "y" * 97 for i in range(25))  # 100 bytes each
    assert len(backlog) == 10 and next(iter(backlog)).startswith("015")
    assert _lines(backlog.frames(1000)) == list(backlog)
