"""The trainer and groups of episodes: a group whose masks or episode figures mean nothing is refused and
logged like any other meaningless group, and the trainer goes on with the sound ones."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
import structlog

from cadence.transport.endpoint import RefusalLog
from cadence.transport.inproc import InprocNetwork
from cadence.wire.messages import Consumed, EpisodeFigures, GroupResult, Register, VersionReady
from tests.actors.test_trainer import group, start
from tests.conftest import expect

pytestmark = pytest.mark.timeout(30)


FIGURES = set(EpisodeFigures.__struct_fields__)


def episodes(period: int, prompt_id: int, **changes: object) -> GroupResult:
    """A sound group of two episodes (`test_trainer.group`'s tokens), the environment's tokens 0;
    `changes` to its fields or to its episodes' figures."""
    figures = EpisodeFigures(
        turns=[1, 2],
        tool_calls=[1, 1],
        tool_errors=[0, 1],
        env_timeouts=[0, 0],
        env_s=[0.5, 0.25],
        env_tokens=[1, 1],
        endings=["done", "max_turns"],
    )
    sound = msgspec.structs.replace(
        group(period, prompt_id),
        logprobs=[[-1.0, 0.0], [-1.0, 0.0, -1.0]],
        masks=[[1, 0], [1, 0, 1]],
        episodes=msgspec.structs.replace(figures, **{k: v for k, v in changes.items() if k in FIGURES}),
    )
    return msgspec.structs.replace(sound, **{k: v for k, v in changes.items() if k not in FIGURES})


async def test_meaningless_episode_groups_are_refused_and_the_trainer_goes_on(
    network: InprocNetwork, tmp_path: Path
) -> None:
    cfg, dispatcher, worker, learner, published, task, trainer = await start(network, tmp_path)
    trainer.server.refusals = RefusalLog("trainer", per_second=100)  # log every one of them
    await expect(dispatcher, VersionReady, skip=(Register,))
    with structlog.testing.capture_logs() as logs:
        await worker.send(episodes(0, 0, masks=[[1, 0]]))
        await worker.send(episodes(0, 0, masks=[[1, 0], [1, 2, 1]]))
        await worker.send(episodes(0, 0, logprobs=[[-1.0, -1.0], [-1.0, 0.0, -1.0]]))
        await worker.send(episodes(0, 0, env_s=[float("nan"), 0.0]))
        await worker.send(episodes(0, 0, endings=["done", "forged"]))
        for pid in (0, 1, 2, 3):
            await worker.send(episodes(0, pid))
        ready = await expect(dispatcher, VersionReady, skip=(Consumed,))
    refused = [(e["peer"], e["role"], e["reason"]) for e in logs if e["event"] == "message_refused"]
    assert [peer for peer, _, _ in refused] == ["w0"] * 5 and {role for _, role, _ in refused} == {"rollout"}
    assert [reason.split(":")[0] for _, _, reason in refused[1:3]] == ["completion 1", "completion 0"]
    assert "masks" in refused[0][2] and "environment time" in refused[3][2] and "ending" in refused[4][2]
    assert trainer.server.refused == 5
    assert ready.version == 1 and ready.metrics["groups"] == 4  # the sound ones, every one trained
    assert [c for c in learner.calls if c[0] == "train"] == [("train", 0.0)] * 4
    task.cancel()
