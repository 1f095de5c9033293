"""Garbage sent to every bound socket of a live run is refused and logged; the run completes."""

from __future__ import annotations

import bisect
import math
import random
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq

from cadence.log import THROTTLED, Throttle
from cadence.wire.messages import PROTOCOL_VERSION, Consumed, WorkRequest, encode
from tests.system.gate import GATE_ENV, GATE_SETTINGS
from tests.system.helpers import Launched, events, start_run, summary, wait_until

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


def _addresses(run: Launched) -> dict[str, str]:
    """Each bound socket's address, once the trainer and the publisher have joined the dispatcher."""
    run_dir = run.out

    def joined() -> dict[str, str]:
        if not (run_dir / "logs" / "dispatcher.jsonl").exists():
            return {}
        return {
            e["role"]: e["address"]
            for e in events(run_dir, "dispatcher")
            if e["event"] == "peer_joined" and e["role"] in ("trainer", "publisher")  # a worker binds nothing
        }

    wait_until(
        lambda: {"trainer", "publisher"} <= set(joined()), 120, "trainer and publisher joined", run.proc
    )
    return {"dispatcher": (run_dir / "dispatcher.addr").read_text().strip(), **joined()}


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
        addresses = _addresses(proc)
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
        assert (
            "not msgpack" in reasons and "protocol version" in reasons and "missing required field" in reasons
        )


