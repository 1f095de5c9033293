"""A peer's volume against a live run: large frames at full speed from several connections, and log
lines forged, oversized or from strangers. The actors stay within their byte bounds (measured from
/proc), refuse and log what is not theirs to take, and the run completes."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import zmq

from cadence.wire.messages import Heartbeat, LogBatch, Register, encode_frames
from tests.system.gate import GATE_ENV, GATE_SETTINGS
from tests.system.helpers import events, start_run, summary, wait_until

pytestmark = [pytest.mark.system, pytest.mark.timeout(300)]

FRAME = 8 << 20
"""A flooding frame: 8 MiB of garbage, within `transport.max_frame_bytes`, refused once decoded."""
CONNECTIONS = 3
"""Connections flooding each actor at once."""
RECEIVE_QUEUE = 8
"""`transport.receive_queue`, the default."""


def _rss(pid: int) -> int:
    """The resident bytes of process `pid`."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def _flood(ctx: zmq.Context[zmq.Socket[bytes]], address: str, sent: list[int]) -> None:
    """Up to 100 frames at full speed, each as soon as ZeroMQ takes it, until none went for a second."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 4)
    sock.connect(address)
    frame = b"\xc1" * FRAME  # never msgpack
    count, last = 0, time.monotonic()
    while count < 100 and time.monotonic() - last < 1.0:
        try:
            sock.send(frame, zmq.NOBLOCK)
            count, last = count + 1, time.monotonic()
        except zmq.Again:
            time.sleep(0.001)
    sock.close()
    sent.append(count)


def _peak_growth(pids: dict[str, int], floods: list[threading.Thread]) -> dict[str, int]:
    """How far each process's resident bytes rose above where they were, while the floods ran."""
    base = {name: _rss(pid) for name, pid in pids.items()}
    peak = dict(base)
    for thread in floods:
        thread.start()
    while any(t.is_alive() for t in floods):
        for name, pid in pids.items():
            peak[name] = max(peak[name], _rss(pid))
        time.sleep(0.01)
    return {name: peak[name] - base[name] for name in pids}


def _log_traffic(ctx: zmq.Context[zmq.Socket[bytes]], address: str) -> list[zmq.Socket[bytes]]:
    """A registered worker's log lines under the trainer's name and its own, one of them 1 MiB long;
    and a stranger's lines. The two sockets, open: closed before all is sent, their messages are lost."""

    def send(sock: zmq.Socket[bytes], sender: str, msg: Register | Heartbeat | LogBatch) -> None:
        sock.send_multipart([bytes(f) for f in encode_frames(msg, sender, "volume")])

    noisy, stranger = ctx.socket(zmq.DEALER), ctx.socket(zmq.DEALER)
    for sock in (noisy, stranger):
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(address)
    send(noisy, "noisy", Register("rollout"))
    line = json.dumps({"time": 1.0, "level": "info", "event": "run_done", "forged": True})
    send(noisy, "noisy", LogBatch("trainer", "far", "/x.jsonl", [line]))
    huge = json.dumps({"time": 1.0, "level": "info", "event": "x" * (1 << 20)})
    send(noisy, "noisy", LogBatch("noisy", "far", "/x.jsonl", [huge, line]))
    send(stranger, "lurker", LogBatch("lurker", "far", "/x.jsonl", [line]))
    return [noisy, stranger]


