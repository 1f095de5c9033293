"""ZeroMQ channels and weight pulls on real loopback sockets.

Every test binds `tcp://127.0.0.1:*` (a random port) and closes its sockets and context: a server
that meets garbage, a hostile peer or a silent publisher keeps working or fails with `WeightError`.
"""

from __future__ import annotations

import asyncio
import random
import stat
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest
import structlog
import zmq
import zmq.asyncio

from cadence.actors.publisher import Publisher
from cadence.transport.buffers import BufferPool
from cadence.transport.endpoint import RefusalLog, Server
from cadence.transport.heartbeat import Liveness
from cadence.transport.session import Session
from cadence.transport.weights import (
    WeightError,
    WeightStore,
    digest,
    pull_weights,
    upload_weights,
)
from cadence.transport.zmq_socket import ZmqNetwork, ZmqServer, cut_off
from cadence.wire.messages import (
    Assignment,
    Heartbeat,
    Message,
    Register,
    Shutdown,
    TrainerKey,
    WeightChunk,
    WeightChunkRequest,
    WeightMeta,
    WeightQuery,
    WeightUpload,
    WorkRequest,
    encode,
    encode_frames,
)
from cadence.wire.roles import upload_ticket

RUN = "run-a"
ADDRESS = "tcp://127.0.0.1:*"
WAIT = 5.0  # a bound on waiting for a message that should come; never a timing claim

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
async def net() -> AsyncIterator[ZmqNetwork]:
    network = ZmqNetwork(run=RUN, max_frame_bytes=2048)
    try:
        yield network
    finally:
        network.close()


@pytest.fixture
async def rogue(net: ZmqNetwork) -> AsyncIterator[zmq.asyncio.Socket]:
    """A raw DEALER socket that bypasses the codec; its identity is b'rogue'."""
    sock = net.ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IDENTITY, b"rogue")
    try:
        yield sock
    finally:
        sock.close(linger=0)


async def recv_from(server: Server) -> tuple[bytes, Any]:
    return await asyncio.wait_for(server.recv(), WAIT)


async def test_bound_address_has_a_real_port(net: ZmqNetwork) -> None:
    server = net.bind("srv", ADDRESS)
    assert server.address.startswith("tcp://127.0.0.1:")
    assert int(server.address.rsplit(":", 1)[1]) > 0


async def test_a_server_also_serves_its_own_host_through_a_private_unix_socket(net: ZmqNetwork) -> None:
    server = net.bind("publisher", ADDRESS)
    local = server.bind_local()
    assert local.startswith("ipc://") and local.endswith("/publisher.sock")
    folder = Path(local.removeprefix("ipc://")).parent
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700  # only this user's processes reach it
    for name, address in (("worker-1", local), ("worker-2", server.address)):  # one socket, both ways
        client = net.connect(name, address)
        await client.send(WorkRequest(1))
        peer, env = await recv_from(server)
        assert (peer, env.message) == (client.route, WorkRequest(1))
        await server.send(peer, Shutdown("bye"))
        assert (await asyncio.wait_for(client.recv(), WAIT)).message == Shutdown("bye")
    server.close()
    assert not folder.exists()


async def test_client_request_and_reply_routed_by_peer_id(net: ZmqNetwork) -> None:
    server = net.bind("dispatcher", ADDRESS)
    client = net.connect("worker-1", server.address)
    await client.send(WorkRequest(3))
    peer, env = await recv_from(server)
    assert peer == client.route and peer.startswith(b"worker-1#") and len(peer) == len(b"worker-1#") + 24
    assert net.connect("worker-1", server.address).route != peer  # a route is new for every client
    assert (env.message, env.sender, env.run) == (WorkRequest(3), "worker-1", RUN)

    reply = Assignment(period=2, version=2, prompt_id=9, prompt="1+2=", answer="3", group_size=4)
    await server.send(peer, reply)
    got = await asyncio.wait_for(client.recv(), WAIT)
    assert (got.message, got.sender, got.run) == (reply, "dispatcher", RUN)
    assert server.refused == 0 and client.refused == 0


