"""A rollout worker told that a period is closed (`StopPeriod`), with a real publisher and engine; the
test plays dispatcher and trainer: nothing of the closed period reaches the trainer, whether its
groups were being made or still queued, and the worker asks for work again at once."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from cadence.launch.build import make_engine, make_learner, make_tokenizer
from cadence.rewards.base import Sample, reward
from cadence.transport.inproc import InprocNetwork
from cadence.wire.messages import Assignment, EvalResult, StopPeriod, WorkRequest
from tests.conftest import expect, tiny_config
from tests.worker_rig import welcomed_worker

pytestmark = pytest.mark.timeout(60)

_SCORING = threading.Event()
_RELEASE = threading.Event()


@reward("test_held_until_released")
def _held_until_released(sample: Sample) -> float:
    """Holds a group's scoring until the test lets it go (the period is stopped meanwhile)."""
    _SCORING.set()
    _RELEASE.wait(30)
    return 1.0


async def test_a_worker_told_to_stop_sends_nothing_of_that_period(network: InprocNetwork) -> None:
    cfg = tiny_config("transport.liveness=400", "rewards.weights={test_held_until_released = 1.0}")
    tokenizer = make_tokenizer(cfg)
    weights = make_learner(cfg, tokenizer).weights()
    _SCORING.clear()
    _RELEASE.clear()
    try:
        async with welcomed_worker(cfg, network, make_engine(cfg, tokenizer), weights, 4096) as rig:
            route = rig.peers["rollout"]
            for prompt_id in (3, 4):  # one batch, made together
                await rig.dispatcher.send(route, Assignment(0, 0, prompt_id, "3+4=", "7", 4, batch=2))
            assert await asyncio.to_thread(_SCORING.wait, 20)  # a group made, its scoring held
            await rig.dispatcher.send(route, StopPeriod(0))
            await rig.dispatcher.send(route, Assignment(0, 0, 5, "1+1=", "2", 4))  # queued, of period 0
            deadline = time.monotonic() + 20
            while 0 not in rig.worker.stopped:  # the stop is in before the scoring ends
                assert time.monotonic() < deadline, "the worker never took the stop"
                await asyncio.sleep(0.01)
            _RELEASE.set()
            # the batch's two credits and the skipped one's (which may have joined the stopped call)
            credits = [(await expect(rig.dispatcher, WorkRequest, timeout=20)).credits]
            if credits[0] < 3:
                credits.append((await expect(rig.dispatcher, WorkRequest, timeout=20)).credits)
            assert credits in ([2, 1], [3])
            assert rig.trainer.inbox.qsize() == 0 and rig.worker.groups_sent == 0  # nothing of period 0
            # an eval prompt of that version is not training work: still answered
            await rig.dispatcher.send(route, Assignment(0, 0, -1, "2+2=", "4", 1, eval=True))
            answer = await expect(rig.dispatcher, EvalResult, timeout=20)
            assert answer.prompt_id == -1 and rig.trainer.inbox.qsize() == 0
    finally:
        _RELEASE.set()
