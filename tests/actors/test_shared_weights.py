"""A worker on the publisher's host takes each version from shared memory: the engine computes with the
mapped bytes themselves and generates exactly what it does with the pulled ones; a torn slot is
refused and the version pulled; a publisher that does not share is said once, then pulled from."""

from __future__ import annotations

import asyncio
import errno
import mmap
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest
import structlog
import torch

from cadence.actors.publisher import Publisher
from cadence.actors.rollout_weights import WorkerWeights
from cadence.config import RunConfig
from cadence.launch.build import make_engine, make_learner, make_tokenizer
from cadence.launch.settings import publish_dtype, worker_settings
from cadence.model.lora_engine import LoraRolloutEngine
from cadence.model.rollout_engine import RolloutEngine, TorchRolloutEngine
from cadence.training.learner import Learner
from cadence.transport.endpoint import Client
from cadence.transport.heartbeat import Liveness
from cadence.transport.inproc import InprocNetwork
from cadence.transport.session import Session
from cadence.transport.shared_memory import Mapped, SharedVersions, sharing_problem
from cadence.transport.weights import WeightStore, pull_weights
from cadence.wire.buffer import Buffer
from tests.conftest import tiny_config

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(sharing_problem() is not None, reason=f"this host cannot share: {sharing_problem()}"),
]

CFG = tiny_config("transport.liveness=200")


@dataclass
class Rig:
    publisher: Publisher
    client: Client
    weights: WorkerWeights
    engine: RolloutEngine
    versions: list[bytes | Buffer]


@asynccontextmanager
async def rig(network: InprocNetwork, shared: bool = True, cfg: RunConfig = CFG) -> AsyncIterator[Rig]:
    """A publisher holding versions 0 and 1 (trained apart by a step of noise), shared unless not
    `shared`, and a worker's weights on a fresh engine, of `cfg`."""
    tokenizer = make_tokenizer(cfg)
    learner = make_learner(cfg, tokenizer)
    network.bind("dispatcher", "inproc://dispatcher")
    server = network.bind("publisher", "inproc://publisher")
    session = Session(
        network.connect("publisher", "inproc://dispatcher"),
        "publisher",
        Liveness(1.0, 100, time.time),
        server.address,
    )
    publisher = Publisher(
        server, session, WeightStore(4096, keep=2), shared=SharedVersions(keep=2) if shared else None
    )
    versions = []
    for version in range(2):
        with torch.no_grad():
            for p in learner.model.parameters():  # type: ignore[attr-defined]
                if p.requires_grad:  # every weight, or the adapters alone
                    p.add_(0.01 * torch.randn_like(p))
        versions.append(learner.weights(dtype=publish_dtype(cfg)))
        await publisher.publish(version, versions[-1])
    engine = make_engine(cfg, tokenizer)
    weights = WorkerWeights(engine, worker_settings(cfg), Liveness(1.0, 100, time.time), time.time)
    task = asyncio.create_task(publisher.run())
    try:
        yield Rig(publisher, network.connect("w0", "inproc://publisher"), weights, engine, versions)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def _within(tensor: torch.Tensor, buffer: object) -> bool:
    base = torch.frombuffer(buffer, dtype=torch.uint8)  # type: ignore[call-overload]
    start = base.data_ptr()
    return start <= tensor.data_ptr() < start + base.numel()


async def test_the_engine_computes_with_the_mapped_version_and_generates_as_with_the_pulled_one(
    network: InprocNetwork,
) -> None:
    async with rig(network) as r:
        for version in (0, 1):
            assert (await r.weights.fetch_and_load(r.client, version))[0] == "shm"
            mapped = r.weights._mapped
            assert mapped is not None and isinstance(r.engine, TorchRolloutEngine)
            assert all(_within(p, mapped.data) for p in r.engine.engine.model.parameters())  # no copy
        reference = make_engine(CFG, make_tokenizer(CFG))
        reference.load(await pull_weights(r.client, 1, 5.0))
        prompt = [1, 2, 3]
        assert r.engine.generate(prompt, [7, 8]) == reference.generate(prompt, [7, 8])


