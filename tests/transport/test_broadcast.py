"""The gloo weight broadcast on real loopback sockets: a `Publisher` with a `BroadcastRoot`, members on
ZeroMQ clients, torch.distributed groups formed over a real `TCPStore`.

Members join, a version reaches all of them bit for bit; a member added later pulls until the next
version, then is in a new generation; a member that dies is named, dropped, and the next version
reaches the rest. Timeouts are short bounds on waiting, never timing claims.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest
import structlog
import torch

from cadence.actors.publisher import Publisher
from cadence.transport.broadcast import BroadcastMember, BroadcastRoot
from cadence.transport.heartbeat import Liveness
from cadence.transport.session import Session
from cadence.transport.weights import WeightStore, pull_weights
from cadence.transport.zmq_socket import ZmqNetwork
from cadence.wire.messages import BroadcastJoin, Register

ADDRESS = "tcp://127.0.0.1:*"
WAIT = 20.0
TIMEOUT_S = 3.0  # each broadcast step's bound: a dead member is found within this

pytestmark = pytest.mark.timeout(90)


def weights(step: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return {
        "model.embed_tokens.weight": torch.randn(50, 16, generator=g),
        "model.norm.weight": torch.randn(16, generator=g).to(torch.bfloat16),
        "model.layers.0.mlp.up_proj.weight": torch.randn(40, 16, generator=g),
        "counter": torch.tensor([step], dtype=torch.int64),
    }


@dataclass
class Rig:
    net: ZmqNetwork
    publisher: Publisher
    root: BroadcastRoot
    tasks: list[asyncio.Future[None]]

    def member(self, name: str) -> tuple[BroadcastMember, asyncio.Future[None]]:
        member = BroadcastMember(name)
        task = asyncio.ensure_future(member.run(self.net.connect(name, self.publisher.server.address)))
        self.tasks.append(task)
        return member, task


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    net = ZmqNetwork(run="bcast")
    tasks: list[asyncio.Future[None]] = []
    try:
        dispatcher = net.bind("dispatcher", ADDRESS)
        server = net.bind("publisher", ADDRESS)
        # bucket of 4 KiB: the tensors spread over several buckets
        root = BroadcastRoot(server, "gloo", "127.0.0.1", "", 0, 4096, TIMEOUT_S, "bcast")
        liveness = Liveness(interval_s=0.05, liveness=2000, clock=time.monotonic)
        session = Session(net.connect("publisher", dispatcher.address), "publisher", liveness, server.address)
        publisher = Publisher(server, session, WeightStore(1 << 16, 2), root)
        tasks.append(asyncio.ensure_future(publisher.run()))
        _, env = await asyncio.wait_for(dispatcher.recv(), WAIT)
        assert isinstance(env.message, Register)
        yield Rig(net, publisher, root, tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        net.close()


async def until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.01)


async def joined(root: BroadcastRoot, *names: str) -> None:
    await until(lambda: set(names) <= set(root.members))


def assert_equal(got: dict[str, torch.Tensor] | None, want: dict[str, torch.Tensor]) -> None:
    assert got is not None
    assert set(got) == set(want)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape
        assert torch.equal(got[name], tensor), name


async def test_a_version_reaches_every_member_bit_for_bit(rig: Rig) -> None:
    a, _ = rig.member("worker-a")
    b, _ = rig.member("worker-b")
    await joined(rig.root, "worker-a", "worker-b")
    await rig.publisher.publish(0, b"zero", weights(0))
    assert_equal(await a.weights(0, WAIT), weights(0))
    assert_equal(await b.weights(0, WAIT), weights(0))
    assert rig.root.generation == 1
    await rig.publisher.publish(1, b"one", weights(1))  # the same group again
    assert_equal(await b.weights(1, WAIT), weights(1))
    assert rig.root.generation == 1


async def test_a_member_added_later_pulls_first_then_joins_the_next_generation(rig: Rig) -> None:
    a, _ = rig.member("worker-a")
    await joined(rig.root, "worker-a")
    await rig.publisher.publish(0, b"zero", weights(0))
    c, _ = rig.member("worker-c")
    await joined(rig.root, "worker-c")
    assert await c.weights(0, 0.1) is None  # joined after version 0 went out: it pulls that one
    assert c.from_version == 1
    await rig.publisher.publish(1, b"one", weights(1))
    assert rig.root.generation == 2 and rig.root.roster == ["worker-a", "worker-c"]
    assert_equal(await a.weights(1, WAIT), weights(1))
    assert_equal(await c.weights(1, WAIT), weights(1))


async def test_a_dead_member_is_named_dropped_and_the_rest_go_on(rig: Rig) -> None:
    a, _ = rig.member("worker-a")
    b, b_task = rig.member("worker-b")
    await joined(rig.root, "worker-a", "worker-b")
    await rig.publisher.publish(0, b"zero", weights(0))
    assert_equal(await b.weights(0, WAIT), weights(0))
    b_task.cancel()  # worker-b stops answering: its group goes with it
    await asyncio.gather(b_task, return_exceptions=True)
    b._group = None
    with structlog.testing.capture_logs() as logs:
        await rig.publisher.publish(1, b"one", weights(1))
    failed = [e for e in logs if e["event"] == "broadcast_failed" and "missing" in e]  # the root's
    assert failed and "worker-b" in failed[0]["missing"]
    assert "worker-b" not in rig.root.members
    got = await a.weights(1, WAIT)
    if got is None:  # worker-a lost version 1 with the group (it pulls that one) and joins again
        await until(lambda: a.from_version == 2)
    else:
        assert_equal(got, weights(1))
    await rig.publisher.publish(2, b"two", weights(2))
    assert rig.root.roster == ["worker-a"]
    assert_equal(await a.weights(2, WAIT), weights(2))


async def test_a_publisher_without_broadcast_refuses_a_join_and_keeps_serving() -> None:
    net = ZmqNetwork(run="bcast")
    task = None
    try:
        dispatcher = net.bind("dispatcher", ADDRESS)
        server = net.bind("publisher", ADDRESS)
        liveness = Liveness(interval_s=0.05, liveness=2000, clock=time.monotonic)
        session = Session(net.connect("publisher", dispatcher.address), "publisher", liveness, server.address)
        publisher = Publisher(server, session, WeightStore(64, 2))
        task = asyncio.ensure_future(publisher.run())
        worker = net.connect("worker-a", server.address)
        with structlog.testing.capture_logs() as logs:
            await worker.send(BroadcastJoin("worker-a"))
            await publisher.publish(3, b"x" * 100)
            assert await pull_weights(worker, 3, WAIT) == b"x" * 100
        assert any(e["event"] == "broadcast_not_offered" for e in logs)
    finally:
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        net.close()


async def test_a_member_too_slow_to_confirm_is_told_it_was_dropped_and_joins_again(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow, _ = rig.member("worker-slow")
    await joined(rig.root, "worker-slow")
    receive = BroadcastMember._receive

    def late(self: BroadcastMember, msg: Any) -> dict[str, torch.Tensor]:
        time.sleep(TIMEOUT_S + 0.5)  # the root stops waiting for the confirmation before this
        return receive(self, msg)

    monkeypatch.setattr(BroadcastMember, "_receive", late)
    with structlog.testing.capture_logs() as logs:
        await rig.publisher.publish(0, b"zero", weights(0))
        await until(lambda: slow.from_version == 1)  # told, it joined again for the next version
    events = [e["event"] for e in logs]
    assert "broadcast_failed" in events and "broadcast_dropped" in events
    monkeypatch.setattr(BroadcastMember, "_receive", receive)
    await rig.publisher.publish(1, b"one", weights(1))
    assert_equal(await slow.weights(1, WAIT), weights(1))
