"""A real rollout worker and publisher on in-process channels, the worker registered and welcomed by
a test standing in for the dispatcher (and binding the trainer's address): what the worker tests
assign to and read back from."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from cadence.actors.publisher import Publisher
from cadence.actors.rollout import RolloutWorker
from cadence.config import RunConfig
from cadence.launch.build import make_episodes, make_group_maker, make_tokenizer
from cadence.launch.settings import session, worker_settings
from cadence.model.rollout_engine import RolloutEngine
from cadence.transport.heartbeat import Liveness
from cadence.transport.inproc import InprocNetwork, InprocServer
from cadence.transport.session import Session
from cadence.transport.weights import WeightStore
from cadence.wire.buffer import Buffer
from cadence.wire.messages import Register, Welcome, WorkRequest
from tests.conftest import expect


@dataclass
class Welcomed:
    worker: RolloutWorker
    dispatcher: InprocServer
    trainer: InprocServer
    peers: dict[str, bytes]  # role -> its route at the dispatcher


@asynccontextmanager
async def welcomed_worker(
    cfg: RunConfig,
    network: InprocNetwork,
    engine: RolloutEngine,
    weights: bytes | Buffer,
    chunk_bytes: int,
    timeout: float = 5.0,
) -> AsyncIterator[Welcomed]:
    """Worker "w0" on `engine` (episodes as `cfg` says) and a publisher holding `weights` as version 0,
    both registered, the worker welcomed and asking for work; both stopped on leaving."""
    tokenizer = make_tokenizer(cfg)
    dispatcher = network.bind("dispatcher", "inproc://dispatcher")
    trainer = network.bind("trainer", "inproc://trainer")
    store = WeightStore(chunk_bytes=chunk_bytes, keep=2)
    store.put(0, weights)
    server = network.bind("publisher", "inproc://publisher")
    client = network.connect("publisher", "inproc://dispatcher")
    publisher = Publisher(
        server, Session(client, "publisher", Liveness(1.0, 100, time.time), server.address), store
    )
    worker = RolloutWorker(
        worker_settings(cfg),
        "w0",
        session(cfg, network.connect("w0", "inproc://dispatcher"), "rollout", time.time),
        network.connect,
        make_group_maker(cfg, tokenizer, engine, make_episodes(cfg, tokenizer)),
        time.time,
    )
    tasks = [asyncio.create_task(publisher.run()), asyncio.create_task(worker.run())]
    try:
        peers: dict[str, bytes] = {}
        while len(peers) < 2:
            peer, env = await asyncio.wait_for(dispatcher.recv(), timeout)
            if isinstance(env.message, Register):
                peers[env.message.role] = peer
        await dispatcher.send(peers["rollout"], Welcome("inproc://trainer", "inproc://publisher", 0))
        await expect(dispatcher, WorkRequest, timeout=timeout)
        yield Welcomed(worker, dispatcher, trainer, peers)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
