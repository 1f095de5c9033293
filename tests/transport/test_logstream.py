"""Log streaming on real loopback sockets: actors to the dispatcher's hub, the hub to followers."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cadence.log import LogStream
from cadence.monitor import logstream
from cadence.monitor.logstream import LogBounds, LogHub, stream_logs
from cadence.transport.zmq_socket import ZmqNetwork
from cadence.wire.messages import Heartbeat, LogBatch, Subscribe

pytestmark = pytest.mark.timeout(30)
WAIT = 5.0


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def net() -> AsyncIterator[ZmqNetwork]:
    network = ZmqNetwork(run="run-logs")
    try:
        yield network
    finally:
        network.close()


async def serve(hub: LogHub) -> None:
    """What the dispatcher does with these two message types."""
    while True:
        peer, env = await hub.server.recv()
        if isinstance(env.message, LogBatch):
            await hub.batch(env.message)
        elif isinstance(env.message, Subscribe):
            await hub.subscribe(peer, env.sender, env.message)


def line(actor: str, n: int) -> str:
    return json.dumps({"time": float(n), "actor": actor, "level": "info", "event": f"e{n}"})


async def test_remote_actors_are_written_local_ones_are_not_and_followers_get_backlog_then_live(
    net: ZmqNetwork, tmp_path: Path
) -> None:
    clock = Clock()
    server = net.bind("dispatcher", "tcp://127.0.0.1:*")
    hub = LogHub(server, tmp_path / "logs", clock, lease_s=5.0, backlog=3)
    serving = asyncio.create_task(serve(hub))
    try:
        remote = net.connect("rollout-far", server.address)
        local = net.connect("trainer", server.address)
        here = socket.gethostname()
        own = str((tmp_path / "logs" / "trainer.jsonl").resolve())
        # one at a time: two sockets' messages have no order between them
        for client, batch in (
            (remote, LogBatch("rollout-far", "other-host", "/elsewhere/x.jsonl", [line("r", 1), "junk"])),
            (local, LogBatch("trainer", here, own, [line("trainer", 2)])),
            (remote, LogBatch("rollout-far", "other-host", "/elsewhere/x.jsonl", [line("r", 3)])),
            (local, LogBatch("trainer", here, own, [line("trainer", 4)])),
        ):
            await client.send(batch)
            while batch.lines[0] not in hub.backlog:
                await asyncio.sleep(0.01)
        written = (tmp_path / "logs" / "rollout-far.jsonl").read_text().splitlines()
        assert [json.loads(x)["event"] for x in written] == ["e1", "e3"]  # junk refused, order kept
        assert not (tmp_path / "logs" / "trainer.jsonl").exists()  # it writes that file itself

        follower = net.connect("follower", server.address)
        await follower.send(Subscribe(backlog=2))
        first = await asyncio.wait_for(follower.recv(), WAIT)
        assert isinstance(first.message, LogBatch) and first.message.lines == [
            line("r", 3),
            line("trainer", 4),
        ]
        await remote.send(LogBatch("rollout-far", "other-host", "/elsewhere/x.jsonl", [line("r", 5)]))
        live = await asyncio.wait_for(follower.recv(), WAIT)
        assert isinstance(live.message, LogBatch) and live.message.lines == [line("r", 5)]

        clock.now += 6.0  # the follower never renewed: its lease ran out
        await hub.tick()
        assert hub.followers == {}
        await remote.send(LogBatch("rollout-far", "other-host", "/elsewhere/x.jsonl", [line("r", 6)]))
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(follower.recv(), 0.3)
    finally:
        serving.cancel()
        hub.close()


async def test_an_actor_streams_its_lines_and_the_rest_on_cancel(net: ZmqNetwork, tmp_path: Path) -> None:
    server = net.bind("dispatcher", "tcp://127.0.0.1:*")
    client = net.connect("rollout-0.logs", server.address)
    stream = LogStream("rollout-0", "/x/rollout-0.jsonl")
    for n in range(3):
        stream.put(line("rollout-0", n))
    task = asyncio.create_task(stream_logs(client, stream, interval_s=0.05))
    _, env = await asyncio.wait_for(server.recv(), WAIT)
    assert isinstance(env.message, LogBatch)
    assert env.message.actor == "rollout-0" and len(env.message.lines) == 3
    stream.put(line("rollout-0", 9))
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    _, env = await asyncio.wait_for(server.recv(), WAIT)
    assert isinstance(env.message, LogBatch) and env.message.lines == [line("rollout-0", 9)]


async def test_a_follower_hears_the_dispatcher_while_no_actor_logs(net: ZmqNetwork, tmp_path: Path) -> None:
    server = net.bind("dispatcher", "tcp://127.0.0.1:*")
    hub = LogHub(server, tmp_path / "logs", Clock(), lease_s=5.0)
    serving = asyncio.create_task(serve(hub))
    try:
        follower = net.connect("follower", server.address)
        for _ in range(2):  # the first subscription (nothing to send back yet), then a renewal
            await follower.send(Subscribe(backlog=10))
            answer = await asyncio.wait_for(follower.recv(), WAIT)
            assert isinstance(answer.message, Heartbeat)
        assert len(hub.followers) == 1
    finally:
        serving.cancel()
        hub.close()


async def test_the_hub_holds_a_bounded_number_of_files_and_followers(
    net: ZmqNetwork, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(logstream, "MAX_FILES", 2)
    monkeypatch.setattr(logstream, "MAX_FOLLOWERS", 1)
    server = net.bind("dispatcher", "tcp://127.0.0.1:*")
    hub = LogHub(server, tmp_path / "logs", Clock(), lease_s=5.0)
    serving = asyncio.create_task(serve(hub))
    try:
        stranger = net.connect("stranger", server.address)
        for n, actor in enumerate(("a", "b", "c", "a")):  # one actor name more than the hub takes
            batch = LogBatch(actor, "far", "/x.jsonl", [line(actor, n)])
            await stranger.send(batch)
            while batch.lines[0] not in hub.backlog:  # passed on to followers, written or not
                await asyncio.sleep(0.01)
        assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == ["a.jsonl", "b.jsonl"]
        followers = [net.connect(f"follower-{i}", server.address) for i in range(2)]
        await followers[0].send(Subscribe())
        assert isinstance((await asyncio.wait_for(followers[0].recv(), WAIT)).message, Heartbeat)
        await followers[1].send(Subscribe())
        with pytest.raises(TimeoutError):  # not taken: the hub serves one follower
            await asyncio.wait_for(followers[1].recv(), 0.5)
        assert len(hub.followers) == 1
    finally:
        serving.cancel()
        hub.close()


async def test_the_hub_keeps_writes_and_passes_on_log_lines_within_their_byte_bounds(
    net: ZmqNetwork, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = net.bind("dispatcher", "tcp://127.0.0.1:*")
    bounds = LogBounds(line=200, batch=400, actor=600, run=800)
    hub = LogHub(server, tmp_path / "logs", Clock(), lease_s=5.0, bounds=bounds)
    serving = asyncio.create_task(serve(hub))
    try:
        stranger = net.connect("stranger", server.address)
        short = [line("big", n) for n in range(8)]  # 61 bytes each
        huge = json.dumps({"event": "x" * 1000})
        await stranger.send(LogBatch("big", "far", "/x.jsonl", [huge, *short]))  # a long line, then 8
        await stranger.send(LogBatch("big", "far", "/x.jsonl", short))
        deadline = asyncio.get_running_loop().time() + WAIT
        # the long line and 2 past the batch's 400 bytes (6 kept); then 5 past the name's 600 (3 kept)
        while hub.refused < 1 + 2 + 5:
            assert asyncio.get_running_loop().time() < deadline, hub.refused
            await asyncio.sleep(0.01)
        written = (tmp_path / "logs" / "big.jsonl").read_text().splitlines()
        assert len(written) == len(hub.backlog) == 6 + 3 and hub.refused == 8
        assert hub.bytes["big"] == 9 * 61 and huge not in hub.backlog
        # another name: the run's 800 bytes hold 4 more lines of 61 (549 + 244), where the batch held 6
        other = [line("big", n) for n in range(8)]
        await stranger.send(LogBatch("other", "far", "/x.jsonl", other))
        while hub.refused < 8 + 1:
            assert asyncio.get_running_loop().time() < deadline + WAIT, hub.refused
            await asyncio.sleep(0.01)
        assert hub.bytes["other"] == 4 * 61 and hub.total == 13 * 61 and hub.refused == 12
    finally:
        serving.cancel()
        hub.close()


async def test_followers_that_never_read_share_one_encoding_of_the_backlog(
    net: ZmqNetwork, tmp_path: Path
) -> None:
    """Eight followers ask for a backlog of 8 MiB and never read: the hub encodes each block of it
    once, and every follower's queue holds those same frames, not a copy of its own; one that reads
    gets the lines asked for, in order."""
    server = net.bind("dispatcher", "tcp://127.0.0.1:*")
    hub = LogHub(server, tmp_path / "logs", Clock(), lease_s=60.0, backlog=1000)
    lines = [json.dumps({"event": f"e{n}", "pad": "p" * 32_000}) for n in range(256)]
    hub.backlog.extend(lines)
    blocks = len(hub.backlog.frames(1000))
    made = hub.backlog.encodings
    serving = asyncio.create_task(serve(hub))
    clients = [net.connect(f"follower-{i}", server.address) for i in range(9)]
    try:
        for client in clients[:8]:
            await client.send(Subscribe(backlog=1000))
        deadline = asyncio.get_running_loop().time() + 30
        while len(hub.followers) < 8:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.02)
        assert hub.backlog.encodings == made and blocks >= 8  # one encoding a block, for all of them
        await clients[8].send(Subscribe(backlog=100))
        got: list[str] = []
        while len(got) < 100:
            env = await asyncio.wait_for(clients[8].recv(), WAIT)
            assert isinstance(env.message, LogBatch)
            got += env.message.lines
        assert got == lines[-100:]
    finally:
        serving.cancel()
        hub.close()