async def test_two_clients_are_told_apart(net: ZmqNetwork) -> None:
    server = net.bind("dispatcher", ADDRESS)
    first = net.connect("worker-1", server.address)
    second = net.connect("worker-2", server.address)
    await first.send(WorkRequest(1))
    await second.send(WorkRequest(2))
    seen = {}
    for _ in range(2):
        peer, env = await recv_from(server)
        seen[peer] = env.message
    assert seen == {first.route: WorkRequest(1), second.route: WorkRequest(2)}

    # answer in the opposite order: each reply reaches only its own client
    await server.send(second.route, Shutdown("for two"))
    await server.send(first.route, Shutdown("for one"))
    assert (await asyncio.wait_for(first.recv(), WAIT)).message == Shutdown("for one")
    assert (await asyncio.wait_for(second.recv(), WAIT)).message == Shutdown("for two")


async def test_a_socket_that_borrows_a_clients_name_gets_none_of_its_replies(net: ZmqNetwork) -> None:
    """A ROUTER hands a route over to the newest connection presenting it; the route is the name and a
    random token, so a socket presenting the name (or the name and a guess) takes nothing."""
    server = net.bind("dispatcher", ADDRESS)
    client = net.connect("worker-1", server.address)
    await client.send(WorkRequest(1))
    peer, _ = await recv_from(server)
    ctx = net.ctx
    borrowers = []
    for route in (b"worker-1", b"worker-1#" + b"0" * 24):
        borrower = ctx.socket(zmq.DEALER)
        borrower.setsockopt(zmq.LINGER, 0)
        borrower.setsockopt(zmq.IDENTITY, route)
        borrower.connect(server.address)
        await borrower.send_multipart(encode_frames(WorkRequest(9), "worker-1", RUN))
        borrowers.append(borrower)
    for _ in borrowers:
        other, env = await recv_from(server)
        assert other != peer and env.sender == "worker-1"
    await server.send(peer, Shutdown("for worker-1"))
    assert (await asyncio.wait_for(client.recv(), WAIT)).message == Shutdown("for worker-1")
    for borrower in borrowers:
        assert await borrower.poll(100) == 0
        borrower.close(linger=0)


async def test_a_server_tells_whether_a_route_is_still_connected(net: ZmqNetwork) -> None:
    server = net.bind("dispatcher", ADDRESS)
    client = net.connect("worker-1", server.address)
    await client.send(WorkRequest(1))
    peer, _ = await recv_from(server)
    assert server.reachable(peer) and not server.reachable(b"worker-1")
    assert (await asyncio.wait_for(client.recv(), WAIT)).message == Heartbeat("dispatcher")  # what it sent
    client.close()
    deadline = asyncio.get_running_loop().time() + WAIT
    while server.reachable(peer):  # the disconnection reaches the server a moment later
        assert asyncio.get_running_loop().time() < deadline, "the closed client's route is still there"
        await asyncio.sleep(0.01)
    await server.send(peer, Shutdown("gone"))  # dropped, as before: the server goes on


async def test_reply_to_an_unknown_peer_is_dropped_and_the_server_goes_on(net: ZmqNetwork) -> None:
    server = net.bind("dispatcher", ADDRESS)
    client = net.connect("worker-1", server.address)
    await server.send(b"nobody", Shutdown("lost"))
    await client.send(WorkRequest(1))
    peer, _ = await recv_from(server)
    await server.send(peer, Shutdown("found"))
    assert (await asyncio.wait_for(client.recv(), WAIT)).message == Shutdown("found")


