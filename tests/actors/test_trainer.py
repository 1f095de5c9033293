"""The trainer on in-process channels: the version rule, deduplication, one step a period, sync mode."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import msgspec
import pytest
import structlog
from torch import Tensor

from cadence.actors.trainer import PublishEarly, Trainer
from cadence.launch.settings import session, trainer_settings
from cadence.monitor.samples import SampleWriter
from cadence.ops.schedule import lr_at
from cadence.training.learner import TrainGroup
from cadence.training.resume import RunRecord
from cadence.transport.endpoint import Client, RefusalLog
from cadence.transport.inproc import InprocNetwork
from cadence.wire.buffer import Buffer
from cadence.wire.messages import (
    Consumed,
    EvalResult,
    GroupResult,
    Register,
    RunDone,
    Shutdown,
    VersionReady,
)
from cadence.wire.roles import assignment_ticket
from tests.conftest import expect, tiny_config

pytestmark = pytest.mark.timeout(30)

VOCAB = 16  # token ids the model takes; the groups below use 1 to 7


class RecordingLearner:
    """Stands in for the model at the edge: records what the trainer asks of it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []  # ("train", group tag) each group, ("step", normaliser)
        self.micro: list[list[float]] = []  # the tags of each micro-batch, in order
        self.old: list[list[list[float]] | None] = []
        self.rates: list[float | None] = []  # the learning rate of each step
        self.gate = threading.Event()  # the first micro-batch waits for it
        self.gate.set()
        self.entered = threading.Event()  # set when a micro-batch is being trained
        self.threads: list[int] = []  # the budget each computation was given, in order
        self.budgets: list[tuple[str, int]] = []  # (what was computed, with how many threads)
        self.activity: list[bool] = []  # what the trainer told the workers on its host, in order
        self.busy: list[bool] = []  # whether it had said "computing" during each train and step
        self.dtypes: list[str | None] = []  # the dtype each version was asked in
        self.engine: list[list[list[float]] | None] = []  # each group's engine log-probs (not the old)
        self.gap: dict[str, float] = {}  # the engine-learner figures each step reports

    def use_threads(self, threads: int) -> None:
        self.threads.append(threads)

    def computing(self, busy: bool) -> None:
        self.activity.append(busy)

    def train_groups(self, groups: Sequence[TrainGroup]) -> dict[str, float]:
        self.entered.set()
        self.gate.wait(10)
        self.micro.append([g.rewards[0] for g in groups])
        self.budgets.append(("train", self.threads[-1]))
        self.busy.append(self.activity[-1])
        for g in groups:
            self.calls.append(("train", g.rewards[0]))
            self.old.append(g.old_logprobs)
            self.engine.append(g.engine_logprobs)
        return {}

    def step(self, normaliser: float, lr: float | None = None) -> dict[str, float]:
        self.calls.append(("step", normaliser))
        self.budgets.append(("step", self.threads[-1]))
        self.busy.append(self.activity[-1])
        self.rates.append(lr)
        figures = {} if lr is None else {"lr": lr, "entropy": 0.5 + len(self.rates), "clip_fraction": 0.25}
        return figures | self.gap

    def weights(self, alloc: Callable[[int], Buffer] = bytearray, dtype: str | None = None) -> bytes:
        self.budgets.append(("weights", self.threads[-1]))
        self.dtypes.append(dtype)
        return f"weights after {sum(c[0] == 'step' for c in self.calls)} steps".encode()

    def tensors(self) -> Mapping[str, Tensor]:
        return {}

    def save(self, directory: Path) -> str:
        return "final-sha"

    def save_state(self, directory: Path) -> None:
        raise AssertionError("these runs keep no resume checkpoint")

    def load_state(self, directory: Path) -> None:
        raise AssertionError("these runs keep no resume checkpoint")


def group(period: int, prompt_id: int, version: int | None = None, tag: float = 0.0) -> GroupResult:
    return GroupResult(
        period=period,
        version=period if version is None else version,
        prompt_id=prompt_id,
        prompt_tokens=[1, 3, 4],
        completions=[[5, 2], [6, 7, 2]],
        logprobs=[[-1.0, -1.0], [-1.0, -1.0, -1.0]],
        rewards=[tag, 0.0],
        correct=[0.0, 0.0],
        gen_s=0.01,
        load_s=0.0,
        finished_at=0.0,
    )


