"""`cadence bench weights`: how fast a published state dict reaches two workers, against the wire.

Each measurement is a `Transport` with two halves: `send` runs in this process and returns the
seconds from telling the workers to start to the moment all of them have the bytes; `receive` runs in
each of two worker processes forked at the start, with the arguments `send` passed it, and reports
the number of bytes it holds, verified, as soon as it holds them (before closing its sockets). Every
repeat measures the reference and then each entry of `TRANSPORTS`, interleaved; the figures are
medians:

- `raw` (the reference, `raw_seconds` and `raw_gbps`), what the wire can do here: a plain Python
  `socket` sender streams the bytes with `sendall`, one thread per receiver, over loopback tcp to the
  workers, which `recv_into` a preallocated buffer; no framing, no codec, no checksum.
- `zmq`, the transport cadence uses: a real `Publisher` actor with its `WeightStore` (chunks of
  `weights.chunk_bytes`) serves one version; each worker pulls it with `pull_weights` over its own
  `ZmqClient` on loopback tcp, codec, chunk window and sha256 verification included, as in a run.

`gbps` is gigabits a second of payload delivered to all workers together
(`bytes * workers * 8 / seconds / 1e9`); `ratio_to_raw` is `raw_seconds / seconds`. The default size
is SmolLM2-135M in fp32 (134,515,008 parameters * 4 bytes).

- `gloo`, the broadcast transport: a `Publisher` with a `BroadcastRoot` (buckets of
  `weights.bucket_bytes`) and a `BroadcastMember` in each worker; a one-byte version forms the
  group first, and the figure is the whole state dict through the formed group (as every period after
  the first), the buckets' sha256 checked by each worker. NCCL and HCCL need their devices: they
  would be entries of their own, with the same keys.
- `shm`, the same-host transport: a `SharedVersions` (kept for the whole bench, so its slots are
  written again as in a run) holds the version in the slot it was written into before the clock
  (where a run's trainer serialises it, as the other entries' bytes are serialised before theirs);
  each worker maps it with its `SharedReader` (kept from one repeat to the next, with its mappings,
  as a rollout worker keeps it), the digest checked against the publisher's.
- `cuda-ipc`, where torch sees a GPU: a version from a tensor on the device to each worker's own copy
  on the same device through the publisher's device buffers (`bench/weights_device.py`).
`load_1min` is the machine's load average at the end: other work on the cores moves every figure.

Invariant: a `zmq` figure counts only pulls whose bytes passed `pull_weights`' sha256 check against
the publisher's announced checksum and have the requested length; nothing is asserted on timings.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import multiprocessing as mp
import os
import socket
import statistics
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from cadence.actors.publisher import Publisher
from cadence.bench.weights_device import DeviceBench, device_problem, device_receive
from cadence.config import WeightsConfig
from cadence.log import configure_logging
from cadence.transport.heartbeat import Liveness
from cadence.transport.malloc import keep_freed_memory
from cadence.transport.session import Session
from cadence.transport.shared_memory import SharedReader, SharedVersions, sharing_problem
from cadence.transport.weights import WeightStore, pull_weights
from cadence.transport.zmq_socket import ZmqNetwork
from cadence.wire.digest import digest
from cadence.wire.messages import Shutdown, WeightMeta, decode, encode

SMOLLM2_135M_FP32_BYTES = 134_515_008 * 4
CHUNK_BYTES = WeightsConfig().chunk_bytes
BUCKET_BYTES = WeightsConfig().bucket_bytes
WORKERS = 2
PULL_TIMEOUT_S = 120.0


Reply = Callable[[int], None]


@dataclass(frozen=True)
class Transport:
    """`send(data, version, conns)`: the seconds until every worker behind `conns` has `data`, having
    sent each worker `(name, *args)`; `receive(reply, *args)`, in the worker: calls `reply` with the
    byte count it holds, verified, then cleans up."""

    send: Callable[[bytes, int, list[Connection]], float]
    receive: Callable[..., None]


def collect(conns: list[Connection], nbytes: int, what: str) -> None:
    for conn in conns:
        got = conn.recv()
        if got != nbytes:
            raise RuntimeError(f"{what}: a worker received {got} bytes of {nbytes}")


# ---------------------------------------------------------------- raw: the reference


def _raw_send(data: bytes, version: int, conns: list[Connection]) -> float:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        begin = time.perf_counter()
        for conn in conns:
            conn.send(("raw", port, len(data)))

        def send(peer: socket.socket) -> None:
            with peer:
                peer.sendall(memoryview(data))

        senders = [threading.Thread(target=send, args=(listener.accept()[0],)) for _ in conns]
        for thread in senders:
            thread.start()
        collect(conns, len(data), "raw")
        seconds = time.perf_counter() - begin
        for thread in senders:
            thread.join()
    return seconds


def _raw_receive(reply: Reply, port: int, nbytes: int) -> None:
    buf = bytearray(nbytes)
    view = memoryview(buf)
    got = 0
    with socket.create_connection(("127.0.0.1", port)) as sock:
        while got < nbytes:
            n = sock.recv_into(view[got:])
            if n == 0:
                break
            got += n
        reply(got)


# ---------------------------------------------------------------- zmq: Publisher and pull_weights


def _zmq_send(data: bytes, version: int, conns: list[Connection]) -> float:
    return asyncio.run(_zmq_publish(data, version, conns))


@contextlib.asynccontextmanager
async def _serving(broadcast: str = "") -> AsyncIterator[Publisher]:
    """A running `Publisher` on loopback (with a `BroadcastRoot` of backend `broadcast`, if named),
    shut down through its dispatcher channel as in a run."""
    net = ZmqNetwork("bench-weights")
    dispatcher = net.bind("dispatcher", "tcp://127.0.0.1:*")
    server = net.bind("publisher", "tcp://127.0.0.1:*")
    root = None
    if broadcast:
        from cadence.transport.broadcast import BroadcastRoot

        root = BroadcastRoot(server, broadcast, "127.0.0.1", "", 0, BUCKET_BYTES, PULL_TIMEOUT_S, "bench")
    liveness = Liveness(interval_s=1.0, liveness=3600, clock=time.monotonic)
    store = WeightStore(CHUNK_BYTES, keep=1)
    session = Session(net.connect("publisher", dispatcher.address), "publisher", liveness, server.address)
    publisher = Publisher(server, session, store, root)
    running = asyncio.ensure_future(publisher.run())
    try:
        yield publisher
        peer, _ = await dispatcher.recv()  # the publisher's Register
        await dispatcher.send(peer, Shutdown("bench done"))
        await asyncio.wait_for(running, 10)
    finally:
        if not running.done():
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
        net.close()


async def _zmq_publish(data: bytes, version: int, conns: list[Connection]) -> float:
    async with _serving() as publisher:
        await publisher.publish(version, data)  # hashed before the clock starts, as a trainer would
        begin = time.perf_counter()
        for i, conn in enumerate(conns):
            conn.send(("zmq", publisher.server.address, version, f"worker-{i}"))
        await asyncio.to_thread(collect, conns, len(data), "zmq")
        return time.perf_counter() - begin


def _zmq_receive(reply: Reply, address: str, version: int, name: str) -> None:
    asyncio.run(_zmq_pull(reply, address, version, name))


async def _zmq_pull(reply: Reply, address: str, version: int, name: str) -> None:
    net = ZmqNetwork("bench-weights")
    try:
        client = net.connect(name, address)
        data = await pull_weights(client, version, PULL_TIMEOUT_S)  # raises unless the sha256 matches
        reply(len(data))
        client.close()
    finally:
        net.close()


# ---------------------------------------------------------------- gloo: BroadcastRoot and BroadcastMember


def _gloo_send(data: bytes, version: int, conns: list[Connection]) -> float:
    return asyncio.run(_gloo_publish(data, version, conns))


async def _gloo_publish(data: bytes, version: int, conns: list[Connection]) -> float:
    """The workers join a `Publisher`'s broadcast; a first one-byte version forms the group, and the
    figure is the second, the whole state dict, through the formed group as in every later period."""
    import torch

    tensors = {"weights": torch.frombuffer(bytearray(data), dtype=torch.uint8)}
    async with _serving("gloo") as publisher:
        root = publisher.broadcaster
        assert root is not None
        for i, conn in enumerate(conns):
            conn.send(("gloo", publisher.server.address, f"worker-{i}"))
        while len(root.members) < len(conns):
            await asyncio.sleep(0.01)
        if not await root.broadcast(0, {"weights": torch.zeros(1, dtype=torch.uint8)}):
            raise RuntimeError("gloo: the group did not form")
        begin = time.perf_counter()
        if not await root.broadcast(1, tensors):
            raise RuntimeError("gloo: the broadcast did not reach every worker")
        await asyncio.to_thread(collect, conns, len(data), "gloo")
        return time.perf_counter() - begin


def _gloo_receive(reply: Reply, address: str, name: str) -> None:
    asyncio.run(_gloo_member(reply, address, name))


async def _gloo_member(reply: Reply, address: str, name: str) -> None:
    from cadence.model.checkpoint import state_nbytes
    from cadence.transport.broadcast import BroadcastMember

    net = ZmqNetwork("bench-weights")
    member = BroadcastMember(name)
    running = asyncio.ensure_future(member.run(net.connect(name, address)))
    try:
        while member.from_version is None:
            await asyncio.sleep(0.01)
        for version in (0, 1):  # None unless every bucket arrived and passed the sha256
            state = await member.weights(version, PULL_TIMEOUT_S)
        reply(0 if state is None else state_nbytes(state))
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        net.close()


# ---------------------------------------------------------------- shm: SharedVersions and SharedReader


class _SharedBench:
    """The publisher's shared versions, kept from one repeat to the next (created on first use, in the
    bench's process after the workers are forked)."""

    def __init__(self) -> None:
        self.shared: SharedVersions | None = None

    def send(self, data: bytes, version: int, conns: list[Connection]) -> float:
        if self.shared is None:
            self.shared = SharedVersions(keep=WeightsConfig().keep_versions)
        buffer = self.shared.take(len(data))
        buffer[:] = data  # what the trainer serialises into the slot, as it does into the pool's buffer
        xxh = digest(buffer)  # as the publisher's store has it before the clock starts
        begin = time.perf_counter()
        slot = self.shared.write(version, buffer)  # no copy: the slot it was serialised into
        meta = WeightMeta(version, True, len(data), xxh, CHUNK_BYTES, 1, shared=slot)
        for conn in conns:
            conn.send(("shm", encode(meta, "bench")))
        collect(conns, len(data), "shm")
        return time.perf_counter() - begin


