"""Garbage sent to every bound socket of a live run is refused and logged; the run completes."""

from __future__ import annotations

import random
import time
from pathlib import Path

import msgpack
import pytest
import zmq

from cadence.log import THROTTLED
from cadence.wire.messages import PROTOCOL_VERSION, Consumed, WorkRequest, encode
from tests.system.helpers import events, start_run, summary

pytestmark = [pytest.mark.system, pytest.mark.timeout(300)]

GARBAGE = [
    [b"\x00\xffnot msgpack at all"],
    [msgpack.packb([1, 2, 3])],
    [
        msgpack.packb(
            {"type": "assignment", "proto": PROTOCOL_VERSION, "run": "x", "sender": "evil", "body": {}}
        )
    ],
    [
        msgpack.packb(
            {"type": "heartbeat", "proto": PROTOCOL_VERSION + 7, "run": "", "sender": "evil", "body": {}}
        )
    ],
    [b"two", b"frames"],
]


def _addresses(run_dir: Path, deadline: float) -> dict[str, str]:
    while time.time() < deadline:
        log = run_dir / "logs" / "dispatcher.jsonl"
        if log.exists():
            joined = {
                e["role"]: e["address"] for e in events(run_dir, "dispatcher") if e["event"] == "peer_joined"
            }
            if "trainer" in joined and "publisher" in joined:
                return {"dispatcher": (run_dir / "dispatcher.addr").read_text().strip(), **joined}
        time.sleep(0.1)
    raise AssertionError("the run did not come up")


def _dealers(
    ctx: zmq.Context[zmq.Socket[bytes]], addresses: dict[str, str], linger_ms: int
) -> list[zmq.Socket[bytes]]:
    """A raw DEALER connected to each bound socket of a run, no codec in the way."""
    sockets = []
    for role in ("dispatcher", "trainer", "publisher"):
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, linger_ms)
        sock.setsockopt(zmq.SNDHWM, 100_000)
        sock.connect(addresses[role])
        sockets.append(sock)
    return sockets


def test_garbage_to_every_socket_is_refused_and_the_run_completes(tmp_path: Path) -> None:
    periods = 30
    proc = start_run(tmp_path, "--set", f"periods={periods}")
    ctx = zmq.Context()
    try:
        addresses = _addresses(tmp_path, time.time() + 120)
        sockets = _dealers(ctx, addresses, linger_ms=1000)
        for sock in sockets:
            for frames in GARBAGE:
                sock.send_multipart(frames)
        code, out, err = proc.finish(timeout=240)
        for sock in sockets:
            sock.close()
    finally:
        proc.kill()
        ctx.destroy(linger=0)
    assert code == 0, err
    s = summary(tmp_path)
    assert s["groups_trained"] == periods * 4 and s["stale_dropped"] == 0
    for actor, channels in (("dispatcher", {"dispatcher"}), ("trainer", {"trainer", "publisher"})):
        refused = [e for e in events(tmp_path, actor) if e["event"] == "message_refused"]
        assert {e["channel"] for e in refused} == channels, actor
        assert len(refused) == len(GARBAGE) * len(channels)
        reasons = " ".join(e["reason"] for e in refused)
        assert "not msgpack" in reasons and "protocol version" in reasons and "missing field" in reasons


def _flood_frames(run_id: str) -> list[list[bytes]]:
    """Every kind of bad frame: random bytes, truncated and oversized msgpack, wrong shapes,
    another run's and another protocol's messages, a valid message from a stranger."""
    rng = random.Random(5)
    good = encode(WorkRequest(3), "stranger", run_id)
    frames = [[bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))] for _ in range(20)]
    frames += [[good[:cut]] for cut in (1, 5, len(good) // 2, len(good) - 1)]
    frames += [[msgpack.packb(v)] for v in (None, 7, "text", [1, 2], {"type": 3})]
    frames += [[encode(WorkRequest(3), "stranger", "another-run")]]
    frames += [[msgpack.packb({"type": "heartbeat", "proto": PROTOCOL_VERSION + 1, "run": run_id,
                               "sender": "x", "body": {}})]]  # fmt: skip
    frames += [[encode(Consumed(0, [0, 1, 2]), "stranger", run_id)], [good]]  # well formed, unregistered
    return frames


def test_a_flood_of_garbage_changes_nothing_in_the_result(tmp_path: Path) -> None:
    periods = 150  # a few seconds under the flood: held-back refusal counts are reported a second later
    # a group a micro-batch: packing whatever has arrived depends on timing, and so would the last bit
    settings = ("--set", f"periods={periods}", "--set", "rollout.workers=1", "--set", "seed=11")
    settings += ("--set", "trainer.micro_batch_tokens=0")
    clean = start_run(tmp_path / "clean", *settings, "--set", "run_id='flood'")
    try:
        code, _, err = clean.finish(timeout=240)
    finally:
        clean.kill()
    assert code == 0, err
    run = start_run(tmp_path / "flooded", *settings, "--set", "run_id='flood'")
    ctx = zmq.Context()
    sent = 0
    try:
        addresses = _addresses(tmp_path / "flooded", time.time() + 120)
        sockets = _dealers(ctx, addresses, linger_ms=0)
        for sock in sockets:
            sock.send(
                msgpack.packb({"type": "weight_chunk", "body": {"data": b"x" * (70 << 20)}})
            )  # oversized
        frames = _flood_frames("flood")
        while run.proc.poll() is None:  # for the whole run
            for sock in sockets:
                for parts in frames:
                    try:
                        sock.send_multipart(parts, flags=zmq.NOBLOCK)
                        sent += 1
                    except zmq.Again:
                        pass
            time.sleep(0.005)
        code, _, err = run.finish(timeout=240)
        for sock in sockets:
            sock.close()
    finally:
        run.kill()
        ctx.destroy(linger=0)
    assert code == 0, err
    assert sent > 1000  # the flood was real
    assert summary(tmp_path / "flooded")["weights_sha256"] == summary(tmp_path / "clean")["weights_sha256"]
    assert summary(tmp_path / "flooded")["groups_trained"] == periods * 4
    logged = events(tmp_path / "flooded", "dispatcher")
    refused = [e for e in logged if e["event"] == "message_refused"]
    suppressed = sum(e["count"] for e in logged if e["event"] == "messages_refused_suppressed")
    assert refused and suppressed > 0  # refusals are logged, and rate limited
    assert len(refused) < suppressed
    for actor in ("dispatcher", "trainer"):  # well-formed messages from a stranger: throttled too
        noisy = [e for e in events(tmp_path / "flooded", actor) if e["event"] in THROTTLED]
        assert noisy and len(noisy) < 100 and any(e.get("suppressed", 0) > 0 for e in noisy), actor