class Worker:
    """A rollout worker at the edge: sends each group with the ticket the dispatcher would have given it
    for that prompt (made with the trainer's key)."""

    def __init__(self, client: Client, key: str) -> None:
        self.client = client
        self.key = key

    async def send(self, msg: GroupResult) -> None:
        shown = assignment_ticket(self.key, msg.period, msg.prompt_id, self.client.name)
        await self.client.send(msgspec.structs.replace(msg, ticket=shown))


async def start(  # type: ignore[no-untyped-def]
    network: InprocNetwork, tmp_path: Path, *overrides: str, early: PublishEarly | None = None
):
    cfg = tiny_config("periods=2", "transport.liveness=200", "rollout.group_size=2", *overrides)
    dispatcher = network.bind("dispatcher", "inproc://dispatcher")
    published: list[int] = []

    async def publish(version: int, data: bytes | Buffer) -> str:
        published.append(version)
        return f"sha{version}"

    learner = RecordingLearner()
    server = network.bind("trainer", "inproc://trainer")
    client = network.connect("trainer", "inproc://dispatcher", route=b"trainer")  # the test replies to it
    own = session(cfg, client, "trainer", time.time, server.address)
    settings = dataclasses.replace(trainer_settings(cfg, VOCAB), threads=1, threads_alone=2)
    trainer = Trainer(
        settings,
        server,
        own,
        learner,
        publish,
        time.time,
        tmp_path,
        RunRecord.of(cfg),
        samples=SampleWriter(tmp_path / "samples"),
        use_threads=learner.use_threads,
        computing=learner.computing,
        early=early,
    )
    task = asyncio.create_task(trainer.run())
    worker = Worker(network.connect("w0", "inproc://trainer"), own.key)
    return cfg, dispatcher, worker, learner, published, task, trainer


async def test_version_rule_duplicates_and_one_step_per_period(
    network: InprocNetwork, tmp_path: Path
) -> None:
    cfg, dispatcher, worker, learner, published, task, _ = await start(network, tmp_path)
    assert (await expect(dispatcher, Register)).role == "trainer"
    assert (await expect(dispatcher, VersionReady)).version == 0
    with structlog.testing.capture_logs() as logs:
        await worker.send(group(0, 0, version=1))  # a version the trainer is not at: stale
        await worker.send(group(0, 0, tag=1.0))
        await worker.send(group(0, 0, tag=2.0))  # the same prompt again: duplicate
        for pid in (1, 2, 3):
            await worker.send(group(0, pid))
        ready = await expect(dispatcher, VersionReady, skip=(Consumed,))
    assert ready.version == 1 and published == [0, 1]
    assert ready.metrics["stale_dropped"] == 1 and ready.metrics["duplicates_dropped"] == 1
    assert ready.metrics["groups"] == 4 and ready.metrics["samples"] == 8
    assert [c[0] for c in learner.calls] == ["train"] * 4 + ["step"]
    assert learner.calls[0] == ("train", 1.0)  # the first accepted copy, not the duplicate
    assert learner.calls[-1] == ("step", 4 * 5.0)  # normaliser: response tokens of the period
    assert {e["event"] for e in logs} >= {"stale_dropped", "duplicate_dropped"}
    # a late copy of period 0 during period 1 is a duplicate, not stale
    await worker.send(group(0, 2))
    for pid in (4, 5, 6, 7):
        await worker.send(group(1, pid))
    ready = await expect(dispatcher, VersionReady, skip=(Consumed,))
    assert (
        ready.version == 2
        and ready.metrics["duplicates_dropped"] == 1
        and ready.metrics["stale_dropped"] == 0
    )
    done = await expect(dispatcher, RunDone, skip=(Consumed,))
    assert done.version == 2 and done.sha256 == "final-sha"
    await dispatcher.send(b"trainer", Shutdown("run complete"))
    await asyncio.wait_for(task, 5)