async def test_hostile_frames_are_refused_logged_and_the_server_keeps_working(
    net: ZmqNetwork, rogue: zmq.asyncio.Socket
) -> None:
    server = net.bind("dispatcher", ADDRESS)
    rogue.connect(server.address)
    wrong_proto = msgpack.packb(
        {"type": "work_request", "proto": 99, "run": RUN, "sender": "rogue", "body": {"credits": 1}}
    )
    oversized = encode(Shutdown("x" * 3000), "rogue", RUN)
    assert 2048 < len(oversized) < cut_off(2048)  # above the codec's limit, below libzmq's cut-off
    with structlog.testing.capture_logs() as logs:
        await rogue.send(b"\x93garbage that is not msgpack")
        await rogue.send_multipart([encode(WorkRequest(1), "rogue", RUN), b"second frame"])
        await rogue.send(oversized)
        await rogue.send(encode(WorkRequest(1), "rogue", "run-b"))
        await rogue.send(wrong_proto)
        await rogue.send(encode(WorkRequest(7), "rogue", RUN))
        peer, env = await recv_from(server)

    # frames of one peer arrive in order: all five bad ones were seen before the good one
    assert (peer, env.message) == (b"rogue", WorkRequest(7))
    assert server.refused == 5
    refused = [e for e in logs if e["event"] == "message_refused"]
    assert len(refused) == 5
    assert {e["peer"] for e in refused} == {"rogue"}
    assert all(e["channel"] == "dispatcher" for e in refused)
    reasons = [e["reason"] for e in refused]
    assert "not msgpack" in reasons[0]
    assert "expected 1 frame, got 2" in reasons[1]
    assert "exceeds the limit of 2048" in reasons[2]
    assert "run 'run-b'" in reasons[3] and refused[3]["sender"] == "rogue"
    assert "protocol version 99" in reasons[4]
    assert [e["refused_total"] for e in refused] == [1, 2, 3, 4, 5]

    # and an ordinary client is still served
    client = net.connect("worker-1", server.address)
    await client.send(WorkRequest(2))
    peer, env = await recv_from(server)
    assert (peer, env.message) == (client.route, WorkRequest(2))
    assert server.refused == 5


async def test_a_flood_waiting_on_a_socket_leaves_the_other_tasks_their_turns(
    net: ZmqNetwork, rogue: zmq.asyncio.Socket
) -> None:
    """Frames already waiting are received without a turn of the event loop; the server yields one
    for each, so a peer faster than this process cannot starve its heartbeats and its work."""
    server = net.bind("dispatcher", "inproc://flooded")
    rogue.connect(server.address)
    flood = 500
    for _ in range(flood):  # in-process: every frame is waiting on the server before it reads one
        await rogue.send(b"\x93garbage that is not msgpack")
    await rogue.send(encode(WorkRequest(7), "rogue", RUN))
    turns = 0

    async def other() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    beside = asyncio.create_task(other())
    try:
        peer, env = await recv_from(server)
    finally:
        beside.cancel()
    assert (peer, env.message, server.refused) == (b"rogue", WorkRequest(7), flood)
    assert turns >= flood


async def test_payload_frames_that_disagree_with_their_header_are_refused_and_the_channel_goes_on(
    net: ZmqNetwork, rogue: zmq.asyncio.Socket
) -> None:
    server = net.bind("publisher", ADDRESS)
    rogue.connect(server.address)
    header, payload = encode_frames(WeightChunk(1, 0, b"\x07" * 100), "rogue", RUN)
    with structlog.testing.capture_logs() as logs:
        await rogue.send_multipart([header, b"\x07" * 99])  # announced 100, 99 came
        await rogue.send_multipart([header, b"\x07" * 101])
        await rogue.send_multipart([header])  # no payload at all
        await rogue.send_multipart(encode_frames(WeightChunk(1, 0, b"\x07" * 3000), "rogue", RUN))
        await rogue.send_multipart([encode(WorkRequest(1), "rogue", RUN), payload])
        await rogue.send_multipart([header, payload])  # the one good message
        peer, env = await recv_from(server)
    assert peer == b"rogue" and env.message == WeightChunk(1, 0, b"\x07" * 100)
    reasons = [e["reason"] for e in logs if e["event"] == "message_refused"]
    assert server.refused == len(reasons) == 5
    assert "payload frame of 99 bytes, the header announced 100" in reasons[0]
    assert "payload frame of 101 bytes, the header announced 100" in reasons[1]
    assert "expected 2 frames" in reasons[2]
    assert "announces a payload of 3000, not a size within 2048" in reasons[3]
    assert "expected 1 frame, got 2" in reasons[4]

    client = net.connect("worker-1", server.address)
    await client.send(WorkRequest(2))
    assert (await recv_from(server))[1].message == WorkRequest(2)


