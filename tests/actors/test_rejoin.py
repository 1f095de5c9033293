"""A trainer that comes back from its resume checkpoint: the dispatcher waits for it and starts its
period over; a worker told of the new trainer drops what it held and serves the new one."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import structlog

from cadence.actors.dispatcher import Dispatcher
from cadence.actors.publisher import Publisher
from cadence.actors.rollout import RolloutWorker
from cadence.launch.build import make_engine, make_group_maker, make_learner, make_tokenizer
from cadence.launch.settings import dispatcher_settings, liveness, session, worker_settings
from cadence.monitor.run_dir import RunRecorder, read_jsonl
from cadence.tasks.registry import make_task
from cadence.transport.heartbeat import Liveness
from cadence.transport.inproc import InprocNetwork, InprocServer
from cadence.transport.session import Session
from cadence.transport.weights import WeightStore
from cadence.wire.messages import (
    Assignment,
    GroupResult,
    Register,
    Shutdown,
    VersionReady,
    Welcome,
    WorkRequest,
)
from tests.conftest import expect, join, keep_beating, tiny_config

pytestmark = pytest.mark.timeout(30)


def row(period: int, reward: float) -> dict[str, float]:
    return {"period": period, "groups": 4, "samples": 16, "tokens_generated": 8, "reward_mean": reward}


async def test_a_lost_trainer_is_awaited_and_its_successor_starts_its_period_over(
    network: InprocNetwork, tmp_path: Path
) -> None:
    cfg = tiny_config(
        "transport.liveness=20",
        "trainer.checkpoint_every=2",
        "trainer.on_loss='wait'",
        "periods=4",
        "rollout.inflight=4",
    )
    server = network.bind("dispatcher", "inproc://dispatcher")
    recorder = RunRecorder(tmp_path, cfg.mode)
    task = asyncio.create_task(
        Dispatcher(
            dispatcher_settings(cfg),
            server,
            make_task(cfg.task, cfg.seed),
            recorder,
            liveness(cfg, time.time),
            time.time,
        ).run()
    )
    trainer = await join(network, "trainer", "trainer", "inproc://t1")
    publisher = await join(network, "publisher", "publisher", "inproc://p1")
    worker = await join(network, "w0", "rollout")
    alive = [trainer, publisher, worker]

    beating = keep_beating(alive)
    assert (await expect(worker, Welcome)).trainer_address == "inproc://t1"
    await worker.send(WorkRequest(2))
    await trainer.send(VersionReady(0, "digest", 10, {}))
    assert [(await expect(worker, Assignment)).period for _ in range(2)] == [0, 0]
    await trainer.send(VersionReady(1, "digest", 10, row(0, 0.5)))
    await worker.send(WorkRequest(1))
    held = await expect(worker, Assignment)
    assert held.period == 1
    with structlog.testing.capture_logs() as logs:
        alive[:2] = []  # the trainer's process dies, and the publisher it hosted with it
        while len([e for e in logs if e["event"] == "trainer_lost_waiting"]) < 2:
            await asyncio.sleep(0.05)
        await worker.send(WorkRequest(4))
        with pytest.raises(TimeoutError):  # nothing is handed out while no trainer is there
            await expect(worker, Assignment, timeout=0.3)
        assert not task.done()
        # a trainer resumed from its checkpoint of version 1 (which holds the metrics of period 0)
        trainer = await join(network, "trainer-2", "trainer", "inproc://t2")
        publisher = await join(network, "publisher-2", "publisher", "inproc://p2")
        alive += [trainer, publisher]
        welcome = await expect(worker, Welcome)
        assert (welcome.trainer_address, welcome.publisher_address) == ("inproc://t2", "inproc://p2")
        await worker.send(WorkRequest(4))
        await trainer.send(VersionReady(1, "digest", 10, row(0, 1.0)))
        again = [await expect(worker, Assignment) for _ in range(4)]
    beating.cancel()
    assert all(a.period == 1 and a.version == 1 for a in again)
    assert held.prompt_id in {a.prompt_id for a in again}  # what the old trainer never got is redone
    lines = read_jsonl(tmp_path / "metrics.jsonl")
    assert [(r["period"], r["reward_mean"]) for r in lines] == [(0, 1.0)]  # no period twice
    assert [e["event"] for e in logs if e["event"] == "metrics_rewound"] == ["metrics_rewound"]
    task.cancel()


async def next_work_request(dispatcher: InprocServer) -> WorkRequest:
    while True:
        _, env = await asyncio.wait_for(dispatcher.recv(), 5)
        if isinstance(env.message, WorkRequest):
            return env.message


async def test_a_worker_told_of_a_new_trainer_drops_its_jobs_and_serves_the_new_one(
    network: InprocNetwork,
) -> None:
    cfg = tiny_config("transport.liveness=200", "trainer.checkpoint_every=2", "trainer.on_loss='wait'")
    tokenizer = make_tokenizer(cfg)
    dispatcher = network.bind("dispatcher", "inproc://dispatcher")
    trainers = [network.bind(f"trainer-{i}", f"inproc://t{i}") for i in range(2)]
    weights = make_learner(cfg, tokenizer).weights()
    publishers = []
    for i in range(2):
        store = WeightStore(chunk_bytes=4096, keep=2)
        store.put(0, weights)
        server = network.bind(f"publisher-{i}", f"inproc://p{i}")
        client = network.connect(f"publisher-{i}", "inproc://dispatcher", route=f"publisher-{i}".encode())
        publishers.append(
            Publisher(
                server, Session(client, "publisher", Liveness(1.0, 100, time.time), server.address), store
            )
        )
    worker = RolloutWorker(
        worker_settings(cfg),
        "w0",
        session(cfg, network.connect("w0", "inproc://dispatcher", route=b"w0"), "rollout", time.time),
        network.connect,
        make_group_maker(cfg, tokenizer, make_engine(cfg, tokenizer), None),
        time.time,
    )
    tasks = [asyncio.create_task(p.run()) for p in publishers] + [asyncio.create_task(worker.run())]
    peer = b""
    while not peer:
        sender, env = await asyncio.wait_for(dispatcher.recv(), 5)
        if isinstance(env.message, Register) and env.message.role == "rollout":
            peer = sender
    await dispatcher.send(peer, Welcome("inproc://t0", "inproc://p0", 0))
    assert (await next_work_request(dispatcher)).credits == cfg.rollout.inflight
    await dispatcher.send(peer, Assignment(0, 0, 7, "37", "7", 4))
    assert (await expect(trainers[0], GroupResult)).prompt_id == 7
    with structlog.testing.capture_logs() as logs:
        # two more for the old trainer, then word that a new one took over: both are void
        await dispatcher.send(peer, Assignment(0, 0, 8, "38", "8", 4))
        await dispatcher.send(peer, Assignment(0, 0, 9, "39", "9", 4))
        await dispatcher.send(peer, Welcome("inproc://t1", "inproc://p1", 0))
        while (await next_work_request(dispatcher)).credits != cfg.rollout.inflight:
            pass
        await dispatcher.send(peer, Assignment(0, 0, 10, "40", "4", 4))
        result = await expect(trainers[1], GroupResult)
    assert result.prompt_id == 10 and result.load_s > 0  # the weights were pulled again, from p1
    assert trainers[0].inbox.qsize() == 0 and trainers[1].inbox.qsize() == 0
    changed = [e for e in logs if e["event"] == "trainer_changed"]
    assert len(changed) == 1 and changed[0]["trainer"] == "inproc://t1"
    for name in (b"publisher-0", b"publisher-1", b"w0"):
        await dispatcher.send(name, Shutdown("test over"))
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