@functools.cache
def _reader() -> SharedReader:
    """The worker process's reader, kept as a rollout worker keeps it (with its slots' mappings)."""
    return SharedReader()


def _shm_receive(reply: Reply, frame: bytes) -> None:
    msg = decode(frame).message
    assert isinstance(msg, WeightMeta)
    mapped = _reader().map(msg)  # raises unless the size and the digest match
    reply(len(mapped.data))
    mapped.release()


RAW = Transport(_raw_send, _raw_receive)
TRANSPORTS: dict[str, Transport] = {
    "zmq": Transport(_zmq_send, _zmq_receive),
    "gloo": Transport(_gloo_send, _gloo_receive),
    "shm": Transport(_SharedBench().send, _shm_receive),
    "cuda-ipc": Transport(DeviceBench(collect).send, device_receive),
}


# ---------------------------------------------------------------- the bench


def _worker(conn: Connection) -> None:
    """A worker process: receives as each order names, answers with the byte count it received. Its heap
    is set up as a rollout worker's (`keep_freed_memory`)."""
    keep_freed_memory()
    receivers = {"raw": RAW.receive, **{name: t.receive for name, t in TRANSPORTS.items()}}
    while True:
        order = conn.recv()
        if order is None:
            return
        name, *args = order
        receivers[name](conn.send, *args)