async def test_the_trainer_takes_every_core_once_the_period_has_nothing_left_to_generate(
    network: InprocNetwork, tmp_path: Path
) -> None:
    cfg, dispatcher, worker, learner, published, task, _ = await start(
        network, tmp_path, "trainer.micro_batch_tokens=0"
    )
    await expect(dispatcher, VersionReady, skip=(Register,))
    for pid in (0, 1, 2, 3):
        await worker.send(group(0, pid))
        await expect(dispatcher, Consumed)
        trained = functools.partial(lambda n: len(learner.micro) == n, pid + 1)
        await until(trained)  # trained alone, as it came
    await expect(dispatcher, VersionReady, skip=(Consumed,))
    # version 0 is published before any worker generates; each group but the last while one does
    assert learner.budgets == [("weights", 2)] + [("train", 1)] * 3 + [
        ("train", 2),
        ("step", 2),
        ("weights", 2),
    ]
    # the workers on its host were told it computes as each computation began, and that it waits after
    told = learner.activity  # waiting from the start, then computing around each computation
    assert learner.busy == [True] * 5 and told == [False] + [True, False] * (len(told) // 2)
    task.cancel()


@pytest.mark.parametrize(("engine_dtype", "published"), [("float32", None), ("bfloat16", "bfloat16")])
async def test_versions_are_published_in_the_precision_the_workers_compute_in(
    network: InprocNetwork, tmp_path: Path, engine_dtype: str, published: str | None
) -> None:
    *_, learner, _, task, _ = await start(network, tmp_path, f"rollout.dtype={engine_dtype!r}")
    await until(lambda: len(learner.dtypes) == 1)
    assert learner.dtypes == [published]  # float32: the learner's own, as it is
    task.cancel()


async def test_a_version_published_on_the_gpu_first_is_announced_without_being_serialised(
    network: InprocNetwork, tmp_path: Path
) -> None:
    """Where the publisher takes a version on the trainer's GPU first, the trainer announces it at once
    (its size, no digest yet: the publisher stores the host bytes meanwhile) and serialises nothing;
    where it cannot (version 0 here), the version is serialised and published as before."""
    on_device: list[int] = []

    async def early(version: int) -> int | None:
        on_device.append(version)
        return None if version == 0 else 4096

    cfg, dispatcher, worker, learner, published, task, _ = await start(network, tmp_path, early=early)
    first = await expect(dispatcher, VersionReady, skip=(Register,))
    assert (first.version, first.digest) == (0, "sha0") and published == [0]
    for pid in range(4):
        await worker.send(group(0, pid))
    ready = await expect(dispatcher, VersionReady, skip=(Consumed,))
    assert (ready.version, ready.digest, ready.nbytes) == (1, "", 4096)
    assert on_device == [0, 1] and published == [0] and len(learner.dtypes) == 1
    assert ready.metrics["version_bytes"] == 4096
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_sync_mode_trains_only_when_all_groups_are_in(network: InprocNetwork, tmp_path: Path) -> None:
    cfg, dispatcher, worker, learner, published, task, _ = await start(network, tmp_path, "mode=sync")
    await expect(dispatcher, VersionReady, skip=(Register,))
    for pid in (0, 1, 2):
        await worker.send(group(0, pid))
    consumed = [await expect(dispatcher, Consumed) for _ in range(3)]
    assert [c.prompt_ids for c in consumed] == [[0], [1], [2]]
    assert learner.calls == []  # three of four in: nothing trained yet
    await worker.send(group(0, 3))
    await expect(dispatcher, VersionReady, skip=(Consumed,))
    assert [c[0] for c in learner.calls] == ["train"] * 4 + ["step"]
    task.cancel()


async def test_several_steps_a_period_use_the_sampler_log_probs(
    network: InprocNetwork, tmp_path: Path
) -> None:
    cfg, dispatcher, worker, learner, published, task, _ = await start(
        network, tmp_path, "trainer.steps_per_period=2"
    )
    await expect(dispatcher, VersionReady, skip=(Register,))
    for pid in (0, 1, 2, 3):
        await worker.send(group(0, pid))
    ready = await expect(dispatcher, VersionReady, skip=(Consumed,))
    assert ready.version == 1 and published == [0, 1]  # still one version a period
    assert [c[0] for c in learner.calls] == ["train", "train", "step", "train", "train", "step"]
    assert [c[1] for c in learner.calls if c[0] == "step"] == [10.0, 10.0]  # each step its own tokens
    assert learner.old == [group(0, 0).logprobs] * 4
    task.cancel()


@pytest.mark.parametrize(
    ("objective", "normaliser"), [("dapo", 10.0), ("grpo", 4.0), ("gspo", 4.0), ("dr_grpo", 4 * 4.0)]
)
async def test_each_step_takes_the_schedule_rate_and_the_objective_normaliser(
    network: InprocNetwork, tmp_path: Path, objective: str, normaliser: float
) -> None:
    """Two periods of two steps under a cosine schedule with one warmup period: the four rates of
    ops/schedule.py in order; dr_grpo divides by max_new_tokens (4) x samples, grpo and gspo by samples."""
    overrides = ["trainer.steps_per_period=2", "trainer.lr_schedule='cosine'", "trainer.warmup_periods=1"]
    cfg, dispatcher, worker, learner, published, task, _ = await start(
        network, tmp_path, *overrides, f"trainer.objective='{objective}'", "rollout.max_new_tokens=4"
    )
    await expect(dispatcher, VersionReady, skip=(Register,))
    rows = []
    for period in (0, 1):
        for pid in range(4):
            await worker.send(group(period, 4 * period + pid))
        rows.append((await expect(dispatcher, VersionReady, skip=(Consumed,))).metrics)
    lr = cfg.trainer.lr
    # warmup (s + 1) / 2, then the half cosine at progress 0 and 1/2 of the 2 steps after it
    want = [lr * 0.5, lr, lr, lr * 0.5 * (1 + math.cos(math.pi / 2))]
    assert learner.rates == pytest.approx(want)
    assert want == pytest.approx([lr_at(step, lr, "cosine", 4, 2) for step in range(4)])
    assert [c[1] for c in learner.calls if c[0] == "step"] == [normaliser] * 4
    assert [r["lr"] for r in rows] == pytest.approx([want[1], want[3]])  # the period's last step
    assert [r["entropy"] for r in rows] == [2.0, 4.0] and rows[0]["clip_fraction"] == 0.25  # steps' mean
    task.cancel()


async def until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.005)