async def test_a_payload_reaches_a_client_as_the_bytes_sent(net: ZmqNetwork) -> None:
    server = net.bind("publisher", ADDRESS)
    client = net.connect("worker-1", server.address)
    await client.send(WorkRequest(1))
    peer, _ = await recv_from(server)
    data = payload(6000)
    await server.send(peer, WeightChunk(2, 5, memoryview(data)[1000:2000]))
    got = (await asyncio.wait_for(client.recv(), WAIT)).message
    assert isinstance(got, WeightChunk) and (got.version, got.index) == (2, 5)
    assert bytes(got.data) == data[1000:2000]


async def test_a_server_of_another_run_refuses_the_client(net: ZmqNetwork) -> None:
    other = ZmqNetwork(run="run-b")
    try:
        server = other.bind("stranger", ADDRESS)
        outsider = net.connect("worker-a", server.address)  # a client of run-a
        insider = other.connect("worker-b", server.address)
        await outsider.send(WorkRequest(1))
        await asyncio.sleep(0.05)  # order only: let the outsider's frame arrive first if it can
        await insider.send(WorkRequest(5))
        peer, env = await recv_from(server)
        assert (peer, env.message, env.run) == (insider.route, WorkRequest(5), "run-b")
        if server.refused == 0:  # the insider's frame overtook the outsider's: wait for the refusal
            receiving = asyncio.ensure_future(server.recv())
            deadline = time.monotonic() + WAIT
            while not server.refused and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            receiving.cancel()
            await asyncio.gather(receiving, return_exceptions=True)
        assert server.refused == 1
    finally:
        other.close()


# ---------------------------------------------------------------- weights over sockets


def payload(size: int = 5000) -> bytes:
    return random.Random(size).randbytes(size)


async def serve_weights(
    server: ZmqServer,
    store: WeightStore,
    corrupt: int | None = None,
    misindex: bool = False,
    short: int | None = None,
    reverse: int = 1,
    repeat: int | None = None,
    meta: WeightMeta | None = None,
) -> None:
    """A minimal publisher: meta for queries, chunks for chunk requests. Optionally one chunk with a
    flipped byte (`corrupt`), a wrong index, one byte short (`short`), or sent twice (`repeat`);
    answers in reverse order, `reverse` requests at a time; `meta` replaces the true one."""
    held: list[tuple[bytes, WeightChunk]] = []
    while True:
        peer, env = await server.recv()
        msg: Message = env.message
        if isinstance(msg, WeightQuery):
            await server.send(peer, meta or store.meta(msg.version))
        elif isinstance(msg, WeightChunkRequest):
            chunk = store.chunk(msg.version, msg.index)
            assert chunk is not None
            if msg.index == corrupt:
                flipped = bytes([chunk.data[0] ^ 0xFF]) + chunk.data[1:]
                chunk = WeightChunk(chunk.version, chunk.index, flipped)
            if msg.index == short:
                chunk = WeightChunk(chunk.version, chunk.index, chunk.data[:-1])
            if misindex and msg.index == 1:
                chunk = WeightChunk(chunk.version, 99, chunk.data)
            held.append((peer, chunk))
            last = msg.index == store.meta(msg.version).chunks - 1
            if len(held) == reverse or last:
                for to, answer in reversed(held):
                    await server.send(to, answer)
                    if answer.index == repeat:
                        await server.send(to, answer)
                held.clear()


async def pull_against(
    store: WeightStore,
    version: int,
    timeout_s: float = WAIT,
    alloc: Callable[[int], bytearray] | None = None,
    **serve: Any,
) -> bytearray:
    network = ZmqNetwork(run=RUN)
    task: asyncio.Future[None] | None = None
    try:
        server = network.bind("publisher", ADDRESS)
        task = asyncio.ensure_future(serve_weights(server, store, **serve))
        client = network.connect("worker-1", server.address)
        return await pull_weights(client, version, timeout_s=timeout_s, window=3, alloc=alloc)
    finally:
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        network.close()


