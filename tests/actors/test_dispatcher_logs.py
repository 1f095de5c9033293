"""The dispatcher takes log lines only from a registered peer's own session, under its own name."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
import structlog

from cadence.actors.dispatcher import Dispatcher
from cadence.launch.settings import dispatcher_settings, liveness
from cadence.monitor.logstream import LogHub
from cadence.monitor.run_dir import RunRecorder
from cadence.tasks.registry import make_task
from cadence.transport.endpoint import RefusalLog
from cadence.transport.inproc import InprocNetwork
from cadence.wire.messages import LogBatch
from tests.conftest import join, tiny_config

pytestmark = pytest.mark.timeout(30)


def _line(event: str) -> str:
    return json.dumps({"time": 1.0, "level": "info", "event": event})


async def test_log_lines_from_strangers_and_under_another_name_are_refused(
    network: InprocNetwork, tmp_path: Path
) -> None:
    cfg = tiny_config("transport.liveness=200")
    server = network.bind("dispatcher", "inproc://dispatcher")
    server.refusals = RefusalLog("dispatcher", per_second=100)
    hub = LogHub(server, tmp_path / "logs", time.time, lease_s=60.0)
    dispatcher = Dispatcher(
        dispatcher_settings(cfg),
        server,
        make_task(cfg.task, cfg.seed),
        RunRecorder(tmp_path, cfg.mode),
        liveness(cfg, time.time),
        time.time,
        hub,
    )
    running = asyncio.create_task(dispatcher.run())
    try:
        worker = await join(network, "w0", "rollout")
        deadline = time.monotonic() + 10
        while not dispatcher.peers and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        stranger = network.connect("w1", "inproc://dispatcher")
        with structlog.testing.capture_logs() as logs:
            await stranger.send(LogBatch("w1", "far", "/x.jsonl", [_line("unregistered")]))
            await worker.send(LogBatch("trainer", "far", "/x.jsonl", [_line("forged run_done")]))
            await worker.send(LogBatch("w0", "far", "/x.jsonl", [_line("its own")]))
            while (server.refused < 2 or "w0" not in hub.bytes) and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
        refused = {e["peer"]: e["reason"] for e in logs if e["event"] == "message_refused"}
        assert "may not send log_batch" in refused["w1"]
        assert "its own name only" in refused["w0"]
        assert set(hub.bytes) == {"w0"}
        written = (tmp_path / "logs" / "w0.jsonl").read_text().splitlines()
        assert [json.loads(x)["event"] for x in written] == ["its own"]
        assert not (tmp_path / "logs" / "trainer.jsonl").exists()
        assert not running.done()
    finally:
        running.cancel()
        hub.close()
