"""The dispatcher's handler table: a message type without a handler is refused and logged."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import structlog

from cadence.actors.dispatcher import Dispatcher
from cadence.launch.settings import dispatcher_settings, liveness
from cadence.monitor.run_dir import RunRecorder
from cadence.tasks.registry import make_task
from cadence.transport.endpoint import RefusalLog
from cadence.transport.inproc import InprocNetwork
from cadence.wire.messages import Assignment, VersionReady, Welcome, WorkRequest
from tests.conftest import expect, join, tiny_config

pytestmark = pytest.mark.timeout(30)


async def test_a_type_without_a_handler_is_refused_and_logged(
    network: InprocNetwork, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        Dispatcher, "HANDLERS", {k: v for k, v in Dispatcher.HANDLERS.items() if k is not WorkRequest}
    )
    cfg = tiny_config("transport.liveness=200")
    task = make_task(cfg.task, cfg.seed)
    server = network.bind("dispatcher", "inproc://dispatcher")
    server.refusals = RefusalLog("dispatcher", per_second=100)
    recorder = RunRecorder(tmp_path, cfg.mode)
    dispatcher = Dispatcher(
        dispatcher_settings(cfg), server, task, recorder, liveness(cfg, time.time), time.time
    )
    running = asyncio.create_task(dispatcher.run())
    trainer = await join(network, "trainer", "trainer", "inproc://trainer")
    await join(network, "publisher", "publisher", "inproc://publisher")
    worker = await join(network, "w0", "rollout")
    await expect(worker, Welcome)
    await trainer.send(VersionReady(0, "digest", 10, {}))
    with structlog.testing.capture_logs() as logs:
        await worker.send(WorkRequest(2))
        deadline = time.monotonic() + 10
        while dispatcher.server.refused < 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
    refused = [e for e in logs if e["event"] == "message_refused"]
    assert [(e["peer"], e["type"]) for e in refused] == [("w0", "work_request")]
    assert "no handler" in refused[0]["reason"]
    with pytest.raises(TimeoutError):
        await expect(worker, Assignment, timeout=0.3)  # the credit was not taken
    assert not running.done()
    running.cancel()