async def test_versions_through_the_same_slots_are_viewed_by_tensors_made_once_a_slot(
    network: InprocNetwork,
) -> None:
    """Version after version in the publisher's two slots: the worker makes the tensors viewing each
    slot's mapping once, and still computes with exactly the version it loaded."""
    async with rig(network) as r:
        learner = make_learner(CFG, make_tokenizer(CFG))
        made: dict[int, object] = {}
        for version in range(2, 7):
            _noise_step([learner], version)
            await r.publisher.publish(version, learner.weights(dtype=publish_dtype(CFG)))
            assert (await r.weights.fetch_and_load(r.client, version))[0] == "shm"
            mapped = r.weights._mapped
            assert isinstance(mapped, Mapped) and isinstance(r.engine, TorchRolloutEngine)
            state = r.weights._views.views(mapped.data)
            assert made.setdefault(id(mapped.data), state) is state  # the same tensors as before
            reference = make_engine(CFG, make_tokenizer(CFG))
            reference.load(await pull_weights(r.client, version, 5.0))
            assert r.engine.generate([1, 2, 3], [7, 8]) == reference.generate([1, 2, 3], [7, 8])
        assert len(made) == 2 and len(r.weights._views) <= 2


@pytest.mark.parametrize("apply", ["step", "merge"])
async def test_a_lora_engine_reads_the_mapped_adapters_and_keeps_none_of_the_mapping(
    network: InprocNetwork, apply: str
) -> None:
    """Adapter versions go through the mapping without a copy of the version first; what the engine
    keeps is its own (its adapters copied, or the merged weights), so the slot may go once the next
    version is in, and the samples are those of the pulled bytes."""
    cfg = tiny_config("transport.liveness=200", "trainer.lora.rank=2", f"trainer.lora.apply='{apply}'")
    async with rig(network, cfg=cfg) as r:
        assert isinstance(r.engine, LoraRolloutEngine)
        for version in (0, 1):
            assert (await r.weights.fetch_and_load(r.client, version))[0] == "shm"
        mapped = r.weights._mapped
        assert mapped is not None
        model = r.engine.inner.engine.model
        assert not any(_within(t, mapped.data) for t in model.state_dict().values())
        reference = make_engine(cfg, make_tokenizer(cfg))
        reference.load(await pull_weights(r.client, 1, 5.0))
        before = reference.generate([1, 2, 3], [7, 8])
        assert r.engine.generate([1, 2, 3], [7, 8]) == before
        r.weights._hold(None)  # the slot let go: the engine holds nothing of it
        assert r.engine.generate([1, 2, 3], [7, 8]) == before


async def test_a_torn_slot_is_refused_and_the_version_pulled(network: InprocNetwork) -> None:
    async with rig(network) as r:
        shared = r.publisher.shared
        assert shared is not None
        slot = next(s for s in shared._slots if s.version == 1)
        slot.view[-64:] = bytes(64)  # torn: its tail is not version 1's
        with structlog.testing.capture_logs() as logs:
            source, _ = await r.weights.fetch_and_load(r.client, 1)
        assert source == "zmq"
        refused = [e for e in logs if e["event"] == "shared_version_refused"]
        assert len(refused) == 1 and "checksum" in refused[0]["reason"]
        assert r.weights.shared is not None  # the next version is mapped again
        reference = make_engine(CFG, make_tokenizer(CFG))
        reference.load(r.versions[1])
        assert r.engine.generate([1, 2], [3]) == reference.generate([1, 2], [3])


async def test_a_publisher_that_does_not_share_is_said_once_then_pulled_from(network: InprocNetwork) -> None:
    async with rig(network, shared=False) as r:
        with structlog.testing.capture_logs() as logs:
            sources = [(await r.weights.fetch_and_load(r.client, v))[0] for v in (0, 1)]
        assert sources == ["zmq", "zmq"]
        assert [e["event"] for e in logs].count("shared_memory_fallback") == 1


