"""A worker on the trainer's GPU takes each version from the publisher's device buffer: the engine
computes with its tensors and generates exactly what it does with the pulled bytes; a torn buffer is
refused and the version mapped from host memory instead; a worker on another device says so once
and maps every version from host memory. Here the "device" is the CPU and the IPC edge an
in-process registry (tests/transport/test_device_memory.py); the CUDA IPC itself is checked where
torch sees a GPU."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest
import structlog
import torch

from cadence.actors.publisher import Publisher
from cadence.actors.rollout_weights import WorkerWeights, device_reader
from cadence.launch.build import make_engine, make_learner, make_tokenizer
from cadence.launch.settings import publish_dtype, worker_settings
from cadence.launch.sharing import device_versions
from cadence.model.rollout_engine import TorchRolloutEngine
from cadence.transport.device_memory import DeviceReader, DeviceVersions, Exported
from cadence.transport.endpoint import Client
from cadence.transport.heartbeat import Liveness
from cadence.transport.inproc import InprocNetwork
from cadence.transport.session import Session
from cadence.transport.shared_memory import SharedVersions, sharing_problem
from cadence.transport.weights import WeightStore, pull_weights
from tests.conftest import tiny_config
from tests.transport.test_device_memory import Registry

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(sharing_problem() is not None, reason=f"this host cannot share: {sharing_problem()}"),
]

CFG = tiny_config("transport.liveness=200")
CPU = torch.device("cpu")


@dataclass
class Rig:
    publisher: Publisher
    client: Client
    weights: WorkerWeights
    engine: TorchRolloutEngine
    registry: Registry


@asynccontextmanager
async def rig(network: InprocNetwork, uuid: str = "GPU-0") -> AsyncIterator[Rig]:
    """A publisher holding versions 0 and 1 in shared memory and in "device" buffers, and a worker's
    weights on a fresh engine whose reader is on the device of `uuid`."""
    tokenizer = make_tokenizer(CFG)
    learner = make_learner(CFG, tokenizer)
    network.bind("dispatcher", "inproc://dispatcher")
    server = network.bind("publisher", "inproc://publisher")
    session = Session(
        network.connect("publisher", "inproc://dispatcher"),
        "publisher",
        Liveness(1.0, 100, time.time),
        server.address,
    )
    registry = Registry()
    device = DeviceVersions(CPU, uuid="GPU-0", export=registry.export)
    publisher = Publisher(
        server, session, WeightStore(4096, keep=2), shared=SharedVersions(keep=2), device=device,
        device_dtype=publish_dtype(CFG),
    )  # fmt: skip
    for version in range(2):
        with torch.no_grad():
            for p in learner.model.parameters():  # type: ignore[attr-defined]
                p.add_(0.01 * torch.randn_like(p))
        await publisher.publish(version, learner.weights(dtype=publish_dtype(CFG)), learner.tensors())
    engine = make_engine(CFG, tokenizer)
    assert isinstance(engine, TorchRolloutEngine)
    weights = WorkerWeights(engine, worker_settings(CFG), Liveness(1.0, 100, time.time), time.time)
    assert weights.device is None  # an engine on the CPU: nothing to read on a device
    weights.device = DeviceReader(CPU, uuid=uuid, open_buffer=registry.open)
    task = asyncio.create_task(publisher.run())
    try:
        yield Rig(publisher, network.connect("w0", "inproc://publisher"), weights, engine, registry)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def _within(tensor: torch.Tensor, buffer: torch.Tensor) -> bool:
    return buffer.data_ptr() <= tensor.data_ptr() < buffer.data_ptr() + buffer.numel()


async def test_the_engine_takes_the_device_version_and_generates_as_with_the_pulled_one(
    network: InprocNetwork,
) -> None:
    async with rig(network) as r:
        for version in (0, 1):
            assert (await r.weights.fetch_and_load(r.client, version))[0] == "cuda-ipc"
            held = r.weights._mapped
            assert held is not None and isinstance(held.data, torch.Tensor)
            assert all(_within(p, held.data) for p in r.engine.engine.model.parameters())  # no copy
        assert r.publisher.device is not None
        assert r.publisher.device.held(1) and not r.publisher.device.held(0)  # 0 let go once 1 loaded
        reference = make_engine(CFG, make_tokenizer(CFG))
        reference.load(await pull_weights(r.client, 1, 5.0))
        assert r.engine.generate([1, 2, 3], [7, 8]) == reference.generate([1, 2, 3], [7, 8])


async def test_a_torn_device_buffer_is_refused_and_the_version_mapped_from_host_memory(
    network: InprocNetwork,
) -> None:
    async with rig(network) as r:
        assert r.publisher.device is not None
        slot = r.publisher.device.offer(1)
        assert slot is not None
        r.registry.buffers[slot.handle][-1] ^= 0xFF
        with structlog.testing.capture_logs() as logs:
            assert (await r.weights.fetch_and_load(r.client, 1))[0] == "shm"
        assert [e["event"] for e in logs if e["log_level"] == "warning"] == ["device_version_refused"]
        assert r.weights.device is not None  # refused once: the next version is taken from the device
        reference = make_engine(CFG, make_tokenizer(CFG))
        reference.load(await pull_weights(r.client, 1, 5.0))
        assert r.engine.generate([1, 2, 3], [7, 8]) == reference.generate([1, 2, 3], [7, 8])


async def test_a_worker_on_another_device_says_so_once_and_maps_from_host_memory(
    network: InprocNetwork,
) -> None:
    async with rig(network, uuid="GPU-1") as r:
        with structlog.testing.capture_logs() as logs:
            for version in (0, 1):
                assert (await r.weights.fetch_and_load(r.client, version))[0] == "shm"
        fallbacks = [e for e in logs if e["event"] == "device_sharing_fallback"]
        assert [e["reason"] for e in fallbacks] == ["the publisher's version is on another device"]
        assert r.weights.device is None and r.registry.opened == 0


def test_no_device_sharing_on_the_cpu_or_where_it_is_off() -> None:
    engine = make_engine(CFG, make_tokenizer(CFG))
    with structlog.testing.capture_logs() as logs:
        assert device_versions(CFG) is None
        assert device_versions(tiny_config("trainer.device='cuda'", "weights.share_on_host=false")) is None
        assert device_reader(engine, True) is None
    assert logs == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the line said where CUDA is missing")
def test_a_cuda_trainer_without_cuda_says_why_it_does_not_share_on_the_device() -> None:
    with structlog.testing.capture_logs() as logs:
        assert device_versions(tiny_config("trainer.device='cuda'")) is None
    assert [(e["event"], e["reason"]) for e in logs] == [
        ("device_sharing_unavailable", "CUDA is not available")
    ]


async def test_a_device_that_fails_is_said_once_and_host_memory_taken_from_then_on(
    network: InprocNetwork,
) -> None:
    async with rig(network) as r:

        def refused(slot: object, device: torch.device) -> torch.Tensor:
            raise ValueError("the driver refused the handle")

        r.weights.device = DeviceReader(CPU, uuid="GPU-0", open_buffer=refused)
        with structlog.testing.capture_logs() as logs:
            for version in (0, 1):
                assert (await r.weights.fetch_and_load(r.client, version))[0] == "shm"
        reasons = [e["reason"] for e in logs if e["event"] == "device_sharing_fallback"]
        assert len(reasons) == 1 and "the driver refused the handle" in reasons[0]
        assert r.weights.device is None


async def test_a_publisher_whose_device_fails_stops_sharing_there_and_still_publishes(
    network: InprocNetwork,
) -> None:
    async with rig(network) as r:

        def no_memory(buffer: torch.Tensor) -> Exported:
            raise torch.OutOfMemoryError("no device memory left")

        assert r.publisher.device is not None
        r.publisher.device.export = no_memory
        tensors = {"w": torch.ones(1 << 12)}  # another size: a new buffer, exported
        with structlog.testing.capture_logs() as logs:
            assert await r.publisher.publish(2, bytearray(b"version 2"), tensors)
            assert await r.publisher.publish(3, bytearray(b"version 3"), tensors)
        assert [e["event"] for e in logs if e["log_level"] == "warning"] == ["device_sharing_failed"]
        assert r.publisher.device is None and r.publisher.store.meta(3).available
