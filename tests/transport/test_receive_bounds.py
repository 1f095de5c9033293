"""What a peer can make a socket hold, on real loopback sockets: a connection's queue stops at the
socket's receive queue, however much the peer sends, and a frame far past the limit is never read."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import AsyncIterator

import pytest
import structlog
import zmq

from cadence.transport.zmq_socket import ZmqNetwork

pytestmark = pytest.mark.timeout(60)

FRAME = 1 << 20
"""Each flooding frame: 1 MiB, within the limit: garbage the codec refuses once it is read."""

# A peer that hands ZeroMQ up to 400 frames of 1 MiB without waiting, each as soon as its own queue
# of 4 has room, until none went out for a second; prints how many went.
SENDER = """
import sys, time, zmq
ctx = zmq.Context()
sock = ctx.socket(zmq.DEALER)
sock.setsockopt(zmq.LINGER, 0)
sock.setsockopt(zmq.SNDHWM, 4)
sock.connect(sys.argv[1])
frame = b"x" * int(sys.argv[2])
sent, last = 0, time.monotonic()
while sent < 400 and time.monotonic() - last < 1.0:
    try:
        sock.send(frame, zmq.NOBLOCK)
        sent, last = sent + 1, time.monotonic()
    except zmq.Again:
        time.sleep(0.001)
print(sent, flush=True)
sock.close()
ctx.term()
"""


@pytest.fixture
async def net() -> AsyncIterator[ZmqNetwork]:
    network = ZmqNetwork(run="bounds", max_frame_bytes=2 * FRAME, receive_queue=4)
    try:
        yield network
    finally:
        network.close()


def _flood(address: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", SENDER, address, str(FRAME)], capture_output=True, text=True, timeout=50
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


async def test_a_connection_that_is_not_read_holds_at_most_its_receive_queue(net: ZmqNetwork) -> None:
    server = net.bind("trainer", "tcp://127.0.0.1:*")
    # nothing here reads: what the peer got out is what its queue, this socket's and the kernel's hold
    sent = await asyncio.to_thread(_flood, server.address)
    # 4 queued there, 4 here, and a few frames' worth in the kernel's buffers: far from the 400 tried
    assert 4 <= sent <= 4 + 4 + 16, sent
    reading = asyncio.create_task(server.recv())  # garbage all: refused one by one, never returned
    try:
        deadline = time.monotonic() + 20
        seen, since = -1, time.monotonic()
        while time.monotonic() < deadline:  # the queue here is read out, then nothing more comes
            if server.refused != seen:
                seen, since = server.refused, time.monotonic()
            elif seen > 0 and time.monotonic() - since > 1.0:
                break
            await asyncio.sleep(0.05)
    finally:
        reading.cancel()
    # the sender is gone: what it had not handed over is lost; what was here is read and refused
    assert 4 <= server.refused <= sent


async def test_a_peer_past_its_budget_of_refused_bytes_is_dropped_unread_and_others_are_not(
    net: ZmqNetwork,
) -> None:
    from cadence.transport.budget import RefusedBudget
    from cadence.wire.messages import Heartbeat

    server = net.bind("trainer", "tcp://127.0.0.1:*")
    server.budget = RefusedBudget(4 * FRAME, clock=lambda: 0.0)  # one window, however long this takes
    with structlog.testing.capture_logs() as logs:
        reading = asyncio.create_task(server.recv())
        sent = await asyncio.to_thread(_garbage, server.address, 20)
        deadline = time.monotonic() + 20
        while server.refused + server.budget.dropped < 20:  # every frame is either refused or dropped
            assert time.monotonic() < deadline and not reading.done()
            await asyncio.sleep(0.01)
        honest = net.connect("worker", server.address)
        await honest.send(Heartbeat("rollout"))
        peer, env = await asyncio.wait_for(reading, 20)
    assert sent == 20 and isinstance(env.message, Heartbeat) and env.sender == "worker"
    # 1, 2, 3, 4 MiB refused within the budget, the 5th past it; the other 15 dropped unread
    assert server.refused == 5 and server.budget.dropped == 15
    muted = [e for e in logs if e["event"] == "peer_muted"]
    assert len(muted) == 1 and muted[0]["refused_bytes_per_s"] == 4 * FRAME


def test_a_route_s_budget_starts_anew_each_window() -> None:
    from cadence.transport.budget import RefusedBudget

    now = [0.0]
    budget = RefusedBudget(100, clock=lambda: now[0])
    assert not budget.charge(b"a", 60) and not budget.muted(b"a")
    assert budget.charge(b"a", 60) and budget.muted(b"a") and not budget.muted(b"b")
    assert not budget.charge(b"a", 60)  # said once a window
    now[0] = 1.0
    assert not budget.muted(b"a") and not budget.charge(b"a", 60) and budget.dropped == 1


def _garbage(address: str, frames: int) -> int:
    """`frames` frames of 1 MiB that are not msgpack, from one connection; how many went out."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 5000)
    sock.connect(address)
    for _ in range(frames):
        sock.send(b"\xc1" * FRAME)
    sock.close()  # lingers until they are out
    ctx.term()
    return frames


def test_many_routes_refused_together_are_muted_past_their_budget_together() -> None:
    from cadence.transport.budget import TOGETHER, RefusedBudget

    budget = RefusedBudget(100, clock=lambda: 0.0)
    routes = [f"stranger-{i}".encode() for i in range(TOGETHER * 100 // 40 + 2)]
    muted = [budget.charge(route, 40) for route in routes]  # each well within its own budget
    assert muted == [False] * (TOGETHER * 100 // 40) + [True, True]
    assert budget.muted(routes[-1]) and not budget.muted(b"never-refused")
