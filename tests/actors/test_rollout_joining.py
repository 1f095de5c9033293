"""Continuous batching across a worker's assignments, with a real publisher and engine; the test plays
dispatcher and trainer: a batch that comes while the worker's call decodes joins that call, each
group as the engine makes it alone, a credit back as each group leaves; a batch of another version
waits for the next call."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest

from cadence.launch.build import make_engine, make_learner, make_tokenizer
from cadence.model.engine import (
    Completion,
    GroupEnded,
    JoinedGroup,
    JoiningGroups,
    StoppedGroups,
    sample_seed,
)
from cadence.model.rollout_engine import TorchRolloutEngine
from cadence.transport.inproc import InprocNetwork
from cadence.wire.messages import Assignment, EvalResult, GroupResult, StopPeriod, WorkRequest
from tests.conftest import expect, tiny_config
from tests.worker_rig import welcomed_worker

pytestmark = pytest.mark.timeout(60)


class HeldOpen(TorchRolloutEngine):
    """The built-in engine whose first call, at its first chance to take groups, waits (at most 20 s)
    until some are offered: the test's next batch joins it, whatever the machine's speed."""

    def __init__(self, inner: TorchRolloutEngine, resume: threading.Event | None = None) -> None:
        super().__init__(inner.engine, inner.params)
        self.started = threading.Event()
        self.joined = threading.Event()
        self.resume = resume  # once set, the call goes on after the join (None: at once)
        self.calls = 0

    def generate_many(
        self,
        groups: list[tuple[list[int], list[int]]],
        temperature: float | None = None,
        max_new_tokens: int | None = None,
        *,
        ended: GroupEnded | None = None,
        stopped: StoppedGroups | None = None,
        joining: JoiningGroups | None = None,
        **more_kwargs: Any,
    ) -> list[list[Completion]]:
        self.calls += 1
        if joining is not None and self.calls == 1:
            ask, waited = joining, [False]

            def waiting(room: int) -> Sequence[JoinedGroup]:
                self.started.set()
                deadline = time.monotonic() + 20
                while not (more := ask(room)) and not waited[0] and time.monotonic() < deadline:
                    time.sleep(0.01)
                if more and not waited[0]:
                    self.joined.set()
                    if self.resume is not None:
                        self.resume.wait(20)
                waited[0] = True
                return more

            joining = waiting
        return super().generate_many(
            groups, temperature, max_new_tokens, ended=ended, stopped=stopped, joining=joining, **more_kwargs
        )


async def test_a_batch_that_comes_while_the_call_decodes_joins_it(network: InprocNetwork) -> None:
    cfg = tiny_config("transport.liveness=400", "rollout.max_new_tokens=12", "rollout.join='on'")
    tokenizer = make_tokenizer(cfg)
    weights = make_learner(cfg, tokenizer).weights()
    built = make_engine(cfg, tokenizer)
    assert isinstance(built, TorchRolloutEngine)
    engine = HeldOpen(built)
    texts = {3: "3+4=", 5: "2+2=", 6: "10+11="}
    async with welcomed_worker(cfg, network, engine, weights, 4096) as rig:
        route = rig.peers["rollout"]
        await rig.dispatcher.send(route, Assignment(0, 0, 3, texts[3], "7", 4))
        assert await asyncio.to_thread(engine.started.wait, 20)  # the call decodes, waiting for more
        for prompt_id in (5, 6):
            await rig.dispatcher.send(route, Assignment(0, 0, prompt_id, texts[prompt_id], "x", 4, batch=2))
        await rig.dispatcher.send(route, Assignment(0, 0, -1, "1+1=", "2", 1, eval=True))  # not training work
        results = [await expect(rig.trainer, GroupResult, timeout=20) for _ in range(3)]
        assert sorted(r.prompt_id for r in results) == [3, 5, 6]
        credits = [(await expect(rig.dispatcher, WorkRequest, timeout=20)).credits for _ in range(3)]
        assert credits == [1, 1, 1]  # one as each group left: what the dispatcher sends for it may join
        assert (await expect(rig.dispatcher, EvalResult, timeout=20)).prompt_id == -1
        assert engine.calls == 2  # the three groups in one call; the eval prompt in a call of its own
        for r in results:  # each group is the one the engine makes of its prompt alone
            seeds = [sample_seed(cfg.seed, 0, r.prompt_id, i) for i in range(4)]
            own = built.generate(tokenizer.encode_prompt(texts[r.prompt_id]), seeds)
            assert r.completions == [c.tokens for c in own], r.prompt_id


async def test_a_stop_drops_the_groups_that_joined_the_call_too(network: InprocNetwork) -> None:
    """The period is stopped once a batch has joined the call: nothing of the call's own group nor of
    the joined ones reaches the trainer, and every credit comes back."""
    cfg = tiny_config("transport.liveness=400", "rollout.max_new_tokens=12", "rollout.join='on'")
    tokenizer = make_tokenizer(cfg)
    weights = make_learner(cfg, tokenizer).weights()
    built = make_engine(cfg, tokenizer)
    assert isinstance(built, TorchRolloutEngine)
    resume = threading.Event()
    engine = HeldOpen(built, resume)
    try:
        async with welcomed_worker(cfg, network, engine, weights, 4096) as rig:
            route = rig.peers["rollout"]
            await rig.dispatcher.send(route, Assignment(0, 0, 3, "3+4=", "7", 4))
            assert await asyncio.to_thread(engine.started.wait, 20)
            for prompt_id in (5, 6):
                await rig.dispatcher.send(route, Assignment(0, 0, prompt_id, "2+2=", "4", 4, batch=2))
            assert await asyncio.to_thread(engine.joined.wait, 20)  # taken: the call holds three groups
            await rig.dispatcher.send(route, StopPeriod(0))
            deadline = time.monotonic() + 20
            while 0 not in rig.worker.stopped:
                assert time.monotonic() < deadline, "the worker never took the stop"
                await asyncio.sleep(0.01)
            resume.set()
            credits = 0
            while credits < 3:
                credits += (await expect(rig.dispatcher, WorkRequest, timeout=20)).credits
            assert credits == 3 and rig.trainer.inbox.qsize() == 0 and rig.worker.groups_sent == 0
            # the join came at the call's first readback: the stop took every row at the next one, the
            # joined groups' too, rather than after their 12 tokens
            assert len(built.engine.last_call.steps) <= 2 and sum(built.engine.last_call.admissions) == 12
    finally:
        resume.set()
