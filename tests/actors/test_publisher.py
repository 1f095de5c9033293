"""The publisher on in-process channels: uploads only from the registered trainer, and partial
uploads held to a size and a time."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import structlog

from cadence.actors.publisher import Publisher, PublisherSettings
from cadence.launch.settings import session
from cadence.transport.endpoint import RefusalLog
from cadence.transport.inproc import InprocNetwork
from cadence.transport.weights import WeightStore, pull_weights, upload_weights
from cadence.wire.digest import digest
from cadence.wire.messages import (
    Register,
    TrainerKey,
    WeightChunkRequest,
    WeightMeta,
    WeightQuery,
    WeightUpload,
)
from cadence.wire.roles import upload_ticket
from tests.conftest import expect, tiny_config

pytestmark = pytest.mark.timeout(30)

KEY = "the-trainers-key"
CHUNK = 100
LIMIT = 2000


def chunk(version: int, index: int, chunks: int, key: str = KEY, size: int = CHUNK) -> WeightUpload:
    return WeightUpload(
        version, index, chunks, "d" * 32, b"x" * size, upload_ticket(key, version, chunks, "d" * 32)
    )


async def test_uploads_come_only_from_the_trainer_and_partial_ones_are_bounded(
    network: InprocNetwork, tmp_path: Path
) -> None:
    cfg = tiny_config("transport.liveness=200")
    dispatcher = network.bind("dispatcher", "inproc://dispatcher")
    server = network.bind("publisher", "inproc://publisher")
    server.refusals = RefusalLog("publisher", per_second=100)  # log every one of them
    publisher = Publisher(
        server,
        session(
            cfg,
            network.connect("publisher", "inproc://dispatcher", route=b"publisher"),
            "publisher",
            time.time,
            server.address,
        ),
        WeightStore(chunk_bytes=CHUNK, keep=2),
        settings=PublisherSettings(max_upload_bytes=LIMIT, upload_timeout_s=2.0),
    )
    task = asyncio.create_task(publisher.run())
    assert (await expect(dispatcher, Register)).role == "publisher"
    trainer = network.connect("trainer", "inproc://publisher")
    with structlog.testing.capture_logs() as logs:
        await trainer.send(chunk(1, 0, 3))  # before the dispatcher has named the trainer
        await dispatcher.send(b"publisher", TrainerKey(KEY))
        while publisher.trainer_key != KEY:  # told on the publisher's session, beside its server
            await asyncio.sleep(0.01)
        await trainer.send(chunk(1, 0, 3, key="a-forgers-key"))
        data = bytes(range(256)) * 2
        await upload_weights(trainer, 4, data, CHUNK, timeout_s=5, key=KEY)  # the trainer's: 512 bytes
        for version in range(12):  # announcing 2^40 chunks: refused, nothing held
            await trainer.send(chunk(version, 0, 1 << 40))
        for index in range(9):  # two partial uploads of 1000 bytes: 1800 held
            await trainer.send(chunk(1, index, 10))
            await trainer.send(chunk(2, index, 10))
        await trainer.send(chunk(3, 0, 10))  # 1900
        await trainer.send(chunk(3, 1, 10))  # 2000
        await trainer.send(chunk(3, 2, 10))  # 2100: over the limit, version 3 is freed
        await trainer.send(WeightQuery(3))  # answered once the chunks before it were taken
        assert not (await expect(trainer, WeightMeta)).available
        held = sum(p.nbytes for p in publisher._uploads.values())
        assert sorted(publisher._uploads) == [1, 2] and held == 1800
        reader = network.connect("w0", "inproc://publisher")
        assert await pull_weights(reader, 4, timeout_s=5) == data
        while publisher._uploads:  # silent for longer than upload_timeout_s: freed
            await asyncio.sleep(0.05)
    reasons = [(e["role"], e["reason"]) for e in logs if e["event"] == "message_refused"]
    assert reasons[:2] == [
        ("stranger", "no trainer known yet"),
        ("stranger", "no ticket of the registered trainer"),
    ]
    assert (
        reasons[2:14]
        == [
            (
                "trainer",
                f"{1 << 40} chunks, at most {LIMIT // CHUNK} of {CHUNK} bytes fit the limit of {LIMIT}",
            )
        ]
        * 12
    )
    assert reasons[14:] == [("trainer", f"partial uploads would hold 2100 bytes, more than {LIMIT}")]
    abandoned = sorted((e["version"], e["nbytes"]) for e in logs if e["event"] == "upload_abandoned")
    assert abandoned == [(1, 900), (2, 900)]
    assert not task.done()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_a_message_that_fails_its_handler_is_contained(network: InprocNetwork, tmp_path: Path) -> None:
    cfg = tiny_config("transport.liveness=200")
    dispatcher = network.bind("dispatcher", "inproc://dispatcher")
    server = network.bind("publisher", "inproc://publisher")
    store = WeightStore(chunk_bytes=CHUNK, keep=2)
    publisher = Publisher(
        server,
        session(
            cfg, network.connect("publisher", "inproc://dispatcher"), "publisher", time.time, server.address
        ),
        store,
    )
    task = asyncio.create_task(publisher.run())
    await expect(dispatcher, Register)
    await publisher.publish(0, b"weights")

    def broken(version: int) -> None:
        raise RuntimeError("a bug meeting one peer's message")

    store.meta = broken  # type: ignore[method-assign,assignment]
    reader = network.connect("w0", "inproc://publisher")
    with structlog.testing.capture_logs() as logs:
        await reader.send_frames([])  # nothing at all: refused by the codec
        await reader.send(WeightQuery(0))
        await reader.send(WeightChunkRequest(0, 0))
        got = await expect(reader, object)  # type: ignore[type-var]
    assert got.data.tobytes() == b"weights"  # type: ignore[attr-defined]
    assert [e["type"] for e in logs if e["event"] == "message_failed"] == ["weight_query"]
    assert digest(b"weights") and not task.done()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