async def test_pull_weights_returns_the_published_bytes() -> None:
    store = WeightStore(chunk_bytes=512, keep=2)
    data = payload()
    store.put(4, data)
    assert store.meta(4).chunks == 10
    assert await pull_against(store, 4) == data


async def test_a_pull_into_a_reused_buffer_gives_the_published_bytes_in_it() -> None:
    store = WeightStore(chunk_bytes=512, keep=2)
    data = payload()
    store.put(4, data)
    pool = BufferPool()
    pool.give(bytearray(b"\xee" * len(data)))  # a version loaded before: its pages are reused
    pulled = await pull_against(store, 4, alloc=pool.take, reverse=3, repeat=2)
    assert pool.reused == 1 and pulled == data


async def test_pull_of_a_version_not_held_raises() -> None:
    store = WeightStore(chunk_bytes=512, keep=2)
    store.put(4, payload())
    with pytest.raises(WeightError, match="does not hold version 3"):
        await pull_against(store, 3)


async def test_a_corrupted_chunk_fails_the_checksum() -> None:
    store = WeightStore(chunk_bytes=512, keep=2)
    store.put(4, payload())
    with pytest.raises(WeightError, match="version 4 .* failed its checksum"):
        await pull_against(store, 4, corrupt=6)


async def test_chunks_out_of_order_and_repeated_still_give_the_published_bytes() -> None:
    store = WeightStore(chunk_bytes=512, keep=2)
    data = payload()
    store.put(4, data)
    assert await pull_against(store, 4, reverse=3, repeat=2) == data


async def test_a_corrupted_chunk_out_of_order_fails_the_checksum() -> None:
    store = WeightStore(chunk_bytes=512, keep=2)
    store.put(4, payload())
    with pytest.raises(WeightError, match="version 4 .* failed its checksum"):
        await pull_against(store, 4, corrupt=0, reverse=3)


async def test_a_chunk_of_the_wrong_size_raises_weight_error() -> None:
    store = WeightStore(chunk_bytes=512, keep=2)
    store.put(4, payload())
    with pytest.raises(WeightError, match="chunk 3 of 511 bytes, expected 512"):
        await pull_against(store, 4, short=3)


async def test_meta_whose_chunks_cannot_hold_the_size_raises_weight_error() -> None:
    store = WeightStore(chunk_bytes=512, keep=2)
    store.put(4, payload())
    true = store.meta(4)
    meta = WeightMeta(4, True, 1 << 40, true.digest, true.chunk_bytes, true.chunks)
    with pytest.raises(WeightError, match="cannot hold"):
        await pull_against(store, 4, meta=meta)


async def test_a_chunk_with_a_wrong_index_raises_weight_error() -> None:
    store = WeightStore(chunk_bytes=512, keep=2)
    store.put(4, payload())
    with pytest.raises(WeightError):
        await pull_against(store, 4, misindex=True)


async def test_a_silent_publisher_raises_after_the_timeout() -> None:
    network = ZmqNetwork(run=RUN)
    try:
        server = network.bind("publisher", ADDRESS)
        client = network.connect("worker-1", server.address)
        with pytest.raises(WeightError, match="silent"):
            await pull_weights(client, 1, timeout_s=0.5)
        # it was asked: the query reached the silent server
        _, env = await recv_from(server)
        assert env.message == WeightQuery(1)
    finally:
        network.close()