@pytest.mark.parametrize(
    ("budget", "micro"),
    [(14, [[0.0], [1.0, 2.0], [3.0]]), (4096, [[0.0], [1.0, 2.0, 3.0]]), (0, [[0.0], [1.0], [2.0], [3.0]])],
)
async def test_groups_that_arrive_while_training_share_a_micro_batch(
    network: InprocNetwork, tmp_path: Path, budget: int, micro: list[list[float]]
) -> None:
    cfg, dispatcher, worker, learner, published, task, trainer = await start(
        network, tmp_path, f"trainer.micro_batch_tokens={budget}"
    )
    await expect(dispatcher, VersionReady, skip=(Register,))
    learner.gate.clear()
    await worker.send(group(0, 0, tag=0.0))
    await until(learner.entered.is_set)  # the first group is being trained, alone
    for pid in (1, 2, 3):  # a group packs to 7 tokens: 2 prompt + 5 response
        await worker.send(group(0, pid, tag=float(pid)))
    closed = [await expect(dispatcher, Consumed) for _ in range(4)]  # each resolved as it came
    assert [c.closed for c in closed] == [False, False, False, True]  # the close, while one trains
    assert learner.entered.is_set() and not learner.gate.is_set() and learner.micro == []
    learner.gate.set()
    ready = await expect(dispatcher, VersionReady, skip=(Consumed,))
    assert ready.version == 1 and ready.metrics["micro_batches"] == len(micro)
    assert learner.micro == micro
    assert [c for c in learner.calls if c[0] == "step"] == [("step", 20.0)]
    task.cancel()


async def test_a_group_whose_batch_follows_waits_for_it(network: InprocNetwork, tmp_path: Path) -> None:
    """A worker sends a batch's groups one after the other: the first, arriving alone, is held until
    the rest (`following`) are in, so the batch is trained as one micro-batch."""
    cfg, dispatcher, worker, learner, published, task, trainer = await start(network, tmp_path)
    await expect(dispatcher, VersionReady, skip=(Register,))
    await worker.send(msgspec.structs.replace(group(0, 0, tag=0.0), following=1))
    held = until(lambda: len(trainer.batches.micro) == 1 and trainer.arrivals.empty())  # held, not trained
    await asyncio.wait_for(held, 10)
    assert learner.micro == []
    await worker.send(group(0, 1, tag=1.0))
    await until(lambda: len(learner.micro) == 1)
    await worker.send(msgspec.structs.replace(group(0, 2, tag=2.0), following=1))
    await worker.send(group(0, 3, tag=3.0))
    await expect(dispatcher, VersionReady, skip=(Consumed,))
    assert learner.micro == [[0.0, 1.0], [2.0, 3.0]]
    task.cancel()


