"""`cadence bench weights`: how fast a published state dict reaches two workers, against the wire.

Two measurements in one run, each repeated and reported as the median, both on loopback tcp to two
worker processes forked at the start:

- `zmq`, the transport cadence uses: a real `Publisher` actor with its `WeightStore` (chunks of
  `weights.chunk_bytes`) serves one version; each worker process pulls it with `pull_weights` over
  its own `ZmqClient`, msgpack codec, chunk window and sha256 verification included, as in a run.
- `raw`, what the wire can do here: a plain Python `socket` sender streams the same bytes with
  `sendall`, one thread per receiver, to the two workers, which `recv_into` a preallocated buffer;
  no framing, no codec, no checksum.

Each figure is timed from the moment the workers are told to start to the moment both have all the
bytes. `gbps` is gigabits a second of payload delivered to all workers together
(`bytes * workers * 8 / seconds / 1e9`). The default size is SmolLM2-135M in fp32
(134,515,008 parameters * 4 bytes). Only the ZeroMQ transport exists so far: gloo or NCCL
transports would each add an entry under `transports`, with the same keys.

Invariant: a `zmq` figure counts only pulls whose bytes passed `pull_weights`' sha256 check against
the publisher's announced checksum and have the requested length; nothing is asserted on timings.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import os
import socket
import statistics
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

from cadence.actors.publisher import Publisher
from cadence.log import configure_logging
from cadence.messages import Shutdown
from cadence.transport.heartbeat import Liveness
from cadence.transport.weights import WeightStore, pull_weights
from cadence.transport.zmq_socket import ZmqNetwork

SMOLLM2_135M_FP32_BYTES = 134_515_008 * 4
CHUNK_BYTES = 1 << 20  # the default of `weights.chunk_bytes`
WORKERS = 2
PULL_TIMEOUT_S = 120.0


def _worker(conn: Connection) -> None:
    """A worker process: does what the parent asks, answers with the byte count it received."""
    while True:
        order = conn.recv()
        if order is None:
            return
        if order[0] == "zmq":
            _, address, version, name = order
            conn.send(asyncio.run(_pull(address, version, name)))
        else:
            _, port, nbytes = order
            conn.send(_receive(port, nbytes))


async def _pull(address: str, version: int, name: str) -> int:
    net = ZmqNetwork("bench-weights")
    try:
        client = net.connect(name, address)
        data = await pull_weights(client, version, PULL_TIMEOUT_S)  # raises unless the sha256 matches
        client.close()
        return len(data)
    finally:
        net.close()


def _receive(port: int, nbytes: int) -> int:
    buf = bytearray(nbytes)
    view = memoryview(buf)
    got = 0
    with socket.create_connection(("127.0.0.1", port)) as sock:
        while got < nbytes:
            n = sock.recv_into(view[got:])
            if n == 0:
                break
            got += n
    return got


def _collect(conns: list[Connection], nbytes: int, what: str) -> None:
    for conn in conns:
        got = conn.recv()
        if got != nbytes:
            raise RuntimeError(f"{what}: a worker received {got} bytes of {nbytes}")


async def _zmq_once(data: bytes, version: int, conns: list[Connection]) -> float:
    net = ZmqNetwork("bench-weights")
    dispatcher = net.bind("dispatcher", "tcp://127.0.0.1:*")
    server = net.bind("publisher", "tcp://127.0.0.1:*")
    store = WeightStore(CHUNK_BYTES, keep=1)
    liveness = Liveness(interval_s=1.0, liveness=3600, clock=time.monotonic)
    publisher = Publisher(server, net.connect("publisher", dispatcher.address), store, liveness)
    await publisher.publish(version, data)  # hashed before the clock starts, as a trainer would
    running = asyncio.ensure_future(publisher.run())
    try:
        begin = time.perf_counter()
        for i, conn in enumerate(conns):
            conn.send(("zmq", server.address, version, f"worker-{i}"))
        await asyncio.to_thread(_collect, conns, len(data), "zmq")
        seconds = time.perf_counter() - begin
        peer, _ = await dispatcher.recv()  # the publisher's Register
        await dispatcher.send(peer, Shutdown("bench done"))
        await asyncio.wait_for(running, 10)
    finally:
        if not running.done():
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
        net.close()
    return seconds


def _raw_once(data: bytes, conns: list[Connection]) -> float:
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
        _collect(conns, len(data), "raw")
        seconds = time.perf_counter() - begin
        for thread in senders:
            thread.join()
    return seconds


def _figures(nbytes: int, seconds: list[float]) -> dict[str, float]:
    median = statistics.median(seconds)
    return {"seconds": round(median, 4), "gbps": round(nbytes * WORKERS * 8 / median / 1e9, 3)}


def bench_weights(as_json: bool, weights_mbytes: float | None = None, repeats: int = 3) -> int:
    configure_logging("bench", None, "warning")
    nbytes = SMOLLM2_135M_FP32_BYTES if weights_mbytes is None else int(weights_mbytes * 1_000_000)
    # fork the workers first, while this process has no threads, sockets or event loop
    ctx = mp.get_context("fork")
    pipes = [ctx.Pipe() for _ in range(WORKERS)]
    procs = [ctx.Process(target=_worker, args=(child,), daemon=True) for _, child in pipes]
    for proc in procs:
        proc.start()
    conns = [parent for parent, _ in pipes]
    try:
        data = os.urandom(nbytes)
        raw_s, zmq_s = [], []
        for version in range(1, repeats + 1):
            raw_s.append(_raw_once(data, conns))
            zmq_s.append(asyncio.run(_zmq_once(data, version, conns)))
    finally:
        for conn in conns:
            conn.send(None)
        for proc in procs:
            proc.join(10)
    raw = _figures(nbytes, raw_s)
    zmq = {**_figures(nbytes, zmq_s), "ratio_to_raw": round(raw["seconds"] / statistics.median(zmq_s), 3)}
    result: dict[str, Any] = {
        "bytes": nbytes,
        "workers": WORKERS,
        "chunk_bytes": CHUNK_BYTES,
        "repeats": repeats,
        "transports": {"zmq": zmq},
        "raw_seconds": raw["seconds"],
        "raw_gbps": raw["gbps"],
    }
    if not as_json:
        print(f"{'bytes':>14}: {nbytes} to {WORKERS} workers, median of {repeats}")
        print(f"{'raw socket':>14}: {raw['seconds']:.3f} s, {raw['gbps']:.2f} Gbit/s")
        for name, fig in result["transports"].items():
            print(
                f"{name:>14}: {fig['seconds']:.3f} s, {fig['gbps']:.2f} Gbit/s, {fig['ratio_to_raw']:.2f} of raw"
            )
    print(json.dumps(result), flush=True)
    return 0
