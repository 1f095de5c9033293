"""`cadence bench logs`: how many log events a second the log paths carry on this machine.

Two measurements: (1) streaming: `actors` streams, each `events` JSON lines, sent by `stream_logs`
over real loopback ZeroMQ sockets to a `LogHub`, which passes them on to one subscribed follower
that parses every line (the `cadence logs --connect` path); (2) files: the same number of events in
`logs/<actor>.jsonl` files, read, merged in time order and formatted by `show_logs`.

Invariant: every figure counts events that arrived whole (the follower checks the count it expects),
timed from the first send to the last line parsed; nothing is asserted, the numbers are printed.
"""

from __future__ import annotations

import asyncio
import io
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from cadence.log import LogStream, configure_logging
from cadence.monitor.logstream import LogHub, stream_logs
from cadence.monitor.logview import show_logs
from cadence.transport.zmq_socket import ZmqNetwork
from cadence.wire.messages import LogBatch, Subscribe


def _event(actor: str, n: int) -> str:
    return json.dumps(
        {
            "time": 1e9 + n * 1e-4,
            "ts": "-",
            "actor": actor,
            "level": "info",
            "event": "group_done",
            "period": n // 100,
            "prompt_id": n,
            "reward": 0.5,
        }  # fmt: skip
    )


async def _streaming(actors: int, events: int) -> dict[str, float]:
    net = ZmqNetwork("bench-logs")
    server = net.bind("dispatcher", "tcp://127.0.0.1:*")
    server.admission.known = lambda route: True  # every stream here is the bench's own (no Register)
    with tempfile.TemporaryDirectory() as tmp:
        hub = LogHub(server, Path(tmp), time.time, lease_s=60.0, backlog=10)
        follower = net.connect("follower", server.address)
        total = actors * events
        got = 0

        async def serve() -> None:
            while True:
                peer, env = await server.recv()
                if isinstance(env.message, LogBatch):
                    await hub.batch(env.message)
                elif isinstance(env.message, Subscribe):
                    await hub.subscribe(peer, env.sender, env.message)

        async def follow() -> None:
            nonlocal got
            while got < total:
                env = await follower.recv()
                if isinstance(env.message, LogBatch):
                    got += sum(1 for line in env.message.lines if json.loads(line))

        serving = asyncio.create_task(serve())
        await follower.send(Subscribe(0))
        while not hub.followers:
            await asyncio.sleep(0.01)
        streams = [
            LogStream(f"rollout-{a}", f"/elsewhere/rollout-{a}.jsonl", capacity=events) for a in range(actors)
        ]
        for a, stream in enumerate(streams):
            for n in range(events):
                stream.put(_event(f"rollout-{a}", n))
        begin = time.perf_counter()
        senders = [
            asyncio.create_task(stream_logs(net.connect(f"rollout-{a}.logs", server.address), s, 0.05))
            for a, s in enumerate(streams)
        ]
        await asyncio.wait_for(follow(), 120)
        seconds = time.perf_counter() - begin
        for task in [*senders, serving]:
            task.cancel()
        await asyncio.gather(*senders, serving, return_exceptions=True)
        hub.close()
    net.close()
    return {"stream_events": total, "stream_s": seconds, "stream_events_per_s": total / seconds}


def _files(actors: int, events: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        logs = Path(tmp) / "logs"
        logs.mkdir()
        for a in range(actors):
            lines = (_event(f"rollout-{a}", n) for n in range(events))
            (logs / f"rollout-{a}.jsonl").write_text("\n".join(lines) + "\n")
        out = io.StringIO()
        begin = time.perf_counter()
        show_logs(Path(tmp), follow=False, out=out)
        seconds = time.perf_counter() - begin
        shown = out.getvalue().count("\n")
    return {"file_events": shown, "file_s": seconds, "file_events_per_s": shown / seconds}


def bench_logs(as_json: bool, actors: int = 4, events: int = 25_000) -> int:
    configure_logging("bench", None, "warning")
    result: dict[str, Any] = {"actors": actors}
    result.update(asyncio.run(_streaming(actors, events)))
    result.update(_files(actors, events))
    result = {k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()}
    if as_json:
        print(json.dumps(result), flush=True)
    else:
        for key, value in result.items():
            print(f"{key:>22}: {value}")
    return 0
