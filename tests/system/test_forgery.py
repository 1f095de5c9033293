"""Forged and meaningless messages from a peer that knows the run id, and a flood at full speed, sent to
a live run: each is refused and logged, no actor fails, and the run ends with the weights of a clean
run of the same seed (one worker, a group a micro-batch: the result does not depend on timing)."""

from __future__ import annotations

import math
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq

from cadence.wire.digest import digest
from cadence.wire.messages import (
    Consumed,
    GroupResult,
    Message,
    Register,
    RunDone,
    Shutdown,
    StopPeriod,
    VersionReady,
    WeightUpload,
    WorkRequest,
    decode_frames,
    encode_frames,
)
from tests.system.helpers import ROOT, Launched, events, start_run, summary, wait_until
from tests.system.test_hostile import _addresses

pytestmark = [pytest.mark.system, pytest.mark.timeout(600)]

RUN_ID = "forged"
PERIODS = 500  # 0.045 s a period on an idle 2-core machine: 22 s, against 9 s of forgeries and flood
SETTINGS = (
    *("--set", f"periods={PERIODS}", "--set", "rollout.workers=1", "--set", "seed=11"),
    *("--set", "trainer.micro_batch_tokens=0", "--set", f"run_id='{RUN_ID}'"),
)
FLOOD_S = 8.0


class Forger:
    """A peer that speaks the protocol, with the run id, from its own socket."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], name: str, address: str) -> None:
        self.name = name
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.IDENTITY, name.encode())
        self.sock.connect(address)

    def send(self, msg: Message) -> None:
        self.sock.send_multipart([bytes(f) for f in encode_frames(msg, self.name, RUN_ID)])

    def send_raw(self, header: dict[str, Any]) -> None:
        self.sock.send(msgpack.packb(header))


def group(prompt_id: int, **changes: Any) -> GroupResult:
    values: dict[str, Any] = {
        "period": 0,
        "version": 0,
        "prompt_id": prompt_id,
        "prompt_tokens": [1, 2],
        "completions": [[3, 4], [5, 6]],
        "logprobs": [[-1.0, -1.0], [-1.0, -1.0]],
        "rewards": [1.0, 0.0],
        "correct": [1.0, 0.0],
        "gen_s": 0.0,
        "load_s": 0.0,
        "finished_at": 0.0,
    }
    return GroupResult(**{**values, **changes})


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("clean") / "run"
    run = start_run(out, *SETTINGS)
    try:
        code, _, err = run.finish(timeout=400)
    finally:
        run.kill()
    assert code == 0, err
    return str(summary(out)["weights_sha256"])


def refusals(run_dir: Path, actor: str) -> list[dict[str, Any]]:
    return [e for e in events(run_dir, actor) if e["event"] == "message_refused" and "role" in e]


def refused_by(run: Launched, actor: str, peer: str, type_: str, count: int = 1) -> None:
    """Wait until `actor` has logged `count` refusals of `type_` from `peer`."""

    def seen() -> bool:
        return len([e for e in refusals(run.out, actor) if (e["peer"], e["type"]) == (peer, type_)]) >= count

    wait_until(seen, 60, f"{actor} refusing {type_} from {peer}", run.proc)


def assert_clean_end(run: Launched, clean: str) -> None:
    code, _, err = run.finish(timeout=400)
    assert code == 0, err
    s = summary(run.out)
    assert s["weights_sha256"] == clean and s["final_version"] == PERIODS
    assert s["groups_trained"] == PERIODS * 4 and s["stale_dropped"] == 0
    for actor in ("dispatcher", "trainer", "rollout-0"):
        failures = [e for e in events(run.out, actor) if e["event"] in ("actor_failed", "message_failed")]
        assert failures == [], actor
    lost = [e for e in events(run.out, "dispatcher") if e["event"] in ("peer_lost", "trainer_lost_waiting")]
    assert lost == []


@pytest.fixture
def context() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


def forge_to_dispatcher(run: Launched, ctx: zmq.Context[zmq.Socket[bytes]], address: str, out: Path) -> None:
    """A registered worker may not end the run, rewind it, or announce metrics; a second trainer may
    not join while the run has one (trainer.on_loss = "fail")."""
    forger = Forger(ctx, "forger", address)
    forger.send(Register("rollout"))

    def joined() -> bool:
        return any(
            e.get("peer") == "forger" for e in events(run.out, "dispatcher") if e["event"] == "peer_joined"
        )

    wait_until(joined, 60, "the forger registered", run.proc)
    forger.send(RunDone(PERIODS, "f" * 64, str(out / "nowhere")))
    forger.send(VersionReady(0, "f" * 64, 1))
    header = msgpack.unpackb(bytes(encode_frames(VersionReady(3, "f" * 64, 1), "forger", RUN_ID)[0]))
    header["body"]["metrics"] = {"reward_mean": msgpack.ExtType(3, b"\x00")}
    forger.send_raw(header)
    refused_by(run, "dispatcher", "forger", "version_ready", count=2)  # in order: after the run_done
    refused_by(run, "dispatcher", "forger", "run_done")
    impostor = Forger(ctx, "impostor", address)
    impostor.send(Register("trainer", "tcp://127.0.0.1:9", key="0" * 32))
    refused_by(run, "dispatcher", "impostor", "register")
    # the refusals logged are rate limited (5 a second, counting from the first): the next ones once
    # that second has passed, so that each is logged
    first = min(e["time"] for e in refusals(run.out, "dispatcher"))
    wait_until(lambda: time.time() > first + 1.5, 30, "the refusal log's second to pass", run.proc)
    forger.send(Consumed(0, [0, 1, 2, 3], filtered=[0, 1], closed=True))  # would stop the period
    forger.send(StopPeriod(0))  # the dispatcher's word to workers, not a worker's
    refused_by(run, "dispatcher", "forger", "stop_period")
    refused_by(run, "dispatcher", "forger", "consumed")


def forge_to_trainer(run: Launched, ctx: zmq.Context[zmq.Socket[bytes]], address: str) -> None:
    """Groups nobody assigned: an unissued prompt id, NaN rewards, ids beyond the vocabulary, ragged lengths."""
    forger = Forger(ctx, "forger", address)
    forger.send(group(10_000))
    forger.send(group(0, rewards=[math.nan, 1.0], logprobs=[[-math.inf, -1.0], [-1.0, -1.0]]))
    forger.send(group(1, completions=[[3, 1 << 20], [5, 6]]))
    forger.send(group(2, rewards=[1.0], completions=[[3, 4], [5, 6], [7]]))
    refused_by(run, "trainer", "forger", "group_result", count=4)
    forger.send(StopPeriod(0))
    refused_by(run, "trainer", "forger", "stop_period")


def forge_to_publisher(run: Launched, ctx: zmq.Context[zmq.Socket[bytes]], address: str) -> None:
    """A forged version under the trainer's name, and 12 partial uploads announcing 2^40 chunks."""
    forger = Forger(ctx, "trainer", address)
    fake = b"\x00" * 1024
    forger.send(WeightUpload(1, 0, 1, digest(fake), fake))
    for version in range(2, 14):
        forger.send(WeightUpload(version, 0, 1 << 40, "0" * 32, b"\x00" * 4096))

    def all_refused() -> bool:  # counted, though the log shows a few a second
        forger.send(WeightUpload(99, 0, 1, digest(fake), fake))  # one more, logged with the count
        shown = [e for e in refusals(run.out, "trainer") if e["channel"] == "publisher"]
        return bool(shown) and shown[-1]["refused_total"] >= 14

    wait_until(all_refused, 60, "the publisher refusing every upload", run.proc, interval_s=0.5)


