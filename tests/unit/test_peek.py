"""Sizing a frame before decoding it: `peek` reads a header's envelope and its type's proof fields only,
and a large body decodes to the same message with the collector paused, which is running again after."""

from __future__ import annotations

import gc

import msgpack
import pytest

from cadence.transport.admission import Admission
from cadence.wire.codec import QUIET_GC_BYTES
from cadence.wire.messages import (
    PROTOCOL_VERSION,
    DecodeError,
    GroupResult,
    Heartbeat,
    decode,
    encode,
    peek,
)


def _group(rows: int, ticket: str = "t") -> GroupResult:
    return GroupResult(3, 3, 7, [1], [[5] * 16] * rows, [[-0.5] * 16] * rows, [1.0], [1.0], 0.0, 0.0, 0.0,
                       ticket=ticket)  # fmt: skip


def test_peek_reads_the_envelope_and_the_proof_fields_alone() -> None:
    seen = peek(encode(_group(4, ticket="abc"), "worker-0", "run"))
    assert (seen.tag, seen.sender, seen.run) == ("group_result", "worker-0", "run")
    assert (seen.proof.period, seen.proof.prompt_id, seen.proof.ticket) == (3, 7, "abc")
    assert not hasattr(seen.proof, "completions")
    plain = peek(encode(Heartbeat("rollout"), "worker-0", "run"))
    assert plain.tag == "heartbeat" and plain.proof is None


def test_peek_refuses_what_the_envelope_or_the_proof_would_refuse() -> None:
    with pytest.raises(DecodeError, match="not msgpack"):
        peek(b"\xc1\xc1")
    head = {"type": "group_result", "proto": PROTOCOL_VERSION, "run": "r", "sender": "s"}
    wrong = msgpack.packb({**head, "body": {"type": "group_result", "period": -1, "prompt_id": 0}})
    with pytest.raises(DecodeError, match="period"):
        peek(wrong)
    with pytest.raises(DecodeError, match="exceeds the limit"):
        peek(encode(_group(64), "s", "r"), max_bytes=100)


def test_a_large_body_decodes_the_same_with_the_collector_paused_and_running_after() -> None:
    group = _group(QUIET_GC_BYTES // 100)
    frame = encode(group, "w", "r")
    assert len(frame) > QUIET_GC_BYTES
    assert gc.isenabled()
    assert decode(frame).message == group
    assert gc.isenabled()
    gc.disable()  # a caller's own pause is left as it was
    try:
        assert decode(frame).message == group and not gc.isenabled()
    finally:
        gc.enable()


def test_a_large_frame_from_a_route_not_known_is_refused_unless_it_proves_itself() -> None:
    frame = encode(_group(2000, ticket="good"), "w", "r")
    small = encode(Heartbeat("rollout"), "w", "r")
    closed = Admission(small_bytes=1024)
    assert closed.problem(b"w#1", small) is None  # a small frame is always decoded
    refused = closed.problem(b"w#1", frame)
    assert refused is not None and "not decoded" in refused.reason and closed.undecoded == 1
    known = Admission(small_bytes=1024, known=lambda route: route == b"w#1")
    assert known.problem(b"w#1", frame) is None and known.problem(b"x#2", frame) is not None
    ticketed = Admission(
        small_bytes=1024, proves=lambda route, seen: None if seen.proof.ticket == "good" else "no"
    )
    assert ticketed.problem(b"x#2", frame) is None
    forged = ticketed.problem(b"x#2", encode(_group(2000, ticket="bad"), "w", "r"))
    assert forged is not None and forged.type_tag == "group_result" and forged.sender == "w"
    assert "from a peer not known here: no; not decoded" in forged.reason and ticketed.undecoded == 1