async def test_upload_then_pull_through_a_real_publisher() -> None:
    network = ZmqNetwork(run=RUN)
    run: asyncio.Future[None] | None = None
    try:
        dispatcher = network.bind("dispatcher", ADDRESS)
        server = network.bind("publisher", ADDRESS)
        server.refusals = RefusalLog("publisher", per_second=1000)  # log every one of them
        store = WeightStore(chunk_bytes=400, keep=2)
        liveness = Liveness(interval_s=0.05, liveness=200, clock=time.monotonic)
        session = Session(
            network.connect("publisher", dispatcher.address), "publisher", liveness, server.address
        )
        publisher = Publisher(server, session, store)
        run = asyncio.ensure_future(publisher.run())

        peer, env = await recv_from(dispatcher)
        assert isinstance(env.message, Register) and env.message.address == server.address

        data = payload(3000)
        trainer = network.connect("trainer", server.address)
        with structlog.testing.capture_logs() as logs:
            # before the dispatcher has told the publisher the trainer's key: refused, and sent again
            upload = asyncio.ensure_future(
                upload_weights(trainer, 1, data, 400, timeout_s=WAIT, key="trainer-key")
            )
            while not server.refused:
                await asyncio.sleep(0.01)
            await dispatcher.send(peer, TrainerKey("trainer-key"))  # the registered trainer's
            assert await asyncio.wait_for(upload, WAIT) == digest(data)
            refused_first = server.refused
            stray = upload_ticket("trainer-key", 2, 5, digest(data))
            await trainer.send(WeightUpload(2, 7, 5, digest(data), b"stray", stray))  # index past the count
            await trainer.send(WeightUpload(2, 0, 5, digest(data), b"x" * 700))  # no ticket
            sha = await upload_weights(trainer, 2, data, chunk_bytes=400, timeout_s=WAIT, key="trainer-key")
        assert sha == digest(data)
        assert store.latest == 2
        reasons = [e["reason"] for e in logs if e["event"] == "message_refused"]
        assert reasons[0] == "no trainer known yet"
        assert reasons[-2:] == ["chunk 7 of 5", "no ticket of the registered trainer"]
        assert server.refused == refused_first + 2

        worker = network.connect("worker-1", server.address)
        assert await pull_weights(worker, 2, timeout_s=WAIT) == data

        await dispatcher.send(peer, Shutdown("done"))
        await asyncio.wait_for(run, WAIT)
    finally:
        if run is not None and not run.done():
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)
        network.close()


async def test_a_server_listening_locally_is_a_unix_socket_in_a_folder_of_its_own_user(
    net: ZmqNetwork,
) -> None:
    from cadence.transport.zmq_socket import LOCAL, listen_address

    assert (
        listen_address("ipc", "127.0.0.1") == LOCAL
        and listen_address("tcp", "127.0.0.1", 5) == "tcp://127.0.0.1:5"
    )
    server = net.bind("dispatcher", LOCAL)
    folder = Path(server.address.removeprefix("ipc://")).parent
    assert server.address.startswith("ipc://") and stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert server.bind_local() == server.address  # already local: nothing more bound
    client = net.connect("worker-0", server.address)
    try:
        await client.send(Heartbeat("rollout"))
        _, env = await asyncio.wait_for(server.recv(), WAIT)
        assert env.sender == "worker-0"
    finally:
        client.close()
        server.close()
    assert not folder.exists()


def test_auto_listens_locally_where_tcp_would_reach_this_host_alone() -> None:
    """`transport.listen = "auto"`, the default: a Unix socket for a loopback host with nothing
    advertised and no fixed port; tcp as soon as anyone else is meant to reach the server."""
    from cadence.transport.zmq_socket import LOCAL, listen_address

    assert listen_address("auto", "127.0.0.1") == LOCAL and listen_address("auto", "localhost") == LOCAL
    assert listen_address("auto", "::1") == LOCAL
    assert listen_address("auto", "0.0.0.0") == "tcp://0.0.0.0:*"
    assert listen_address("auto", "10.1.2.3") == "tcp://10.1.2.3:*"
    assert listen_address("auto", "127.0.0.1", 5601) == "tcp://127.0.0.1:5601"  # a fixed port: a tunnel
    assert listen_address("auto", "127.0.0.1", 0, "gw.example.org") == "tcp://127.0.0.1:*"
    assert listen_address("tcp", "127.0.0.1") == "tcp://127.0.0.1:*"


async def test_a_network_closed_with_a_local_server_open_leaves_no_folder() -> None:
    from cadence.transport.zmq_socket import LOCAL

    network = ZmqNetwork(run=RUN)
    server = network.bind("trainer", LOCAL)
    folder = Path(server.address.removeprefix("ipc://")).parent
    assert folder.exists()
    network.close()
    assert not folder.exists()
