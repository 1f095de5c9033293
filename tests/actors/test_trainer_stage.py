"""The trainer stages a period's version once the workers on its host have loaded the period's own
(they let the version before go): not while a worker's digest check still reads its memory, and
never later than the period's first group or SETTLE_S."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from cadence.actors import trainer_stage
from cadence.actors.trainer_stage import VersionStaging
from cadence.transport.shared_memory import SharedReader, SharedVersions, sharing_problem
from cadence.wire.digest import digest
from cadence.wire.messages import WeightMeta

pytestmark = pytest.mark.timeout(60)

BIG = trainer_stage.WAIT_BYTES  # a version large enough to be worth the wait


class StagingLearner:
    """Records, at each stage, what `seen()` said then."""

    def __init__(self, seen: Callable[[], Any]) -> None:
        self.seen = seen
        self.staged: list[Any] = []

    def stage(self, alloc: Callable[[int], Any], dtype: str | None) -> str | None:
        self.staged.append(self.seen())
        return None


async def run_now(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


def staging(learner: StagingLearner, held: Callable[[int], bool] | None) -> VersionStaging:
    return VersionStaging(learner, run_now, bytearray, None, time.monotonic, held)  # type: ignore[arg-type]


def always_held(asked: list[int]) -> Callable[[int], bool]:
    """A `held` that says every version is held, recording each version it is asked about."""

    def held(version: int) -> bool:
        asked.append(version)
        return True

    return held


@pytest.mark.skipif(sharing_problem() is not None, reason=f"this host cannot share: {sharing_problem()}")
async def test_the_stage_waits_until_the_worker_on_its_host_has_let_the_version_before_go(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(trainer_stage, "SETTLE_S", 600.0)  # only the worker's letting go ends this wait
    shared = SharedVersions(keep=2)
    try:
        version = (4).to_bytes(8, "little") * 1024
        slot = shared.write(4, version)
        assert not shared.held(4)
        mapped = SharedReader().map(
            WeightMeta(4, True, len(version), digest(version), 1 << 20, 1, shared=slot)
        )
        assert shared.held(4) and not shared.held(3)  # a version no slot holds is held by nobody
        learner = StagingLearner(lambda: shared.held(4))
        stage = asyncio.create_task(staging(learner, shared.held)(5, lambda: False, BIG))
        for _ in range(20):
            await asyncio.sleep(0)
        assert learner.staged == []  # still held: still waiting
        mapped.release()  # as a worker does once it has loaded version 5
        await asyncio.wait_for(stage, 30)
        assert learner.staged == [False]
    finally:
        shared.close()


async def test_a_groups_arrival_ends_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trainer_stage, "SETTLE_S", 600.0)
    asked = 0

    def arrived() -> bool:
        nonlocal asked
        asked += 1
        return asked > 3

    learner = StagingLearner(lambda: asked)
    await asyncio.wait_for(staging(learner, lambda version: True)(5, arrived, BIG), 30)
    assert learner.staged == [4]  # staged as the arrival was seen, the version before still held


async def test_a_version_held_on_stops_waiting_after_the_settle_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trainer_stage, "SETTLE_S", 0.05)
    begin = time.monotonic()
    learner = StagingLearner(lambda: time.monotonic() - begin)
    await asyncio.wait_for(staging(learner, lambda version: True)(5, lambda: False, BIG), 30)
    assert len(learner.staged) == 1 and learner.staged[0] >= 0.05


async def test_nothing_to_wait_for_without_workers_on_the_host_or_before_the_first_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(trainer_stage, "SETTLE_S", 600.0)
    asked: list[int] = []
    held = always_held(asked)
    learner = StagingLearner(lambda: None)
    await asyncio.wait_for(staging(learner, None)(5, lambda: False, BIG), 30)
    await asyncio.wait_for(staging(learner, held)(0, lambda: False, BIG), 30)  # period 0: no version before
    assert learner.staged == [None, None] and asked == []


async def test_a_learner_that_cannot_stage_is_asked_once() -> None:
    class Unstageable(StagingLearner):
        def stage(self, alloc: Callable[[int], Any], dtype: str | None) -> str | None:
            self.staged.append("asked")
            return "a tensor off the CPU"

    learner = Unstageable(lambda: None)
    stage = staging(learner, None)
    for period in range(3):
        await stage(period, lambda: False, BIG)
    assert learner.staged == ["asked"] and stage.unstaged


async def test_a_small_version_is_staged_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trainer_stage, "SETTLE_S", 600.0)
    asked: list[int] = []
    held = always_held(asked)
    learner = StagingLearner(lambda: None)
    await asyncio.wait_for(staging(learner, held)(5, lambda: False, BIG - 1), 30)
    assert learner.staged == [None] and asked == []
