"""`cadence bench strangers`: what a stranger on the same host costs a server, and what each way of
keeping strangers out costs the run's own traffic.

Two measurements: (1) an attack: `connections` connections from another process each hand a
trainer's server `frames` well-formed groups of about 2.2 MiB without a ticket, while the server
reads (refusing each, as a trainer does) and a ticker task on its event loop measures its longest
stall; figures: frames refused and left undecoded, seconds to refuse them all, the longest stall, this
process's resident memory before, at its peak and after; (2) 512 MiB in 8 MiB frames from a DEALER
to a ROUTER through TCP loopback, through a Unix socket in a 0700 folder (`transport.listen =
"ipc"`), and through TCP loopback with CURVE keys.

Invariant: nothing is asserted, the numbers are printed; every figure is of this machine, at its load.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import structlog
import zmq

from cadence.transport.zmq_socket import ZmqNetwork
from cadence.wire.messages import Peek

ATTACK = r"""
import sys, zmq
from cadence.wire.messages import GroupResult, encode
rows = 14_000
group = GroupResult(0, 0, 1, [1], [[7] * 16] * rows, [[-0.5] * 16] * rows, [1.0], [1.0], 0.0, 0.0, 0.0,
                    ticket="forged")
frame = encode(group, "stranger", "bench-strangers")
ctx = zmq.Context()
socks = []
for _ in range(int(sys.argv[2])):
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 300_000)
    sock.connect(sys.argv[1])
    socks.append(sock)
for sock in socks:
    for _ in range(int(sys.argv[3])):
        sock.send(frame, copy=False)
print(len(frame), flush=True)
for sock in socks:
    sock.close()
ctx.term()
"""


def _rss_mib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) // 1024
    return 0


def _no_ticket(route: bytes, seen: Peek) -> str | None:
    return "no ticket"


async def _attack(connections: int, frames: int) -> dict[str, Any]:
    net = ZmqNetwork("bench-strangers")
    server = net.bind("trainer", "tcp://127.0.0.1:*")
    server.admission.proves = _no_ticket
    start = _rss_mib()
    peak, stall = [start], [0.0]

    async def ticker() -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0.05)
            now = time.perf_counter()
            stall[0] = max(stall[0], now - last - 0.05)
            last = now
            peak[0] = max(peak[0], _rss_mib())

    async def reader() -> None:
        while True:
            await server.recv()

    tasks = [asyncio.create_task(ticker()), asyncio.create_task(reader())]
    began = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", ATTACK, server.address, str(connections), str(frames), stdout=subprocess.PIPE
    )
    out, _ = await proc.communicate()
    while server.refused < connections * frames and time.perf_counter() - began < 600:
        await asyncio.sleep(0.1)
    took = time.perf_counter() - began
    await asyncio.sleep(1.0)
    for task in tasks:
        task.cancel()
    net.close()
    return {
        "frame_bytes": int(out or 0),
        "connections": connections,
        "frames_each": frames,
        "refused": server.refused,
        "undecoded": server.admission.undecoded,
        "seconds": round(took, 2),
        "longest_stall_s": round(stall[0], 3),
        "rss_start_mib": start,
        "rss_peak_mib": peak[0],
        "rss_after_mib": _rss_mib(),
    }


def _through(address: str, curve: bool, chunk: int = 8 << 20, count: int = 64) -> float:
    ctx = zmq.Context()
    server, client = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    if curve:
        server_public, server_secret = zmq.curve_keypair()
        client_public, client_secret = zmq.curve_keypair()
        server.curve_server = True
        server.curve_secretkey, server.curve_publickey = server_secret, server_public
        client.curve_serverkey = server_public
        client.curve_publickey, client.curve_secretkey = client_public, client_secret
    server.bind(address)
    client.connect(server.getsockopt_string(zmq.LAST_ENDPOINT))
    data = os.urandom(chunk)
    client.send(b"hello")
    server.recv_multipart()
    began = time.perf_counter()
    sending = threading.Thread(target=lambda: [client.send(data, copy=False) for _ in range(count)])
    sending.start()
    for _ in range(count):
        server.recv_multipart(copy=False)
    sending.join()
    took = time.perf_counter() - began
    server.close(0)
    client.close(0)
    ctx.term()
    return round(took, 3)


def bench_strangers(as_json: bool, connections: int = 100, frames: int = 8, transfer_mib: int = 512) -> int:
    with structlog.testing.capture_logs():  # the refusals: thousands of lines, not figures
        attack = asyncio.run(_attack(connections, frames))
    folder = tempfile.mkdtemp(prefix="cadence-bench-")
    ways = {
        "tcp_loopback": ("tcp://127.0.0.1:*", False),
        "ipc_0700": (f"ipc://{folder}/bench.sock", False),
        "tcp_loopback_curve": ("tcp://127.0.0.1:*", True),
    }
    count = max(1, transfer_mib // 8)
    seconds = {
        name: [_through(address, curve, count=count) for _ in range(2)]
        for name, (address, curve) in ways.items()
    }
    shutil.rmtree(folder, ignore_errors=True)
    figures = {"attack": attack, "transfer_mib": count * 8, "transfer_s": seconds}
    for name, value in attack.items():
        print(f"attack {name}: {value}")
    for name, runs in seconds.items():
        print(f"{count * 8} MiB through {name}: {runs} s")
    if as_json:
        print(json.dumps(figures))
    return 0
