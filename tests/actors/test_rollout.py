"""A rollout worker with a real publisher and engine; the test plays dispatcher and trainer."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from cadence.actors.publisher import Publisher
from cadence.actors.rollout import RolloutWorker
from cadence.launch.build import make_engine, make_learner, make_tokenizer
from cadence.launch.settings import session, worker_settings
from cadence.rewards.base import Sample, reward
from cadence.rewards.scorer import make_scorer
from cadence.tasks.registry import make_task
from cadence.transport.heartbeat import Liveness
from cadence.transport.inproc import InprocNetwork
from cadence.transport.session import Session
from cadence.transport.weights import WeightError, WeightStore
from cadence.wire.messages import (
    Assignment,
    GroupResult,
    Heartbeat,
    Register,
    Shutdown,
    Welcome,
    WorkRequest,
)
from tests.conftest import expect, tiny_config

pytestmark = pytest.mark.timeout(30)


async def test_worker_loads_the_named_version_and_pushes_scored_groups(network: InprocNetwork) -> None:
    cfg = tiny_config("transport.liveness=200")
    tokenizer = make_tokenizer(cfg)
    dispatcher = network.bind("dispatcher", "inproc://dispatcher")
    trainer = network.bind("trainer", "inproc://trainer")
    store = WeightStore(chunk_bytes=4096, keep=2)
    learner = make_learner(cfg, tokenizer)
    store.put(0, learner.weights())
    server = network.bind("publisher", "inproc://publisher")
    client = network.connect("publisher", "inproc://dispatcher")
    publisher = Publisher(
        server, Session(client, "publisher", Liveness(1.0, 100, time.time), server.address), store
    )
    engine = make_engine(cfg, tokenizer)
    worker = RolloutWorker(
        worker_settings(cfg),
        "w0",
        session(cfg, network.connect("w0", "inproc://dispatcher"), "rollout", time.time),
        network.connect,
        engine,
        make_scorer(cfg, make_task(cfg.task, cfg.seed)),
        tokenizer,
        time.time,
    )
    tasks = [asyncio.create_task(publisher.run()), asyncio.create_task(worker.run())]
    peers: dict[str, bytes] = {}
    while len(peers) < 2:
        peer, env = await asyncio.wait_for(dispatcher.recv(), 5)
        if isinstance(env.message, Register):
            peers[env.message.role] = peer
    await dispatcher.send(peers["rollout"], Welcome("inproc://trainer", "inproc://publisher", 0))
    _, env = await asyncio.wait_for(dispatcher.recv(), 5)
    while not isinstance(env.message, WorkRequest):
        _, env = await asyncio.wait_for(dispatcher.recv(), 5)
    assert env.message.credits == cfg.rollout.inflight
    await dispatcher.send(peers["rollout"], Assignment(0, 0, 7, "3+4=", "7", 4))
    result = await expect(trainer, GroupResult)
    assert (result.period, result.version, result.prompt_id) == (0, 0, 7)
    assert len(result.completions) == 4 and all(0.0 <= r <= 1.0 for r in result.rewards)
    assert result.prompt_tokens == tokenizer.encode("3+4=", bos=True)
    assert result.load_s > 0 and worker.loaded == 0
    # the engine now holds exactly the published bytes: same weights, same generation
    again = make_engine(cfg, tokenizer)
    stored = store.get(0)
    assert stored is not None
    again.load(stored.data)
    prompt = tokenizer.encode("3+4=", bos=True)
    assert [c.tokens for c in again.generate(prompt, [1, 2])] == [
        c.tokens for c in engine.generate(prompt, [1, 2])
    ]
    # an assignment for a version the publisher never had stops the worker with a named error
    await dispatcher.send(peers["rollout"], Assignment(1, 1, 8, "1+1=", "2", 4))
    with pytest.raises(WeightError, match="does not hold version 1"):
        await asyncio.wait_for(tasks[1], 5)
    assert worker.loaded == 0 and trainer.inbox.qsize() == 0
    await dispatcher.send(peers["publisher"], Shutdown("test over"))
    await asyncio.wait_for(tasks[0], 5)


_HEARTBEATS_SEEN = threading.Event()
_SCORING = threading.Event()


@reward("test_slow_until_heartbeats")
def _slow_until_heartbeats(sample: Sample) -> float:
    """A slow sync reward function: it returns 1 once the dispatcher has heard the worker's heartbeats
    while it ran, 0 if none came (its loop would be blocked)."""
    _SCORING.set()
    return 1.0 if _HEARTBEATS_SEEN.wait(20) else 0.0


async def test_a_slow_sync_reward_function_does_not_stop_the_heartbeats(network: InprocNetwork) -> None:
    cfg = tiny_config("transport.liveness=400", "rewards.weights={test_slow_until_heartbeats = 1.0}")
    tokenizer = make_tokenizer(cfg)
    dispatcher = network.bind("dispatcher", "inproc://dispatcher")
    trainer = network.bind("trainer", "inproc://trainer")
    store = WeightStore(chunk_bytes=4096, keep=2)
    store.put(0, make_learner(cfg, tokenizer).weights())
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
        make_engine(cfg, tokenizer),
        make_scorer(cfg, make_task(cfg.task, cfg.seed)),
        tokenizer,
        time.time,
    )
    _HEARTBEATS_SEEN.clear()
    _SCORING.clear()
    tasks = [asyncio.create_task(publisher.run()), asyncio.create_task(worker.run())]
    try:
        peers: dict[str, bytes] = {}
        while len(peers) < 2:
            peer, env = await asyncio.wait_for(dispatcher.recv(), 5)
            if isinstance(env.message, Register):
                peers[env.message.role] = peer
        await dispatcher.send(peers["rollout"], Welcome("inproc://trainer", "inproc://publisher", 0))
        await dispatcher.send(peers["rollout"], Assignment(0, 0, 7, "3+4=", "7", 4))
        beats = 0
        while beats < 3:  # heartbeats of the worker while its reward function runs
            peer, env = await asyncio.wait_for(dispatcher.recv(), 10)
            if peer == peers["rollout"] and isinstance(env.message, Heartbeat) and _SCORING.is_set():
                beats += 1
        _HEARTBEATS_SEEN.set()
        result = await expect(trainer, GroupResult, timeout=20)
        assert result.prompt_id == 7 and result.rewards == [1.0] * 4
    finally:
        _HEARTBEATS_SEEN.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
