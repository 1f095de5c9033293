"""The dispatcher on a full disk: the period row that meets it is kept whole, every peer is told the
run ended and why, and the run fails naming the disk (no message of a peer is blamed for it)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from cadence.monitor.run_dir import read_jsonl
from cadence.transport.inproc import InprocNetwork
from cadence.wire.messages import Shutdown, VersionReady
from tests.actors.test_dispatcher import ROW, start
from tests.conftest import expect, join
from tests.unit.test_disk_full import ReserveTakesTheRoom

pytestmark = pytest.mark.timeout(30)


async def test_a_full_disk_ends_the_run_with_its_last_row_whole_naming_the_disk(
    network: InprocNetwork, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dispatcher, task = await start(network, tmp_path, "periods=5")
    trainer = await join(network, "trainer", "trainer", "inproc://trainer")
    worker = await join(network, "w0", "rollout")
    await trainer.send(VersionReady(0, "digest", 10, {}))
    await trainer.send(VersionReady(1, "digest", 10, ROW))
    while not read_jsonl(tmp_path / "metrics.jsonl"):
        await asyncio.sleep(0.02)
    monkeypatch.setattr(os, "write", ReserveTakesTheRoom(dispatcher.recorder, os.write))
    await trainer.send(VersionReady(2, "digest", 10, {**ROW, "period": 1}))
    said = await expect(trainer, Shutdown)
    assert f"the disk of {tmp_path} is full" in said.reason and "after period 1" in said.reason
    assert "is full" in (await expect(worker, Shutdown)).reason
    with pytest.raises(RuntimeError, match="is full: the run ends after period 1"):
        await asyncio.wait_for(task, 5)
    monkeypatch.undo()
    assert [r["period"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [0, 1]
    assert not (tmp_path / "summary.json").exists()