def test_a_peer_s_volume_is_bounded_and_its_log_lines_are_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out, gate = tmp_path / "run", tmp_path / "gate"
    monkeypatch.setenv(GATE_ENV, str(gate))  # the run scores nothing until the floods are over
    run = start_run(out, *GATE_SETTINGS, "--set", "periods=2", "--set", "run_id='volume'")
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        wait_until(
            lambda: (
                (out / "logs" / "dispatcher.jsonl").exists()
                and any(
                    e["event"] == "peer_joined" and e["role"] == "trainer" for e in events(out, "dispatcher")
                )
            ),
            120,
            "the trainer joined",
            run.proc,
        )
        logged = events(out, "dispatcher")
        trainer = next(e for e in logged if e["event"] == "peer_joined" and e["role"] == "trainer")
        dispatcher = (out / "dispatcher.addr").read_text().strip()
        sockets = _log_traffic(ctx, dispatcher)
        wait_until(  # the dispatcher took all of it before the floods begin
            lambda: (
                any(e["event"] == "log_lines_refused" for e in events(out, "dispatcher"))
                and sum(
                    e["event"] == "message_refused" and e["type"] == "log_batch"
                    for e in events(out, "dispatcher")
                )
                >= 2
            ),
            60,
            "the log traffic refused",
            run.proc,
        )
        for sock in sockets:
            sock.close()
        pids = {"dispatcher": logged[0]["pid"], "trainer": trainer["peer_pid"]}
        sent: list[int] = []
        floods = [
            threading.Thread(target=_flood, args=(ctx, address, sent))
            for address in (dispatcher, trainer["address"])
            for _ in range(CONNECTIONS)
        ]
        growth = _peak_growth(pids, floods)
        gate.touch()
        code, _, err = run.finish(timeout=240)
        assert code == 0, err
    finally:
        gate.touch()
        run.kill()
        ctx.destroy(linger=0)
    # what the connections could make an actor hold: their queues of 8 MiB frames, each frame once
    # more while it is decoded, and room for what the actor does meanwhile on a loaded machine
    bound = CONNECTIONS * RECEIVE_QUEUE * FRAME * 2 + (256 << 20)
    assert sum(sent) > 2 * CONNECTIONS * RECEIVE_QUEUE, sent  # the floods got through to the queues
    assert all(g < bound for g in growth.values()), (growth, bound)
    refused = [e for e in events(out, "dispatcher") if e["event"] == "message_refused"]
    reasons = {(e["peer"], e["type"]): e["reason"] for e in refused}
    assert "its own name only" in reasons[("noisy", "log_batch")]
    assert "may not send log_batch" in reasons[("lurker", "log_batch")]
    too_long = [e for e in events(out, "dispatcher") if e["event"] == "log_lines_refused"]
    assert [(e["actor"], e["lines"]) for e in too_long] == [("noisy", 1)]
    assert not any(e.get("forged") for e in events(out, "trainer"))
    noisy = [json.loads(x) for x in (out / "logs" / "noisy.jsonl").read_text().splitlines()]
    assert [e["event"] for e in noisy] == ["run_done"]  # its own line, under its own name
    assert summary(out)["final_version"] == 2


def test_a_registered_worker_s_group_beyond_the_run_s_sizes_is_refused(tmp_path: Path) -> None:
    """A registered worker takes a prompt and answers it with 16 completions of 512 tokens where the run
    has groups of 4 and a limit of 8 tokens: the trainer refuses it, naming why, and trains only the
    run's own worker's groups."""
    from cadence.wire.messages import Assignment, GroupResult, Welcome, WorkRequest, decode_frames

    out = tmp_path / "run"
    settings = ("periods=2", "rollout.workers=1", "rollout.hold_s=3", "run_id='sizes'")
    run = start_run(out, *[x for s in settings for x in ("--set", s)])
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock, to_trainer = ctx.socket(zmq.DEALER), ctx.socket(zmq.DEALER)
    for s in (sock, to_trainer):
        s.setsockopt(zmq.LINGER, 1000)

    def send(to: zmq.Socket[bytes], msg: Register | WorkRequest | Heartbeat | GroupResult) -> None:
        to.send_multipart([bytes(f) for f in encode_frames(msg, "oversized", "sizes")])

    try:
        wait_until(lambda: (out / "dispatcher.addr").exists(), 120, "dispatcher.addr", run.proc)
        sock.connect((out / "dispatcher.addr").read_text().strip())
        send(sock, Register("rollout"))
        answered = False
        deadline = time.monotonic() + 240
        while run.proc.poll() is None:  # beat; answer the first training prompt with a huge group
            assert time.monotonic() < deadline, "the run did not end"
            send(sock, Heartbeat("rollout"))
            while sock.poll(100):
                msg = decode_frames(sock.recv_multipart()).message
                if isinstance(msg, Welcome):
                    send(sock, WorkRequest(1))
                if isinstance(msg, Assignment) and not msg.eval and not answered:
                    joined = [e for e in events(out, "dispatcher") if e["event"] == "peer_joined"]
                    to_trainer.connect(next(e["address"] for e in joined if e["role"] == "trainer"))
                    n, length = 16, 512
                    group = GroupResult(
                        msg.period, msg.version, msg.prompt_id, [1] * 8, [[1] * length] * n,
                        [[-1.0] * length] * n, [0.0] * n, [0.0] * n, 0.0, 0.0, 0.0, ticket=msg.ticket,
                    )  # fmt: skip
                    send(to_trainer, group)
                    answered = True
        code, _, err = run.finish(timeout=60)
        assert code == 0, err
    finally:
        run.kill()
        ctx.destroy(linger=0)
    assert answered
    refused = [e for e in events(out, "trainer") if e["event"] == "message_refused"]
    assert any(
        e["peer"] == "oversized" and "16 samples, the run's groups have 4" in e["reason"] for e in refused
    ), refused
    assert summary(out)["final_version"] == 2 and summary(out)["groups_trained"] == 2 * 4
