"""A worker computes with more threads than its share while the trainer waits (sync mode: all the
while it generates; periodic: while the trainer's activity says so, between two decode steps), only
where its engine was measured to compute alike with both counts, asked once; switching the count
between steps changes no sample."""

from __future__ import annotations

import dataclasses
import itertools
import time
from types import SimpleNamespace

import pytest
import torch

from cadence.actors.rollout_weights import WorkerWeights
from cadence.launch.build import make_engine, make_tokenizer
from cadence.launch.settings import worker_settings
from cadence.model.rollout_engine import RolloutEngine, ThreadedEngine, TorchRolloutEngine
from cadence.transport.heartbeat import Liveness
from tests.conftest import tiny_config

CFG = tiny_config("mode='sync'", "rollout.workers=1")


class _Probed:
    """The built-in engine whose answer to the thread probe is set (a fake only at that edge)."""

    def __init__(self, engine: RolloutEngine, alike: bool) -> None:
        self.engine, self.alike = engine, alike
        self.asked: list[tuple[int, int, int]] = []

    def alike_at_threads(self, a: int, b: int) -> bool:
        self.asked.append((a, b, torch.get_num_threads()))
        return self.alike

    def __getattr__(self, name: str) -> object:
        return getattr(self.engine, name)


def _weights(engine: object, share: int, alone: int, beside: bool = False) -> tuple[WorkerWeights, list[int]]:
    budgets: list[int] = []
    settings = dataclasses.replace(
        worker_settings(CFG), threads=share, threads_alone=alone, trainer_beside=beside
    )
    weights = WorkerWeights(
        engine,  # type: ignore[arg-type]
        settings,
        Liveness(1.0, 100, time.time),
        time.time,
        use_threads=budgets.append,
    )
    return weights, budgets


@pytest.mark.parametrize(("alike", "taken"), [(True, 2), (False, 1)])
def test_the_sync_budget_is_taken_only_where_the_engine_computes_alike(alike: bool, taken: int) -> None:
    engine = _Probed(make_engine(CFG, make_tokenizer(CFG)), alike)
    assert isinstance(engine, ThreadedEngine)
    weights, budgets = _weights(engine, share=1, alone=2)
    for _ in range(3):
        with weights.computing():
            pass
    assert [(a, b) for a, b, _ in engine.asked] == [(1, 2)]  # asked once, at the first computation
    assert budgets == [1, taken, taken, taken]  # probed from the share, then the budget chosen


def test_an_engine_that_cannot_tell_keeps_the_share_and_equal_budgets_ask_nothing() -> None:
    class Plain:
        def load(self, weights: object) -> None: ...

    weights, budgets = _weights(Plain(), share=1, alone=2)
    with weights.computing():
        pass
    assert budgets == [1, 1]
    engine = _Probed(make_engine(CFG, make_tokenizer(CFG)), True)
    weights, budgets = _weights(engine, share=2, alone=2)
    with weights.computing():
        pass
    assert budgets == [2] and engine.asked == []


def test_the_built_in_engine_on_this_cpu_says_what_its_calls_show() -> None:
    """The real probe's verdict agrees with the engine's own calls at the two counts."""
    engine = make_engine(CFG, make_tokenizer(CFG))
    assert isinstance(engine, ThreadedEngine)
    before = torch.get_num_threads()
    verdict = engine.alike_at_threads(1, 2)
    assert torch.get_num_threads() == before
    calls = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        calls.append([[(c.tokens, c.logprobs) for c in engine.generate([5, 9, 2, 7], [1, 2, 3])]])
    torch.set_num_threads(before)
    if verdict:
        assert calls[0] == calls[1]


def test_beside_a_trainer_the_budget_follows_its_activity_between_steps() -> None:
    engine = _Probed(make_engine(CFG, make_tokenizer(CFG)), True)
    weights, budgets = _weights(engine, share=1, alone=2, beside=True)
    with weights.computing():  # no activity read yet (no shared slot mapped): the share
        pass
    assert budgets == [1, 1] and engine.pace == weights._budget  # asked again between decode steps
    weights.activity = SimpleNamespace(busy=lambda: False)  # type: ignore[assignment]
    engine.pace()
    weights.activity = SimpleNamespace(busy=lambda: True)  # type: ignore[assignment]
    engine.pace()
    assert budgets == [1, 1, 2, 1]
    unlike = _Probed(make_engine(CFG, make_tokenizer(CFG)), False)
    weights, budgets = _weights(unlike, share=1, alone=2, beside=True)
    with weights.computing():
        pass
    assert budgets == [1, 1] and getattr(unlike.engine, "pace", None) is None  # never asked between steps


def test_switching_threads_between_steps_changes_no_sample() -> None:
    """The real engine and probe, the trainer's activity flipping at every readback: the samples are
    those of one thread throughout (where the probe says alike; else the count never moves)."""
    engine = make_engine(CFG, make_tokenizer(CFG))
    assert isinstance(engine, TorchRolloutEngine)
    weights, budgets = _weights(engine, share=1, alone=2, beside=True)
    flips = itertools.cycle([False, True])
    weights.activity = SimpleNamespace(busy=lambda: next(flips))  # type: ignore[assignment]
    groups = [([5, 9, 2, 7, 11], [1, 2, 3]), ([4, 8], [4, 5])]
    before = torch.get_num_threads()
    try:
        with weights.computing():
            switching = engine.generate_many(groups, max_new_tokens=12)
        engine.pace = None
        torch.set_num_threads(1)
        one = engine.generate_many(groups, max_new_tokens=12)
    finally:
        torch.set_num_threads(before)
    assert [[(c.tokens, c.logprobs) for c in g] for g in switching] == [
        [(c.tokens, c.logprobs) for c in g] for g in one
    ]
    assert set(budgets) == ({1, 2} if weights._alike else {1})