def _figures(nbytes: int, seconds: list[float]) -> dict[str, float]:
    median = statistics.median(seconds)
    return {"seconds": round(median, 4), "gbps": round(nbytes * WORKERS * 8 / median / 1e9, 3)}


def bench_weights(as_json: bool, weights_mbytes: float | None = None, repeats: int = 5) -> int:
    configure_logging("bench", None, "warning")
    nbytes = SMOLLM2_135M_FP32_BYTES if weights_mbytes is None else int(weights_mbytes * 1_000_000)
    # fork the workers first, while this process has no threads, sockets or event loop
    ctx = mp.get_context("fork")
    pipes = [ctx.Pipe() for _ in range(WORKERS)]
    procs = [ctx.Process(target=_worker, args=(child,), daemon=True) for _, child in pipes]
    for proc in procs:
        proc.start()
    conns = [parent for parent, _ in pipes]
    raw_s: list[float] = []
    # shm only where this host can share (else, as in a run, nothing but one line says so)
    shared = sharing_problem()
    if shared is not None:
        print(f"cadence: no shm figure: {shared}", file=sys.stderr)
    on_device = device_problem()  # cuda-ipc only where torch sees a GPU (asked once the workers are forked)
    if on_device is not None:
        print(f"cadence: no cuda-ipc figure: {on_device}", file=sys.stderr)
    skipped = {name for name, problem in (("shm", shared), ("cuda-ipc", on_device)) if problem is not None}
    seconds: dict[str, list[float]] = {name: [] for name in TRANSPORTS if name not in skipped}
    try:
        data = os.urandom(nbytes)
        for version in range(1, repeats + 1):
            raw_s.append(RAW.send(data, version, conns))
            for name in seconds:
                transport = TRANSPORTS[name]
                seconds[name].append(transport.send(data, version, conns))
    finally:
        for conn in conns:
            conn.send(None)
        for proc in procs:
            proc.join(10)
    raw = _figures(nbytes, raw_s)
    transports = {
        name: {
            **_figures(nbytes, s),
            "ratio_to_raw": round(statistics.median(raw_s) / statistics.median(s), 3),
        }
        for name, s in seconds.items()
    }
    result: dict[str, Any] = {
        "bytes": nbytes,
        "workers": WORKERS,
        "chunk_bytes": CHUNK_BYTES,
        "repeats": repeats,
        "transports": transports,
        "raw_seconds": raw["seconds"],
        "raw_gbps": raw["gbps"],
        "load_1min": round(os.getloadavg()[0], 2),
    }
    if not as_json:
        print(
            f"{'bytes':>14}: {nbytes} to {WORKERS} workers, median of {repeats}, load {result['load_1min']}"
        )
        print(f"{'raw socket':>14}: {raw['seconds']:.3f} s, {raw['gbps']:.2f} Gbit/s")
        for name, fig in transports.items():
            print(
                f"{name:>14}: {fig['seconds']:.3f} s, {fig['gbps']:.2f} Gbit/s, {fig['ratio_to_raw']:.2f} of raw"
            )
    print(json.dumps(result), flush=True)
    return 0
