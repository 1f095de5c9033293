"""A version published on the trainer's GPU first: the workers on that device take it from its buffer
before its host bytes are in; every other asker (a pull, a worker on another device) is answered once
they are, with the very bytes the trainer would have serialised. Here the "device" is the CPU and the
IPC edge an in-process registry (tests/actors/test_device_weights.py's rig)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest
import structlog
import torch

from cadence.actors.publisher import Publisher
from cadence.launch.build import make_engine, make_learner, make_tokenizer
from cadence.launch.settings import publish_dtype
from cadence.training.learner import Learner
from cadence.transport.inproc import InprocNetwork
from cadence.transport.shared_memory import sharing_problem
from cadence.transport.weights import WeightError, pull_weights, query_weights
from cadence.wire.buffer import Buffer
from tests.actors.test_device_weights import CFG, rig

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(sharing_problem() is not None, reason=f"this host cannot share: {sharing_problem()}"),
]


def _learner(seed: int) -> Learner:
    learner = make_learner(CFG, make_tokenizer(CFG))
    noise = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in learner.model.parameters():  # type: ignore[attr-defined]
            p.add_(0.01 * torch.randn(p.shape, generator=noise))
    return learner


def _gate(publisher: Publisher, monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """The publisher's host bytes held back until the returned event is set."""
    gate, buffer = threading.Event(), publisher.buffer

    def gated(nbytes: int) -> Buffer:
        gate.wait(30)
        return buffer(nbytes)

    monkeypatch.setattr(publisher, "buffer", gated)
    return gate


async def _until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(30):
        while not condition():
            await asyncio.sleep(0.005)


async def test_a_worker_on_the_device_takes_the_version_before_its_host_bytes_are_in(
    network: InprocNetwork, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with rig(network) as r:
        learner, gate = _learner(2), _gate(r.publisher, monkeypatch)
        serialised = bytes(learner.weights(dtype=publish_dtype(CFG)))
        assert await r.publisher.publish_on_device(2, learner.tensors()) == len(serialised)
        meta = await query_weights(r.client, 2, 5.0, device=True)
        assert not meta.available and meta.device is not None and meta.nbytes == len(serialised)
        assert (await r.weights.fetch_and_load(r.client, 2))[0] == "cuda-ipc"
        pulling = asyncio.create_task(pull_weights(network.connect("w1", "inproc://publisher"), 2, 5.0))
        await _until(lambda: bool(r.publisher._held))  # its query waits for the host bytes
        assert not r.publisher.store.meta(2).available and not pulling.done()
        gate.set()
        assert bytes(await pulling) == serialised  # the image's bytes, copied to the host
        await r.publisher.stored()
        reference = make_engine(CFG, make_tokenizer(CFG))
        reference.load(bytearray(serialised))
        assert r.engine.generate([1, 2, 3], [7, 8]) == reference.generate([1, 2, 3], [7, 8])


async def test_a_worker_on_another_device_is_answered_once_the_host_bytes_are_in(
    network: InprocNetwork, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with rig(network, uuid="GPU-1") as r:
        learner, gate = _learner(3), _gate(r.publisher, monkeypatch)
        await r.publisher.publish_on_device(2, learner.tensors())
        with structlog.testing.capture_logs() as logs:
            loading = asyncio.create_task(r.weights.fetch_and_load(r.client, 2))
            await _until(lambda: bool(r.publisher._held))  # asked again, without the device
            gate.set()
            assert (await loading)[0] == "shm"
        fallbacks = [e["reason"] for e in logs if e["event"] == "device_sharing_fallback"]
        assert fallbacks == ["the publisher's version is on another device"]
        reference = make_engine(CFG, make_tokenizer(CFG))
        reference.load(bytearray(learner.weights(dtype=publish_dtype(CFG))))
        assert r.engine.generate([1, 2, 3], [7, 8]) == reference.generate([1, 2, 3], [7, 8])


async def test_a_publisher_that_cannot_take_the_version_on_the_device_says_so_and_publishes_later(
    network: InprocNetwork,
) -> None:
    """No device versions (or a broadcast to feed): None, nothing stored; the trainer then serialises
    and publishes the version as before; what the next version waits for is the last one stored."""
    async with rig(network) as r:
        learner = _learner(4)
        r.publisher.device = None
        assert await r.publisher.publish_on_device(2, learner.tensors()) is None
        assert not r.publisher.store.meta(2).available and not r.publisher._storing
        await r.publisher.publish(2, learner.weights(dtype=publish_dtype(CFG)))
        assert r.publisher.store.meta(2).available


async def test_host_bytes_that_cannot_be_stored_are_said_at_once_and_raised_by_the_next_publish(
    network: InprocNetwork, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The copy to the host fails: one error line then, the askers waiting for the bytes told the
    version is not held (their pull fails), and the trainer's next publish raises what failed."""
    async with rig(network) as r:
        gate = _gate(r.publisher, monkeypatch)

        def no_memory(nbytes: int) -> Buffer:
            gate.wait(30)
            raise MemoryError("no host memory for the version")

        monkeypatch.setattr(r.publisher, "buffer", no_memory)
        await r.publisher.publish_on_device(2, _learner(5).tensors())
        pulling = asyncio.create_task(pull_weights(network.connect("w1", "inproc://publisher"), 2, 5.0))
        await _until(lambda: bool(r.publisher._held))
        with structlog.testing.capture_logs() as logs:
            gate.set()
            with pytest.raises(WeightError, match="does not hold version 2"):
                await pulling
        assert [e["event"] for e in logs if e["log_level"] == "error"] == ["version_store_failed"]
        with pytest.raises(MemoryError):
            await r.publisher.stored()