def flood(addresses: dict[str, str]) -> tuple[float, float, list[int]]:
    """Garbage at full speed to every socket for FLOOD_S, each from a process of its own: when it
    began and ended, and how many frames each flooder sent."""
    started = time.time()
    floods = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.system.flooder", addresses[role], str(FLOOD_S), RUN_ID],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        for role in ("dispatcher", "trainer", "publisher")
    ]
    try:
        sent = [int(f.communicate(timeout=FLOOD_S + 120)[0]) for f in floods]
    finally:
        for f in floods:
            f.kill()
    return started, time.time(), sent


def test_forgeries_and_a_flood_are_refused_and_change_nothing(
    tmp_path: Path, clean: str, context: zmq.Context[zmq.Socket[bytes]]
) -> None:
    run = start_run(tmp_path / "run", *SETTINGS)
    try:
        addresses = _addresses(run)
        forge_to_dispatcher(run, context, addresses["dispatcher"], tmp_path)
        forge_to_trainer(run, context, addresses["trainer"])
        forge_to_publisher(run, context, addresses["publisher"])
        started, ended, sent = flood(addresses)
        assert run.proc.poll() is None, "the run ended before the flood did"  # alive through all of it
        assert_clean_end(run, clean)
    finally:
        run.kill()
    by_forger = [e for e in refusals(run.out, "dispatcher") if e["peer"] in ("forger", "impostor")]
    assert [(e["peer"], e["role"], e["type"]) for e in by_forger] == [
        ("forger", "rollout", "run_done"),
        ("forger", "rollout", "version_ready"),
        ("forger", "rollout", "version_ready"),
        ("impostor", "stranger", "register"),
        ("forger", "rollout", "consumed"),
        ("forger", "rollout", "stop_period"),
    ]
    assert "the run has its trainer already (trainer)" in by_forger[3]["reason"]
    groups = [
        e for e in refusals(run.out, "trainer") if e["peer"] == "forger" and e["type"] == "group_result"
    ]
    assert {e["reason"] for e in groups} == {
        f"no assignment of prompt {i} of period 0 to forger" for i in (10_000, 0, 1, 2)
    }
    uploads = [e for e in refusals(run.out, "trainer") if e["peer"] == "trainer"]
    assert {(e["channel"], e["type"], e["reason"]) for e in uploads} == {
        ("publisher", "weight_upload", "no ticket of the registered trainer")
    }
    assert [e for e in events(run.out, "trainer") if e["event"] == "version_stored"] == []  # none uploaded
    # the flood: every socket flooded, refused there, and the run's own traffic moved meanwhile
    assert min(sent) > 1000
    done = [e["time"] for e in events(run.out, "trainer") if e["event"] == "period_done"]
    assert any(started < t < ended for t in done)
    for actor, channels in (("dispatcher", {"dispatcher"}), ("trainer", {"trainer", "publisher"})):
        refused = [
            e for e in events(run.out, actor) if e["event"] == "message_refused" and e["time"] > started
        ]
        assert {e["channel"] for e in refused} == channels, actor