async def test_a_micro_batch_never_spans_two_optimizer_steps(network: InprocNetwork, tmp_path: Path) -> None:
    cfg, dispatcher, worker, learner, published, task, trainer = await start(
        network, tmp_path, "trainer.steps_per_period=2", "mode=sync"
    )
    await expect(dispatcher, VersionReady, skip=(Register,))
    for pid in (0, 1, 2, 3):
        await worker.send(group(0, pid, tag=float(pid)))
    await expect(dispatcher, VersionReady, skip=(Consumed,))
    assert learner.micro == [[0.0, 1.0], [2.0, 3.0]]
    assert [c[0] for c in learner.calls] == ["train", "train", "step", "train", "train", "step"]
    task.cancel()


async def test_groups_that_carry_their_texts_are_kept_as_samples(
    network: InprocNetwork, tmp_path: Path
) -> None:
    cfg, dispatcher, worker, learner, published, task, trainer = await start(network, tmp_path)
    await expect(dispatcher, VersionReady, skip=(Register,))
    kept = msgspec.structs.replace(
        group(0, 1, tag=1.0),
        prompt="53",
        answer="5",
        responses=["5", "3"],
        reward_parts={"task": [1.0, 0.0]},
    )
    for msg in (group(0, 0), kept, group(0, 2), group(0, 3)):
        await worker.send(msg)
    await expect(dispatcher, VersionReady, skip=(Consumed,))
    lines = (tmp_path / "samples" / "period-0.jsonl").read_text().splitlines()
    assert len(lines) == 1  # only the group with texts
    record = json.loads(lines[0])
    assert (record["prompt_id"], record["prompt"], record["answer"]) == (1, "53", "5")
    assert [r["text"] for r in record["responses"]] == ["5", "3"]
    assert [r["task"] for r in record["responses"]] == [1.0, 0.0]
    assert [r["tokens"] for r in record["responses"]] == [2, 3]
    task.cancel()


async def test_groups_without_their_assignment_or_without_meaning_are_refused(
    network: InprocNetwork, tmp_path: Path
) -> None:
    cfg, dispatcher, worker, learner, published, task, trainer = await start(network, tmp_path)
    trainer.server.refusals = RefusalLog("trainer", per_second=100)  # log every one of them
    await expect(dispatcher, VersionReady, skip=(Register,))
    stranger = network.connect("stranger", "inproc://trainer")
    nan = msgspec.structs.replace(group(0, 1), rewards=[math.nan, 0.0])
    with structlog.testing.capture_logs() as logs:
        await stranger.send(group(0, 0))  # no ticket at all
        await stranger.send(
            msgspec.structs.replace(group(0, 0), ticket=assignment_ticket(worker.key, 0, 0, "w0"))
        )
        await worker.send(nan)
        await worker.send(msgspec.structs.replace(group(0, 1), completions=[[5, 2], [6, 7, VOCAB]]))
        await worker.send(msgspec.structs.replace(group(0, 1), rewards=[0.0]))
        huge = [[5] * 512] * 16  # 16 x 512 tokens, in a run of groups of 2 and 4 new tokens at most
        await worker.send(
            msgspec.structs.replace(
                group(0, 1),
                completions=huge,
                logprobs=[[-1.0] * 512] * 16,
                rewards=[0.0] * 16,
                correct=[0.0] * 16,
            )
        )
        await worker.send(
            msgspec.structs.replace(group(0, 1), completions=[[5] * 9, [2]], logprobs=[[-1.0] * 9, [-1.0]])
        )
        await stranger.send(Consumed(0, [1]))
        for pid in (0, 1, 2, 3):
            await worker.send(group(0, pid))
        ready = await expect(dispatcher, VersionReady, skip=(Consumed,))
    refused = [(e["peer"], e["role"], e["reason"]) for e in logs if e["event"] == "message_refused"]
    assert refused == [
        ("stranger", "stranger", "no assignment of prompt 0 of period 0 to stranger"),
        ("stranger", "stranger", "no assignment of prompt 0 of period 0 to stranger"),  # w0's, not its own
        ("w0", "rollout", "a reward, correctness value or time that is not finite"),
        ("w0", "rollout", f"completion 1: a token id outside the vocabulary of {VOCAB}"),
        ("w0", "rollout", "2 rows but 1 samples, and no episode_of"),
        ("w0", "rollout", "16 samples, the run's groups have 2 (rollout.group_size)"),
        ("w0", "rollout", "a completion of 9 tokens, beyond the run's token limit of 4"),
        ("stranger", "stranger", "a stranger may not send consumed to the trainer"),
    ]
    assert trainer.server.refused == 8
    assert ready.version == 1 and ready.metrics["groups"] == 4  # the sound copies, every one trained
    assert ready.metrics["stale_dropped"] == 0 and ready.metrics["duplicates_dropped"] == 0
    assert [c for c in learner.calls if c[0] == "train"] == [("train", 0.0)] * 4
    task.cancel()


