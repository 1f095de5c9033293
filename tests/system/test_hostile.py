"""Garbage sent to every bound socket of a live run is refused and logged; the run completes."""

from __future__ import annotations

import time
from pathlib import Path

import msgpack
import pytest
import zmq

from cadence.messages import PROTOCOL_VERSION
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


def test_garbage_to_every_socket_is_refused_and_the_run_completes(tmp_path: Path) -> None:
    periods = 30
    proc = start_run(tmp_path, "--set", f"periods={periods}")
    ctx = zmq.Context()
    try:
        addresses = _addresses(tmp_path, time.time() + 120)
        sockets = []
        for role in ("dispatcher", "trainer", "publisher"):
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 1000)
            sock.connect(addresses[role].replace("*", ""))
            sockets.append(sock)
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
