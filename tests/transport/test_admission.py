"""A frame is sized before it is decoded, on real loopback sockets: strangers on many connections send
large well-formed groups without their tickets; none is decoded, each is refused with the reason, and
an assigned worker's large group and every heartbeat still get through."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import zmq

from cadence.transport.zmq_socket import ZmqNetwork
from cadence.wire.messages import GroupResult, Heartbeat, Peek, encode
from cadence.wire.roles import ticket, valid_ticket

pytestmark = pytest.mark.timeout(300)

RUN = "admission"
KEY = "k" * 32
CONNECTIONS = 24
FRAMES = 4  # each connection's
ROWS = 16_000  # about 2.3 MiB a group


@pytest.fixture
async def net() -> AsyncIterator[ZmqNetwork]:
    network = ZmqNetwork(run=RUN, max_frame_bytes=8 << 20, receive_queue=4)
    try:
        yield network
    finally:
        network.close()


def _group(prompt_id: int, shown: str) -> GroupResult:
    rows = [[7] * 16] * ROWS
    return GroupResult(0, 0, prompt_id, [1], rows, [[-0.5] * 16] * ROWS, [1.0], [1.0], 0.0, 0.0, 0.0,
                       ticket=shown)  # fmt: skip


def _proves(route: bytes, seen: Peek) -> str | None:
    p = seen.proof
    if seen.tag != "group_result":
        return f"no {seen.tag} this large"
    ok = valid_ticket(KEY, p.ticket, "assignment", p.period, p.prompt_id, seen.sender)
    return None if ok else f"no assignment of prompt {p.prompt_id} to {seen.sender}"


def _strangers(address: str) -> int:
    """`CONNECTIONS` connections, each handing over `FRAMES` forged groups; how many went out."""
    frame = encode(_group(1, "forged"), "stranger", RUN)
    ctx = zmq.Context()
    socks = []
    for _ in range(CONNECTIONS):
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 20_000)
        sock.connect(address)
        socks.append(sock)
    for sock in socks:
        for _ in range(FRAMES):
            sock.send(frame, copy=False)
    for sock in socks:
        sock.close()  # lingers until its frames are out
    ctx.term()
    return CONNECTIONS * FRAMES


async def test_strangers_large_frames_are_refused_undecoded_and_a_ticketed_one_is_taken(
    net: ZmqNetwork,
) -> None:
    server = net.bind("trainer", "tcp://127.0.0.1:*")
    server.admission.proves = _proves
    worker = net.connect("worker-0", server.address)
    taken: list[str] = []

    async def receive() -> None:
        while True:
            _, env = await server.recv()
            taken.append(env.message.TAG)

    reading = asyncio.create_task(receive())
    try:
        flood = asyncio.create_task(asyncio.to_thread(_strangers, server.address))
        await worker.send(_group(5, ticket(KEY, "assignment", 0, 5, "worker-0")))
        deadline = time.monotonic() + 240
        # each forged group is refused undecoded, or dropped unread once the refused bytes of all the
        # routes together pass their budget (`budget.py`)
        while (
            not flood.done()
            or server.admission.undecoded + server.budget.dropped < CONNECTIONS * FRAMES
            or not taken
        ):
            assert time.monotonic() < deadline, (server.admission.undecoded, server.budget.dropped, taken)
            await worker.send(Heartbeat("rollout"))
            await asyncio.sleep(0.05)
        sent = await flood
    finally:
        reading.cancel()
        worker.close()
    assert "group_result" in taken and "heartbeat" in taken
    assert taken.count("group_result") == 1  # the ticketed one; not one forged group was decoded
    assert (
        server.admission.undecoded + server.budget.dropped == sent
        and server.admission.undecoded == server.refused
    )


async def test_a_registered_route_s_large_frames_are_decoded_and_another_s_are_not(net: ZmqNetwork) -> None:
    server = net.bind("dispatcher", "tcp://127.0.0.1:*")
    known = net.connect("worker-0", server.address)
    stranger = net.connect("stranger", server.address)
    server.admission.known = lambda route: route == known.route
    taken: list[GroupResult] = []

    async def receive() -> None:
        while True:
            _, env = await server.recv()
            assert isinstance(env.message, GroupResult) and env.sender == "worker-0"
            taken.append(env.message)

    reading = asyncio.create_task(receive())
    try:
        await stranger.send(_group(1, ""))
        await known.send(_group(2, ""))
        deadline = time.monotonic() + 60
        while not taken or server.refused < 1:  # in whichever order they come
            assert time.monotonic() < deadline and not reading.done()
            await asyncio.sleep(0.02)
    finally:
        reading.cancel()
        known.close()
        stranger.close()
    assert [g.prompt_id for g in taken] == [2]
    assert server.refused == 1 and server.admission.undecoded == 1