async def test_a_host_out_of_memory_for_a_slot_stops_sharing_and_the_versions_are_pulled(
    network: InprocNetwork, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_memory(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_memory)
    with structlog.testing.capture_logs() as logs:
        async with rig(network) as r:
            assert r.publisher.shared is None
            assert (await r.weights.fetch_and_load(r.client, 1))[0] == "zmq"
    said = [e["event"] for e in logs]
    assert said.count("shared_memory_failed") == 1 and said.count("shared_memory_fallback") == 1


async def test_a_version_the_trainer_serialises_into_the_publishers_buffer_is_mapped_without_a_copy(
    network: InprocNetwork,
) -> None:
    async with rig(network) as r:
        shared = r.publisher.shared
        assert shared is not None
        learner = make_learner(CFG, make_tokenizer(CFG))
        data = learner.weights(r.publisher.buffer, publish_dtype(CFG))  # as the trainer does
        assert isinstance(data, mmap.mmap)
        await r.publisher.publish(2, data)
        assert next(s for s in shared._slots if s.version == 2).view is data  # offered where written
        assert (await r.weights.fetch_and_load(r.client, 2))[0] == "shm"
        reference = make_engine(CFG, make_tokenizer(CFG))
        reference.load(await pull_weights(r.client, 2, 5.0))  # the same bytes, over ZeroMQ
        assert r.engine.generate([1, 2, 3], [7, 8]) == reference.generate([1, 2, 3], [7, 8])


async def test_a_buffer_the_host_has_no_memory_for_stops_sharing_and_is_the_pools(
    network: InprocNetwork, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with rig(network) as r:

        def no_memory(fd: int, offset: int, length: int) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "posix_fallocate", no_memory)
        with structlog.testing.capture_logs() as logs:
            buffer = r.publisher.buffer(1 << 20)  # no slot of this size yet: a new one is asked for
        assert isinstance(buffer, bytearray) and len(buffer) == 1 << 20
        assert r.publisher.shared is None
        assert [e["event"] for e in logs].count("shared_memory_failed") == 1


def _noise_step(learners: list[Learner], seed: int) -> None:
    """The same step of every learner: one gradient of noise."""
    for learner in learners:
        noise = torch.Generator().manual_seed(seed)
        for p in learner.model.parameters():  # type: ignore[attr-defined]
            p.grad = torch.randn(p.shape, generator=noise)
        learner.step(1.0)


async def test_a_staged_version_is_stepped_in_its_slot_and_never_written_once_offered(
    network: InprocNetwork,
) -> None:
    """As the trainer does: the parameters moved into a slot while the workers begin, the step taken
    there, the slot offered as it is; the worker computes with it while the learner moves on."""
    async with rig(network) as r:
        shared, dtype = r.publisher.shared, publish_dtype(CFG)
        assert shared is not None
        staged, plain = make_learner(CFG, make_tokenizer(CFG)), make_learner(CFG, make_tokenizer(CFG))
        offered: list[tuple[mmap.mmap, bytes]] = []
        for version in (2, 3, 4):
            assert staged.stage(r.publisher.buffer, dtype) is None  # type: ignore[attr-defined]
            _noise_step([staged, plain], version)
            data = staged.weights(r.publisher.buffer, dtype)
            assert isinstance(data, mmap.mmap) and bytes(data) == bytes(plain.weights(dtype=dtype))
            await r.publisher.publish(version, data)
            assert next(s for s in shared._slots if s.version == version).view is data  # no copy
            assert (await r.weights.fetch_and_load(r.client, version))[0] == "shm"
            offered.append((data, bytes(data)))
            assert all(bytes(slot) == kept for slot, kept in offered)  # none written since offered
        assert staged.versions.moves == 0  # type: ignore[attr-defined]
        reference = make_engine(CFG, make_tokenizer(CFG))
        reference.load(plain.weights(dtype=dtype))
        assert r.engine.generate([1, 2, 3], [7, 8]) == reference.generate([1, 2, 3], [7, 8])