async def test_eval_work_never_reaches_the_gradient(network: InprocNetwork, tmp_path: Path) -> None:
    cfg, dispatcher, worker, learner, published, task, trainer = await start(network, tmp_path)
    trainer.server.refusals = RefusalLog("trainer", per_second=100)
    await expect(dispatcher, VersionReady, skip=(Register,))
    eval_answer = EvalResult(0, -1, [1.0, 1.0], [1.0, 1.0], ["7", "7"], [2, 2])
    with structlog.testing.capture_logs() as logs:
        # an eval assignment carries no ticket: a group of it is no assignment the trainer knows
        await worker.client.send(msgspec.structs.replace(group(0, 0), prompt_id=-1, ticket=""))
        await worker.client.send(eval_answer)  # an eval answer sent to the trainer instead of the dispatcher
        for pid in (0, 1, 2, 3):
            await worker.send(group(0, pid))
        ready = await expect(dispatcher, VersionReady, skip=(Consumed,))
    refused = [e["reason"] for e in logs if e["event"] == "message_refused"]
    assert refused == [
        "no assignment of prompt -1 of period 0 to w0",
        "a stranger may not send eval_result to the trainer",
    ]
    assert ready.metrics["groups"] == 4 and ready.metrics["stale_dropped"] == 0
    assert [c for c in learner.calls if c[0] == "train"] == [("train", 0.0)] * 4
    task.cancel()


async def test_the_engine_learner_gap_reaches_the_row_and_a_high_one_is_warned_about_once(
    network: InprocNetwork, tmp_path: Path
) -> None:
    """One step a period: the groups carry the engine's log-probs beside no old ones; the period's row
    has the step's figures, and a k3 above `trainer.mismatch.warn_kl` logs `mismatch_high`, throttled."""
    cfg, dispatcher, worker, learner, published, task, _ = await start(
        network, tmp_path, "trainer.mismatch.warn_kl=0.01"
    )
    learner.gap = {
        "mismatch_kl": 0.05,
        "mismatch_ratio_mean": 1.01,
        "mismatch_ratio_min": 0.2,
        "mismatch_ratio_max": 6.0,
        "mismatch_beyond_token_share": 0.02,
        "mismatch_beyond_sample_share": 0.5,
        "mismatch_tokens": 20.0,
        "mismatch_samples": 8.0,
    }
    await expect(dispatcher, VersionReady, skip=(Register,))
    with structlog.testing.capture_logs() as logs:
        for period in (0, 1):
            for pid in range(4 * period, 4 * period + 4):
                await worker.send(group(period, pid))
            ready = await expect(dispatcher, VersionReady, skip=(Consumed,))
            assert ready.metrics["mismatch_kl"] == 0.05 and ready.metrics["mismatch_ratio_max"] == 6.0
            assert ready.metrics["mismatch_beyond_sample_share"] == 0.5
    warned = [e for e in logs if e["event"] == "mismatch_high"]
    assert [e["period"] for e in warned] == [0] and warned[0]["warn_kl"] == 0.01
    assert learner.old[0] is None and learner.engine[0] == [[-1.0, -1.0], [-1.0, -1.0, -1.0]]
    await expect(dispatcher, RunDone, skip=(Consumed,))
    await dispatcher.send(b"trainer", Shutdown("run complete"))
    await asyncio.wait_for(task, 5)