def _flood_frames(run_id: str) -> tuple[list[list[bytes]], list[list[bytes]]]:
    """Every kind of bad frame: random bytes, truncated and oversized msgpack, wrong shapes,
    another run's and another protocol's messages (all refused by the codec); and well-formed
    messages of this run from a stranger (which reach the actor, that ignores them)."""
    rng = random.Random(5)
    good = encode(WorkRequest(3), "stranger", run_id)
    refused = [[bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))] for _ in range(20)]
    refused += [[good[:cut]] for cut in (1, 5, len(good) // 2, len(good) - 1)]
    refused += [[msgpack.packb(v)] for v in (None, 7, "text", [1, 2], {"type": 3})]
    refused += [[encode(WorkRequest(3), "stranger", "another-run")]]
    refused += [[msgpack.packb({"type": "heartbeat", "proto": PROTOCOL_VERSION + 1, "run": run_id,
                                "sender": "x", "body": {}})]]  # fmt: skip
    stranger = [[encode(Consumed(0, [0, 1, 2]), "stranger", run_id)], [good]]  # well formed, unregistered
    return refused, stranger


def _assert_rate_limited(times: list[float], per_second: int, what: str) -> None:
    """`times` (the logged events' `time`) keep to a throttle of `per_second` events in each window of
    a second, however long the run went on. The throttle opens a window at most once a second, so a
    span shorter than a second overlaps at most two windows, and a span of n seconds at most n + 1.
    `slack` covers the moment between the throttle's decision and the event's time stamp."""
    slack = 0.1
    times = sorted(times)
    for i, t in enumerate(times):
        within = bisect.bisect_left(times, t + 1.0 - slack) - i
        assert within <= 2 * per_second, f"{what}: {within} logged within a second from {t}"
    windows = math.floor(times[-1] - times[0] + slack) + 1
    assert len(times) <= per_second * windows, f"{what}: {len(times)} logged over {windows} windows"


def test_a_flood_of_garbage_changes_nothing_in_the_result(tmp_path: Path) -> None:
    periods = 150  # a few seconds under the flood: held-back refusal counts are reported a second later
    # a group a micro-batch: packing whatever has arrived depends on timing, and so would the last bit
    settings: tuple[str, ...] = (
        "--set",
        f"periods={periods}",
        "--set",
        "rollout.workers=1",
        "--set",
        "seed=11",
    )
    settings += ("--set", "trainer.micro_batch_tokens=0")
    clean = start_run(tmp_path / "clean", *settings, "--set", "run_id='flood'")
    try:
        code, _, err = clean.finish(timeout=240)
    finally:
        clean.kill()
    assert code == 0, err
    run = start_run(tmp_path / "flooded", *settings, "--set", "run_id='flood'")
    ctx = zmq.Context()
    refusable, stranger = _flood_frames("flood")
    roles = ("dispatcher", "trainer", "publisher")
    sent = {role: {"refused": 0, "stranger": 0} for role in roles}  # frames handed to each socket
    try:
        addresses = _addresses(run)
        sockets = dict(zip(roles, _dealers(ctx, addresses, linger_ms=0), strict=True))
        for role, sock in sockets.items():
            # a stranger's messages first: the first refusals of a socket are always logged, whatever
            # the throttle later lets through of the flood
            for parts in stranger:
                sock.send_multipart(parts)
                sent[role]["stranger"] += 1
            sock.send(
                msgpack.packb({"type": "weight_chunk", "body": {"data": b"x" * (70 << 20)}})
            )  # oversized
            sent[role]["refused"] += 1
        while run.proc.poll() is None:  # for the whole run
            for role, sock in sockets.items():
                for kind, frames in (("refused", refusable), ("stranger", stranger)):
                    for parts in frames:
                        try:
                            sock.send_multipart(parts, flags=zmq.NOBLOCK)
                            sent[role][kind] += 1
                        except zmq.Again:
                            pass
            time.sleep(0.005)
        code, _, err = run.finish(timeout=240)
        for sock in sockets.values():
            sock.close()
    finally:
        run.kill()
        ctx.destroy(linger=0)
    assert code == 0, err
    assert sum(n for kinds in sent.values() for n in kinds.values()) > 1000  # the flood was real
    assert summary(tmp_path / "flooded")["weights_sha256"] == summary(tmp_path / "clean")["weights_sha256"]
    assert summary(tmp_path / "flooded")["groups_trained"] == periods * 4
    budget = Throttle().per_second
    channels = {"dispatcher": ("dispatcher",), "trainer": ("trainer", "publisher")}  # process: its sockets
    for actor, sockets_of in channels.items():
        logged = events(tmp_path / "flooded", actor)
        for channel in sockets_of:  # each socket's refusals: rate limited, and every one counted
            refused = [e for e in logged if e["event"] == "message_refused" and e["channel"] == channel]
            held = [
                e["count"]
                for e in logged
                if e["event"] == "messages_refused_suppressed" and e["channel"] == channel
            ]
            assert refused and sum(held) > 0, channel  # refusals are logged, and rate limited
            _assert_rate_limited([e["time"] for e in refused], budget, f"{channel} refusals")
            total = refused[-1]["refused_total"]
            assert len(refused) + sum(held) == total, channel  # held-back counts add up
            # the trainer and the publisher refuse a stranger's messages too (wire/roles.py)
            strangers = 0 if channel == "dispatcher" else sent[channel]["stranger"]
            assert total <= sent[channel]["refused"] + strangers, channel
        if actor == "trainer":
            assert any(e.get("role") == "stranger" for e in logged if e["event"] == "message_refused")
            continue
        # well-formed messages from a stranger: throttled too, their held-back counts on the next line
        from_stranger = sum(sent[channel]["stranger"] for channel in sockets_of)
        noisy = [e for e in logged if e["event"] in THROTTLED]
        assert any(e.get("suppressed", 0) > 0 for e in noisy), actor
        for name in {e["event"] for e in noisy}:
            shown = [e for e in noisy if e["event"] == name]
            _assert_rate_limited([e["time"] for e in shown], budget, f"{actor} {name}")
            assert len(shown) + sum(e.get("suppressed", 0) for e in shown) <= from_stranger, (actor, name)


def test_a_stranger_that_registers_as_trainer_first_takes_nothing(tmp_path: Path) -> None:
    """The moment `dispatcher.addr` appears, before the run's own trainer can, a stranger registers as
    the trainer and as the publisher: without the run's secret (`run.secret`, 0600 beside config.json)
    both are refused, the run's own take the roles, and the run completes."""
    from cadence.launch.secret import SECRET_FILE
    from cadence.wire.messages import Register, encode_frames

    out = tmp_path / "run"
    run = start_run(out, "--set", "periods=3", "--set", "run_id='first'")
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        wait_until(
            lambda: (out / "dispatcher.addr").exists(), 120, "dispatcher.addr", run.proc, interval_s=0.001
        )
        claimants = []
        for role in ("trainer", "publisher"):
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect((out / "dispatcher.addr").read_text().strip())
            register = Register(role, "tcp://127.0.0.1:9", key="0" * 32 if role == "trainer" else "")
            sock.send_multipart([bytes(f) for f in encode_frames(register, f"squatter-{role}", "first")])
            claimants.append(sock)
        code, _, err = run.finish(timeout=240)
        assert code == 0, err
    finally:
        run.kill()
        ctx.destroy(linger=0)
    assert (out / SECRET_FILE).stat().st_mode & 0o777 == 0o600
    refused = {
        e["peer"]: e["reason"]
        for e in events(out, "dispatcher")
        if e["event"] == "message_refused" and e["type"] == "register"
    }
    # refused for want of the secret, or (had the run's own been quicker) as the role is taken
    for role in ("trainer", "publisher"):
        assert refused[f"squatter-{role}"] in (
            f"a {role} registers with the run's secret (run.secret, beside config.json)",
            f"the run has its {role} already ({role})",
        )
    joined = {e["peer"]: e["role"] for e in events(out, "dispatcher") if e["event"] == "peer_joined"}
    assert joined["trainer"] == "trainer" and joined["publisher"] == "publisher"
    assert "squatter-trainer" not in joined and summary(out)["final_version"] == 3


def test_a_registered_worker_that_hoards_and_never_answers_stalls_nothing(tmp_path: Path) -> None:
    """A worker registers, asks for 65 536 credits, heartbeats and never answers: it is given no more
    than `rollout.inflight` prompts, each goes back to the queue once held past the hold (derived:
    while the run's own worker waits for work, 4 x the slowest group or one liveness timeout, 5 s
    here, not the floor of 20, 100 s), and the run's own worker ends the run."""
    from cadence.wire.messages import Assignment, Heartbeat, Register, Welcome, decode_frames, encode_frames

    out = tmp_path / "run"
    settings = (
        "periods=3",
        "rollout.workers=1",
        "rollout.inflight=2",
        "transport.liveness=10",
        "run_id='hoard'",
    )
    run = start_run(out, *[x for s in settings for x in ("--set", s)])
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        wait_until(lambda: (out / "dispatcher.addr").exists(), 120, "dispatcher.addr", run.proc)
        sock.connect((out / "dispatcher.addr").read_text().strip())

        def send(msg: Register | WorkRequest | Heartbeat) -> None:
            sock.send_multipart([bytes(f) for f in encode_frames(msg, "hoarder", "hoard")])

        send(Register("rollout"))
        taken: set[int] = set()
        deadline = time.monotonic() + 240
        while run.proc.poll() is None:  # beat, take what comes, answer nothing
            assert time.monotonic() < deadline, "the run did not end"
            send(Heartbeat("rollout"))
            while sock.poll(100):
                msg = decode_frames(sock.recv_multipart()).message
                if isinstance(msg, Welcome):  # welcomed: its credits start from 0, then it asks
                    send(WorkRequest(65_536))
                if isinstance(msg, Assignment) and not msg.eval:
                    taken.add(msg.prompt_id)
        code, _, err = run.finish(timeout=60)
        assert code == 0, err
    finally:
        run.kill()
        ctx.destroy(linger=0)
    # the hoarder's prompts went back (a slow own worker's may too, on a loaded machine)
    expired = [e for e in events(out, "dispatcher") if e["event"] == "assignment_expired"]
    hoarded = {i for e in expired if e["peer"] == "hoarder" for i in e["prompt_ids"]}
    assert hoarded and hoarded <= taken
    assert all(e["held_s"] < 100 for e in expired if e["peer"] == "hoarder")  # under the floor
    capped = [e for e in events(out, "dispatcher") if e["event"] == "credits_capped"]
    assert capped and capped[0]["held"] == 2  # never more than its in-flight limit at once
    assert summary(out)["final_version"] == 3 and summary(out)["groups_trained"] == 3 * 4


def _large_strangers(addresses: dict[str, str], run_id: str, connections: int, frames: int) -> int:
    """From `connections` connections to the trainer and as many to the dispatcher, `frames` large
    well-formed messages each (groups without a ticket; a stranger's log lines); how many went out."""
    from cadence.wire.messages import GroupResult, LogBatch

    rows = 100_000  # a group of about 15 MiB
    group = GroupResult(0, 0, 1, [1], [[7] * 16] * rows, [[-0.5] * 16] * rows, [1.0], [1.0], 0.0, 0.0, 0.0)
    to = {
        "trainer": encode(group, "stranger", run_id),
        "dispatcher": encode(LogBatch("stranger", "h", "", ["x" * 60_000] * 250), "stranger", run_id),
    }
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    socks = []
    for role, frame in to.items():
        for _ in range(connections):
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 60_000)
            sock.connect(addresses[role])
            for _ in range(frames):
                sock.send(frame, copy=False)
            socks.append(sock)
    for sock in socks:
        sock.close()  # lingers until its frames are out
    ctx.term()
    return len(socks) * frames


def test_large_well_formed_frames_from_many_strangers_are_not_decoded_and_the_run_completes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Strangers on 8 connections each to the trainer and to the dispatcher send 4 well-formed frames of
    15 MiB each: the trainer's a group without its ticket, the dispatcher's log lines from a route that
    never registered. None is decoded (each refused, saying so), no heartbeat is missed, the run
    completes. The run scores nothing until the trainer has refused the strangers' first group (a run
    that ended first would have read none of them)."""
    out, gate = tmp_path / "run", tmp_path / "gate"
    monkeypatch.setenv(GATE_ENV, str(gate))
    run = start_run(out, "--set", "periods=4", "--set", "run_id='large'", *GATE_SETTINGS)
    try:
        sent = _large_strangers(_addresses(run), "large", connections=8, frames=4)
        wait_until(lambda: _strangers_refused(out, "trainer"), 120, "the trainer's first refusal", run.proc)
        wait_until(lambda: _undecoded(out, "dispatcher"), 120, "the dispatcher's first refusal", run.proc)
        gate.touch()
        code, _, err = run.finish(timeout=240)
    finally:
        run.kill()
    assert code == 0, err
    assert sent == 2 * 8 * 4
    # (those the throttle let be logged) the trainer read a group's ticket and no more; the dispatcher
    # not even that, from a route that never registered: a decoded one would be refused for other reasons
    groups = _strangers_refused(out, "trainer")
    assert groups and all(e["type"] == "group_result" and e["reason"].endswith("not decoded") for e in groups)
    assert _undecoded(out, "dispatcher")
    assert not _strangers_refused(out, "dispatcher")
    assert summary(out)["final_version"] == 4 and summary(out)["groups_trained"] == 4 * 4


def _refused(out: Path, actor: str) -> list[dict[str, Any]]:
    log = out / "logs" / f"{actor}.jsonl"
    return [e for e in events(out, actor) if e["event"] == "message_refused"] if log.exists() else []


def _strangers_refused(out: Path, actor: str) -> list[dict[str, Any]]:
    return [e for e in _refused(out, actor) if e["sender"] == "stranger"]


def _undecoded(out: Path, actor: str) -> list[dict[str, Any]]:
    return [e for e in _refused(out, actor) if e["reason"].endswith("not decoded")]


def test_a_run_that_listens_locally_is_reached_through_its_own_users_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`transport.listen = "ipc"`: the dispatcher, the trainer and the publisher listen on Unix sockets,
    each in a folder only the run's user can open (0700), and the run completes through them. The run
    scores nothing until the folders are looked at (a run that ended first would have removed them)."""
    import stat

    out, gate = tmp_path / "run", tmp_path / "gate"
    monkeypatch.setenv(GATE_ENV, str(gate))
    run = start_run(out, "--set", "periods=2", "--set", "transport.listen='ipc'", *GATE_SETTINGS)
    try:
        addresses = _addresses(run)
        folders = {role: Path(a.removeprefix("ipc://")).parent for role, a in addresses.items()}
        assert all(a.startswith("ipc://") for a in addresses.values()), addresses
        assert all(stat.S_IMODE(f.stat().st_mode) == 0o700 for f in folders.values()), folders
        gate.touch()
        code, _, err = run.finish(timeout=240)
    finally:
        run.kill()
    assert code == 0, err
    assert summary(out)["final_version"] == 2
    assert not any(f.exists() for f in folders.values())  # each removed with its server