def claims_refused(run: Launched, names: set[str]) -> bool:
    return names <= {
        e["peer"]
        for e in events(run.out, "dispatcher")
        if e["event"] == "message_refused" and e["type"] == "register" and e["role"] == "stranger"
    }


def test_no_peer_takes_over_a_registered_peers_place(
    tmp_path: Path, clean: str, context: zmq.Context[zmq.Socket[bytes]]
) -> None:
    """A quick-start run without keys: sockets presenting the trainer's, the publisher's and the worker's
    names connect to the dispatcher (and the worker's to the trainer) and send what that peer may send:
    the last version and the end of the run, registrations, a request for work, a group. The ROUTER
    takes none of their routes over (each route is the name and a random token); each attempt is
    refused and logged; the run ends as the clean run does, every peer alive."""
    run = start_run(tmp_path / "run", *SETTINGS)
    try:
        addresses = _addresses(run)

        def worker_joined() -> bool:
            joined = [e for e in events(run.out, "dispatcher") if e["event"] == "peer_joined"]
            return any(e["peer"] == "rollout-0" for e in joined)

        wait_until(worker_joined, 120, "rollout-0 registered", run.proc)
        trainer = Forger(context, "trainer", addresses["dispatcher"])
        trainer.send(VersionReady(PERIODS, "f0" * 16, 1))
        trainer.send(RunDone(PERIODS, "f0" * 32, str(tmp_path / "nowhere")))
        trainer.send(Register("trainer", "tcp://127.0.0.1:9", key="0" * 32))
        publisher = Forger(context, "publisher", addresses["dispatcher"])
        publisher.send(Register("publisher", "tcp://127.0.0.1:9"))
        worker = Forger(context, "rollout-0", addresses["dispatcher"])
        worker.send(WorkRequest(1))
        worker.send(Register("rollout", proof="a guess"))
        to_trainer = Forger(context, "rollout-0", addresses["trainer"])  # held: linger 0 drops on close
        to_trainer.send(group(0))
        wait_until(lambda: claims_refused(run, {"trainer", "publisher", "rollout-0"}), 60, "claims", run.proc)
        refused_by(run, "trainer", "rollout-0", "group_result")
        for forger in (trainer, publisher, worker):  # each claimant was told to stop, and why
            assert forger.sock.poll(30_000), forger.name
            reply = decode_frames(forger.sock.recv_multipart()).message
            while not isinstance(reply, Shutdown):  # the dispatcher's heartbeats probing a route
                assert forger.sock.poll(30_000), forger.name
                reply = decode_frames(forger.sock.recv_multipart()).message
            assert "registration refused" in reply.reason
        assert run.proc.poll() is None, "the run ended before the attempts were refused"
        assert_clean_end(run, clean)
    finally:
        run.kill()
    log = events(run.out, "dispatcher")
    strangers = {(e["peer"], e["type"]) for e in log if e["event"] == "message_from_unregistered_peer"}
    assert strangers == {("trainer", "version_ready"), ("trainer", "run_done"), ("rollout-0", "work_request")}
    claims = [e for e in log if e["event"] == "message_refused" and e["type"] == "register"]
    assert {e["peer"]: "registered by a live" in e["reason"] for e in claims} == {
        "trainer": True,
        "publisher": True,
        "rollout-0": True,
    }
    assert [e for e in log if e["event"] == "worker_lost"] == []
    assert [e["sha256"] for e in log if e["event"] == "run_done"] == [clean]
    assert [e["peer"] for e in log if e["event"] == "peer_joined"].count("rollout-0") == 1
    ended = [e for e in events(run.out, "rollout-0") if e["event"] == "worker_stopped"]
    assert len(ended) == 1 and ended[0]["groups_sent"] == PERIODS * 4  # it served the whole run
