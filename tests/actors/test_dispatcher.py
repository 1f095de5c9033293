"""The dispatcher on in-process channels, driven message by message."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest
import structlog

from cadence.actors.dispatcher import Dispatcher
from cadence.launch.settings import dispatcher_settings, liveness
from cadence.monitor.run_dir import RunRecorder, read_jsonl
from cadence.tasks.heldout import eval_prompts
from cadence.tasks.registry import make_task
from cadence.transport.endpoint import RefusalLog
from cadence.transport.inproc import InprocNetwork
from cadence.wire.messages import (
    Assignment,
    Consumed,
    EvalResult,
    Heartbeat,
    Register,
    RunDone,
    Shutdown,
    StopPeriod,
    TrainerKey,
    VersionReady,
    Welcome,
    WorkRequest,
    encode,
)
from cadence.wire.roles import sign
from tests.conftest import TrainerClient, expect, join, keep_beating, tiny_config

pytestmark = pytest.mark.timeout(30)


async def start(
    network: InprocNetwork, tmp_path: Path, *overrides: str
) -> tuple[Dispatcher, asyncio.Task[None]]:
    cfg = tiny_config("transport.liveness=200", "rollout.inflight=16", *overrides)
    server = network.bind("dispatcher", "inproc://dispatcher")
    recorder = RunRecorder(tmp_path, cfg.mode)
    task = make_task(cfg.task, cfg.seed)
    dispatcher = Dispatcher(
        dispatcher_settings(cfg),
        server,
        task,
        recorder,
        liveness(cfg, time.time),
        time.time,
        eval_set=eval_prompts(cfg.task, cfg.eval, task) if cfg.eval.every else [],
    )
    return dispatcher, asyncio.create_task(dispatcher.run())


async def test_assigns_only_after_version_published_and_within_credits(
    network: InprocNetwork, tmp_path: Path
) -> None:
    dispatcher, task = await start(network, tmp_path)
    trainer = await join(network, "trainer", "trainer", "inproc://trainer")
    await join(network, "publisher", "publisher", "inproc://publisher")
    worker = await join(network, "w0", "rollout")
    welcome = await expect(worker, Welcome)
    assert (welcome.trainer_address, welcome.publisher_address) == ("inproc://trainer", "inproc://publisher")
    await worker.send(WorkRequest(3))
    with pytest.raises(TimeoutError):
        await expect(worker, Assignment, timeout=0.3)  # nothing before version 0 is published
    await trainer.send(VersionReady(0, "digest", 10, {}))
    got = [await expect(worker, Assignment) for _ in range(3)]
    assert [a.prompt_id for a in got] == [0, 1, 2]
    assert all(a.period == 0 and a.version == 0 and a.group_size == 4 for a in got)
    with pytest.raises(TimeoutError):
        await expect(worker, Assignment, timeout=0.3)  # no fourth one without a fourth credit
    await worker.send(WorkRequest(1))
    assert (await expect(worker, Assignment)).prompt_id == 3
    task.cancel()


async def test_dead_worker_prompts_go_to_another(network: InprocNetwork, tmp_path: Path) -> None:
    dispatcher, task = await start(network, tmp_path, "transport.liveness=20")
    trainer = await join(network, "trainer", "trainer", "inproc://trainer")
    publisher = await join(network, "publisher", "publisher", "inproc://publisher")
    alive = [trainer, publisher]

    beating = keep_beating(alive)
    doomed = await join(network, "doomed", "rollout")
    await expect(doomed, Welcome)
    await doomed.send(WorkRequest(4))
    with structlog.testing.capture_logs() as logs:
        await trainer.send(VersionReady(0, "digest", 10, {}))
        taken = [await expect(doomed, Assignment) for _ in range(4)]
        await trainer.send(Consumed(0, [taken[0].prompt_id]))
        survivor = await join(network, "survivor", "rollout")
        alive.append(survivor)
        await expect(survivor, Welcome)
        await survivor.send(WorkRequest(8))
        again = [await expect(survivor, Assignment, timeout=5) for _ in range(3)]
    beating.cancel()
    assert sorted(a.prompt_id for a in again) == sorted(a.prompt_id for a in taken[1:])
    lost = [e for e in logs if e["event"] == "worker_lost"]
    assert lost and lost[0]["peer"] == "doomed" and lost[0]["requeued"] == 3
    assert dispatcher.reassigned == 3
    task.cancel()


async def test_an_over_sampled_period_draws_for_filtered_groups_and_stops_the_rest_once_closed(
    network: InprocNetwork, tmp_path: Path
) -> None:
    sampled = ("sampling.oversample=0.5", "sampling.filters=['zero_variance']", "sampling.ceiling=2")
    dispatcher, task = await start(network, tmp_path, *sampled)
    trainer = await join(network, "trainer", "trainer", "inproc://trainer")
    await join(network, "publisher", "publisher", "inproc://publisher")
    worker = await join(network, "w0", "rollout")
    await expect(worker, Welcome)
    await worker.send(WorkRequest(8))
    await trainer.send(VersionReady(0, "digest", 10, {}))
    first = [await expect(worker, Assignment) for _ in range(6)]  # B = 4 and half of it more
    assert [a.prompt_id for a in first] == [0, 1, 2, 3, 4, 5]
    with pytest.raises(TimeoutError):
        await expect(worker, Assignment, timeout=0.3)  # nothing more while 4 may still be kept
    for pid in (0, 1):
        await trainer.send(Consumed(0, [pid], filtered=[pid]))
    with pytest.raises(TimeoutError):
        await expect(worker, Assignment, timeout=0.3)  # 4 not filtered left: enough
    await trainer.send(Consumed(0, [2], filtered=[2]))
    assert (await expect(worker, Assignment)).prompt_id == 6  # the stream's next, in its place
    await worker.send(Consumed(0, [3, 4, 5, 6], closed=True))  # a worker's word on the period: refused
    await trainer.send(Consumed(0, [3, 4]))
    await trainer.send(Consumed(0, [6], closed=True))  # prompt 5 still at the worker
    stop = await expect(worker, StopPeriod)
    assert stop.period == 0 and dispatcher.core.ledger.queued == 0
    row = {"period": 0, "groups": 3, "samples": 12, "groups_filtered": 3, "groups_arrived": 6}
    await trainer.send(VersionReady(1, "digest", 10, row))
    recorded = await asyncio.wait_for(_first_row(tmp_path), 5)
    assert (recorded["prompts_issued"], recorded["groups_stopped"]) == (7, 1)
    task.cancel()


async def _first_row(run_dir: Path) -> dict[str, Any]:
    while not (rows := read_jsonl(run_dir / "metrics.jsonl")):
        await asyncio.sleep(0.02)
    return rows[0]


ROW = {
    "period": 0,
    "groups": 4,
    "samples": 16,
    "tokens_generated": 40,
    "reward_mean": 0.5,
    "accuracy": 0.25,
    "stale_dropped": 0,
    "duplicates_dropped": 0,
    "period_s": 1.0,
    "overlap_s": 0.5,
}


async def test_period_metrics_summary_and_shutdown(network: InprocNetwork, tmp_path: Path) -> None:
    dispatcher, task = await start(network, tmp_path, "periods=1")
    trainer = await join(network, "trainer", "trainer", "inproc://trainer")
    publisher = await join(network, "publisher", "publisher", "inproc://publisher")
    await trainer.send(VersionReady(0, "digest", 10, {}))
    await trainer.send(VersionReady(1, "digest", 10, ROW))
    await trainer.send(RunDone(1, "sha1", "/x"))
    assert (await expect(trainer, Shutdown)).reason == "run complete"
    assert (await expect(publisher, TrainerKey)).key == "key-of-trainer"  # uploads need its tickets
    assert (await expect(publisher, Shutdown)).reason == "run complete"
    await asyncio.wait_for(task, 5)
    lines = read_jsonl(tmp_path / "metrics.jsonl")
    assert len(lines) == 1 and lines[0]["workers"] == 0 and lines[0]["reward_mean"] == 0.5
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (
        summary["groups_trained"] == 4
        and summary["weights_sha256"] == "sha1"
        and summary["final_version"] == 1
    )


async def test_malformed_frames_are_refused_and_the_dispatcher_goes_on(
    network: InprocNetwork, tmp_path: Path
) -> None:
    dispatcher, task = await start(network, tmp_path)
    await join(network, "trainer", "trainer", "inproc://trainer")
    await join(network, "publisher", "publisher", "inproc://publisher")
    rogue = network.connect("rogue", "inproc://dispatcher")
    with structlog.testing.capture_logs() as logs:
        await rogue.send_frames([b"\xc1 not msgpack"])
        await rogue.send_frames([encode(Register("rollout"), "rogue", run="another-run")])
        await rogue.send_frames([b"a", b"b"])
        await rogue.send(Register("rollout"))
        await expect(rogue, Welcome)
    refused = [e for e in logs if e["event"] == "message_refused"]
    assert len(refused) == 3 and all(e["peer"] == "rogue" for e in refused)
    assert dispatcher.server.refused == 3
    assert not task.done()
    task.cancel()


async def test_no_worker_left_the_run_waits_says_so_and_a_woken_lost_worker_is_sent_away(
    network: InprocNetwork, tmp_path: Path
) -> None:
    dispatcher, task = await start(network, tmp_path, "transport.liveness=20")
    trainer = await join(network, "trainer", "trainer", "inproc://trainer")
    publisher = await join(network, "publisher", "publisher", "inproc://publisher")
    alive = [trainer, publisher]

    beating = keep_beating(alive)
    with structlog.testing.capture_logs() as logs:
        sleeper = await join(network, "sleeper", "rollout")
        await expect(sleeper, Welcome)
        await sleeper.send(WorkRequest(1))
        await trainer.send(VersionReady(0, "digest", 10, {}))
        first = await expect(sleeper, Assignment)
        # the sleeper goes silent (a stopped process): declared lost, and nobody is left to work
        while not any(e["event"] == "waiting_for_workers" for e in logs):
            await asyncio.sleep(0.05)
        waiting = next(e for e in logs if e["event"] == "waiting_for_workers")
        assert waiting["pending"] == 4 and waiting["period"] == 0  # its prompt went back to the queue
        await sleeper.send(Heartbeat("rollout"))  # it wakes up
        bye = await expect(sleeper, Shutdown)
        assert "declared lost" in bye.reason
        late = await join(network, "late", "rollout")
        alive.append(late)
        await expect(late, Welcome)
        await late.send(WorkRequest(8))
        again = [await expect(late, Assignment) for _ in range(4)]
        while not any(e["event"] == "workers_back" for e in logs):
            await asyncio.sleep(0.05)
    beating.cancel()
    assert first.prompt_id in {a.prompt_id for a in again}
    assert [e["peer"] for e in logs if e["event"] == "worker_lost"] == ["sleeper"]
    task.cancel()


async def test_only_the_registered_trainer_announces_versions_and_ends_the_run(
    network: InprocNetwork, tmp_path: Path
) -> None:
    dispatcher, task = await start(network, tmp_path, "periods=2")
    dispatcher.server.refusals = RefusalLog("dispatcher", per_second=100)  # log every one of them
    trainer = await join(network, "trainer", "trainer", "inproc://trainer")
    await join(network, "publisher", "publisher", "inproc://publisher")
    forger = await join(network, "forger", "rollout")
    await expect(forger, Welcome)
    row = {"period": 0, "groups": 4, "reward_mean": 0.5}
    with structlog.testing.capture_logs() as logs:
        await trainer.send(VersionReady(0, "sha0", 10, {}))
        await trainer.send(VersionReady(1, "sha1", 10, row))
        for forged in (RunDone(2, "forged", "/x"), VersionReady(0, "s", 1, {}), Consumed(1, [0, 1])):
            await forger.send(forged)  # a worker may send none of these
        second = await join(network, "second", "trainer", "inproc://elsewhere")  # the run has its trainer
        await trainer.send(VersionReady(3, "s", 1, {}))  # the trainer itself, out of the run's range
        await trainer.send(RunDone(2, "early", "/x"))  # before version 2 was announced
        await trainer.send(VersionReady(2, "sha2", 10, {**row, "period": 1, "fn": msgpack.ExtType(1, b"x")}))
        await forger.send(WorkRequest(1))  # the dispatcher still answers: it went on
        assert (await expect(forger, Assignment)).period == 1
    refused = [(e["peer"], e["role"], e["type"]) for e in logs if e["event"] == "message_refused"]
    assert refused == [
        ("forger", "rollout", "run_done"),
        ("forger", "rollout", "version_ready"),
        ("forger", "rollout", "consumed"),
        ("second", "stranger", "register"),
        ("trainer", "trainer", "version_ready"),
        ("trainer", "trainer", "run_done"),
        ("trainer", "trainer", "version_ready"),
    ]
    assert dispatcher.server.refused == 7 and dispatcher.core.period == 1 and not dispatcher.done.is_set()
    assert [line["period"] for line in read_jsonl(tmp_path / "metrics.jsonl")] == [0]  # nothing rewound
    assert "the run has its trainer already (trainer)" in (await expect(second, Shutdown)).reason
    task.cancel()


async def test_while_the_trainer_lives_no_other_may_claim_its_role_even_when_a_lost_one_is_waited_for(
    network: InprocNetwork, tmp_path: Path
) -> None:
    dispatcher, task = await start(network, tmp_path, "trainer.on_loss='wait'", "trainer.checkpoint_every=2")
    trainer = await join(network, "trainer", "trainer", "inproc://trainer")
    await join(network, "publisher", "publisher", "inproc://publisher")
    await trainer.send(VersionReady(0, "sha0", 10, {}))
    with structlog.testing.capture_logs() as logs:
        for name, role in (("trainer-2", "trainer"), ("publisher-2", "publisher"), ("x", "monitor")):
            claimant = await join(network, name, role, "inproc://elsewhere")
            assert "registration refused" in (await expect(claimant, Shutdown)).reason
        trainer.close()  # its process ended: no connection has its route any more
        again = await join(network, "trainer", "trainer", "inproc://trainer")  # restarted, its own name
        assert again is not None
        while not any(e["event"] == "trainer_lost_waiting" for e in logs):
            await asyncio.sleep(0.01)
    refused = [(e["peer"], e["reason"]) for e in logs if e["event"] == "message_refused"]
    assert refused == [
        ("trainer-2", "the run has its trainer already (trainer)"),
        ("publisher-2", "the run has its publisher already (publisher)"),
        ("x", "role 'monitor' is none of ['trainer', 'publisher', 'rollout']"),
    ]
    assert [p.name for p in dispatcher.peers.values() if p.role == "trainer"] == ["trainer"]
    task.cancel()


async def test_a_message_that_fails_its_handler_is_contained(network: InprocNetwork, tmp_path: Path) -> None:
    dispatcher, task = await start(network, tmp_path)
    trainer = await join(network, "trainer", "trainer", "inproc://trainer")
    await join(network, "publisher", "publisher", "inproc://publisher")
    worker = await join(network, "w0", "rollout")
    await expect(worker, Welcome)
    with structlog.testing.capture_logs() as logs:
        await trainer.send(VersionReady(0, "sha0", 10, {}))
        await trainer.send(VersionReady(1, "sha1", 10, {"period": 0, "group_arrival_s": 5}))  # not a list
        await worker.send(WorkRequest(1))
        assert (await expect(worker, Assignment)).period == 0  # period 1 never started
    failed = [e for e in logs if e["event"] == "message_failed"]
    assert len(failed) == 1 and failed[0]["type"] == "version_ready" and "TypeError" in failed[0]["error"]
    assert not task.done() and dispatcher.core.period == 0
    task.cancel()


async def test_with_no_worker_left_past_wait_for_workers_s_the_run_fails_naming_them(
    network: InprocNetwork, tmp_path: Path
) -> None:
    dispatcher, task = await start(
        network, tmp_path, "transport.liveness=20", "rollout.wait_for_workers_s=0.5"
    )
    trainer = await join(network, "trainer", "trainer", "inproc://trainer")
    publisher = await join(network, "publisher", "publisher", "inproc://publisher")
    beating = keep_beating([trainer, publisher])
    with structlog.testing.capture_logs() as logs:
        gone = await join(network, "gone", "rollout")
        await expect(gone, Welcome)
        await gone.send(WorkRequest(1))
        await trainer.send(VersionReady(0, "sha", 10, {}))
        await expect(gone, Assignment)
        # it goes silent: lost after its liveness, then the run fails half a second later
        with pytest.raises(RuntimeError, match="no rollout worker left") as failed:
            await asyncio.wait_for(task, 20)
        bye = await expect(trainer, Shutdown)
    beating.cancel()
    message = str(failed.value)
    assert "rollout.wait_for_workers_s = 0.5" in message and "lost workers: gone" in message
    assert "4 prompts of period 0 pending" in message and bye.reason == message
    (event,) = [e for e in logs if e["event"] == "no_workers_left"]
    assert event["lost"] == ["gone"] and event["waited_s"] >= 0.5
    assert dispatcher.failure == message


async def test_a_dead_trainer_process_is_named_trainer_not_its_publisher(
    network: InprocNetwork, tmp_path: Path
) -> None:
    dispatcher, task = await start(network, tmp_path, "transport.liveness=20")
    await join(network, "trainer", "trainer", "inproc://trainer")
    await join(network, "publisher", "publisher", "inproc://publisher")  # in the trainer's process
    worker = await join(network, "w0", "rollout")
    beating = keep_beating([worker])
    with pytest.raises(RuntimeError) as failed:  # both go silent at once, as when the process dies
        await asyncio.wait_for(task, 20)
    beating.cancel()
    assert str(failed.value).startswith("trainer lost (silent for ")


def answer(a: Assignment, correct: float) -> EvalResult:
    """A worker's answer to eval assignment `a`: its samples all `correct` or not."""
    n = a.group_size
    return EvalResult(a.version, a.prompt_id, [correct] * n, [correct] * n, ["7"] * n, [2] * n, 0.01)


async def test_eval_prompts_go_out_only_once_the_periods_prompts_are_all_assigned(
    network: InprocNetwork, tmp_path: Path
) -> None:
    dispatcher, task = await start(network, tmp_path, "periods=2", "eval.every=2", "eval.prompts=5")
    trainer = await join(network, "trainer", "trainer", "inproc://trainer")
    publisher = await join(network, "publisher", "publisher", "inproc://publisher")
    worker = await join(network, "w0", "rollout")
    other = await join(network, "w1", "rollout")
    beating = keep_beating([trainer, publisher, worker, other])
    await expect(worker, Welcome)
    await expect(other, Welcome)
    await trainer.send(VersionReady(0, "digest", 10, {}))
    await worker.send(WorkRequest(3))
    training = [await expect(worker, Assignment) for _ in range(3)]
    assert not any(a.eval for a in training) and [a.batch for a in training] == [3, 3, 3]
    await other.send(WorkRequest(2))  # the period's last prompt, then eval prompts with the credit left
    last = await expect(other, Assignment)
    assert (last.prompt_id, last.eval, last.batch) == (3, False, 1)
    # a credit stands for a group of G = 4 samples: 4 greedy eval prompts of one sample, one batch
    evals = [await expect(other, Assignment) for _ in range(4)]
    assert [(a.prompt_id, a.version, a.period, a.eval, a.batch) for a in evals] == [
        (-i, 0, 0, True, 4) for i in range(1, 5)
    ]
    assert all(a.ticket == "" and a.group_size == 1 for a in evals)  # no ticket: no trainer takes one
    with structlog.testing.capture_logs() as logs:
        await worker.send(answer(evals[0], 1.0))  # not given to this worker: refused, nothing changes
        await worker.send(WorkRequest(1))
        fifth = await expect(worker, Assignment)
    assert (fifth.prompt_id, fifth.eval, fifth.batch) == (-5, True, 1)
    assert any(e["event"] == "message_refused" and e.get("type") == "eval_result" for e in logs)
    for a, correct in zip(evals, (1.0, 0.0, 0.0, 0.0), strict=True):
        await other.send(answer(a, correct))
    await worker.send(answer(fifth, 0.0))
    rows = await _rows(tmp_path / "eval.jsonl", 1)
    assert rows[0]["period"] == 0 and rows[0]["eval_prompts"] == 5
    assert abs(rows[0]["eval_accuracy"] - 1 / 5) < 1e-9 and abs(rows[0]["eval_pass_at_k"] - 1 / 5) < 1e-9
    samples = read_jsonl(tmp_path / "samples" / "eval-period-0.jsonl")
    assert [s["prompt_id"] for s in samples] == [-1, -2, -3, -4, -5]
    await other.send(WorkRequest(4))  # the worker gives back what its eval batch took
    await _until(
        lambda: [dispatcher.core.credits.get(k) for k, p in dispatcher.peers.items() if p.name == "w1"] == [1]
    )
    # version 1 is not due; the final version 2 is, and the run ends only once it is answered
    await trainer.send(VersionReady(1, "digest", 10, {"period": 0}))
    await trainer.send(VersionReady(2, "digest", 10, {"period": 1}))
    await trainer.send(RunDone(2, "sha", "/x"))
    await worker.send(WorkRequest(2))
    final = [await expect(worker, Assignment, skip=(Welcome,)) for _ in range(5)]
    assert [(a.version, a.eval) for a in final] == [(2, True)] * 5
    assert not task.done()
    for a in final:
        await worker.send(answer(a, 1.0))
    assert (await expect(trainer, Shutdown)).reason == "run complete"
    await asyncio.wait_for(task, 5)
    beating.cancel()
    rows = read_jsonl(tmp_path / "eval.jsonl")
    assert [r["period"] for r in rows] == [0, 2] and rows[1]["eval_accuracy"] == 1.0
    for row in rows:  # single-turn answers: no episode figure in the rows
        assert not any(k.startswith(("eval_turn", "eval_tool", "eval_env", "eval_ended")) for k in row), row
    assert dispatcher.core.rounds.open == []


async def test_the_rest_of_an_eval_round_goes_out_before_the_next_periods_prompts(
    network: InprocNetwork, tmp_path: Path
) -> None:
    dispatcher, task = await start(network, tmp_path, "periods=2", "eval.every=1", "eval.prompts=6")
    trainer = await join(network, "trainer", "trainer", "inproc://trainer")
    publisher = await join(network, "publisher", "publisher", "inproc://publisher")
    worker = await join(network, "w0", "rollout")
    beating = keep_beating([trainer, publisher, worker])
    await expect(worker, Welcome)
    await trainer.send(VersionReady(0, "digest", 10, {}))
    await worker.send(WorkRequest(5))  # the period's 4 prompts, then 4 eval prompts for the last credit
    got = [await expect(worker, Assignment) for _ in range(8)]
    assert [(a.eval, a.version) for a in got] == [(False, 0)] * 4 + [(True, 0)] * 4
    with structlog.testing.capture_logs() as logs:
        await trainer.send(VersionReady(1, "digest", 10, {"period": 0}))  # the tail ended, 2 left
        await worker.send(WorkRequest(6))  # 4 given back for the eval batch (credits -3 to 3)
        rest = [await expect(worker, Assignment) for _ in range(3)]
    assert any(e["event"] == "eval_rest_first" and e["prompts"] == 2 for e in logs)
    assert [(a.eval, a.version, a.prompt_id, a.batch) for a in rest[:2]] == [
        (True, 0, -5, 2),
        (True, 0, -6, 2),
    ]
    assert [(a.eval, a.period) for a in rest[2:]] == [(False, 1)]  # then period 1, for the credit left
    for a in got[4:] + rest[:2]:
        await worker.send(answer(a, 1.0))
    rows = await _rows(tmp_path / "eval.jsonl", 1)
    assert rows[0]["version"] == 0 and rows[0]["eval_prompts"] == 6 and rows[0]["eval_accuracy"] == 1.0
    beating.cancel()
    task.cancel()


async def _until(check: Callable[[], bool]) -> None:
    for _ in range(200):
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the condition did not come true")


async def _rows(path: Path, count: int) -> list[dict[str, Any]]:
    for _ in range(200):
        rows = read_jsonl(path)
        if len(rows) >= count:
            return rows
        await asyncio.sleep(0.02)
    raise AssertionError(f"{path} has fewer than {count} rows")


async def test_a_peer_that_borrows_a_registered_name_takes_nothing_over(
    network: InprocNetwork, tmp_path: Path
) -> None:
    """The attacks of a quick-start run without keys, replayed message by message: a socket presenting
    the trainer's name announces the last version and ends the run, one presenting a worker's name
    registers and asks for work, one presenting the trainer's very route (a route it could only have
    read off the network) announces without the trainer's MAC. Each is refused and logged; the real
    peers' routes and places are unharmed."""
    dispatcher, task = await start(network, tmp_path, "periods=60")
    dispatcher.server.refusals = RefusalLog("dispatcher", per_second=100)  # log every one of them
    trainer = await join(network, "trainer", "trainer", "inproc://trainer")
    publisher = await join(network, "publisher", "publisher", "inproc://publisher")
    worker = await join(network, "rollout-0", "rollout")
    await expect(worker, Welcome)
    await trainer.send(VersionReady(0, "sha0", 10, {}))
    with structlog.testing.capture_logs() as logs:
        fake_trainer = network.connect("trainer", "inproc://dispatcher", route=b"trainer")
        await fake_trainer.send(VersionReady(60, "f0" * 16, 1, {}))
        await fake_trainer.send(RunDone(60, "f0" * 32, "/x"))
        await fake_trainer.send(Register("trainer", "inproc://evil", key="k"))
        fake_publisher = network.connect("publisher", "inproc://dispatcher", route=b"publisher")
        await fake_publisher.send(Register("publisher", "inproc://evil"))
        fake_worker = network.connect("rollout-0", "inproc://dispatcher", route=b"rollout-0")
        await fake_worker.send(WorkRequest(1))
        await fake_worker.send(Register("rollout", proof="a guess"))
        # the trainer's own route, presented by another: without the key, its word is refused
        assert isinstance(trainer, TrainerClient)
        forged_route = network.connect("trainer", "inproc://dispatcher", route=trainer.route)
        await forged_route.send(VersionReady(1, "sha1", 10, {}))
        await forged_route.send(sign("not-the-key", VersionReady(1, "sha1", 10, {})))
        network.clients[("inproc://dispatcher", trainer.route)] = trainer  # the trainer's again
        for claimant in (fake_trainer, fake_publisher, fake_worker):
            assert "registration refused" in (await expect(claimant, Shutdown)).reason
        # the real ones go on: a worker's request is answered, the trainer's next version opens period 1
        await worker.send(WorkRequest(4))
        assert {(await expect(worker, Assignment)).period for _ in range(4)} == {0}
        await trainer.send(VersionReady(1, "sha1", 10, {"period": 0, "groups": 4, "reward_mean": 0.5}))
        await worker.send(WorkRequest(1))
        assert (await expect(worker, Assignment)).period == 1
        await trainer.send(VersionReady(3, "sha3", 10, {}))  # the trainer itself may not jump ahead
        while dispatcher.server.refused < 6:  # polled, ended by the test's timeout
            await asyncio.sleep(0.01)
    assert dispatcher.core.period == 1 and dispatcher.run_done is None and not dispatcher.done.is_set()
    strangers = [(e["peer"], e["type"]) for e in logs if e["event"] == "message_from_unregistered_peer"]
    assert strangers == [("trainer", "version_ready"), ("trainer", "run_done"), ("rollout-0", "work_request")]
    refused = [
        (e["peer"], e["role"], e["type"], e["reason"]) for e in logs if e["event"] == "message_refused"
    ]
    assert [r[:3] for r in refused] == [
        ("trainer", "stranger", "register"),
        ("publisher", "stranger", "register"),
        ("rollout-0", "stranger", "register"),
        ("trainer", "trainer", "version_ready"),
        ("trainer", "trainer", "version_ready"),
        ("trainer", "trainer", "version_ready"),
    ]
    assert "trainer is registered by a live trainer session" in refused[0][3]
    assert "rollout-0 is registered by a live rollout session" in refused[2][3]
    assert {r[3] for r in refused[3:5]} == {"no MAC of the registered trainer's key on version_ready"}
    assert "a trainer announces the next version" in refused[5][3]
    names = {k: p.name for k, p in dispatcher.peers.items()}
    assert names == {trainer.route: "trainer", publisher.route: "publisher", worker.route: "rollout-0"}
    task.cancel()


async def test_a_restarted_worker_takes_its_name_back_once_its_old_connection_is_gone(
    network: InprocNetwork, tmp_path: Path
) -> None:
    dispatcher, task = await start(network, tmp_path)
    await join(network, "trainer", "trainer", "inproc://trainer")
    await join(network, "publisher", "publisher", "inproc://publisher")
    old = await join(network, "rollout-0", "rollout")
    await expect(old, Welcome)
    with structlog.testing.capture_logs() as logs:
        second = await join(network, "rollout-0", "rollout")  # a second process under the same name
        assert "registered by a live rollout session" in (await expect(second, Shutdown)).reason
        old.close()  # the old process ends
        new = await join(network, "rollout-0", "rollout")
        await expect(new, Welcome)
    lost = [(e["peer"], e["reason"]) for e in logs if e["event"] == "worker_lost"]
    assert lost == [("rollout-0", "re-registered")]
    assert [p.name for p in dispatcher.peers.values() if p.role == "rollout"] == ["rollout-0"]
    assert new.route in dispatcher.peers
    task.cancel()


async def test_a_period_reported_after_a_stop_is_dropped_not_written_to_the_closed_metrics(
    network: InprocNetwork, tmp_path: Path
) -> None:
    """`cadence slurm stop`: the summary is written and the metrics file closed while the trainer's
    next report may still be on its way; it is logged and dropped, and the summary stands."""
    dispatcher, task = await start(network, tmp_path, "periods=5")
    trainer = await join(network, "trainer", "trainer", "inproc://trainer")
    await trainer.send(VersionReady(0, "digest", 10, {}))
    await _until(lambda: dispatcher.core.published == 0)
    route = next(k for k, p in dispatcher.peers.items() if p.role == "trainer")
    dispatcher.stop()
    late = sign("key-of-trainer", VersionReady(1, "digest", 10, {**ROW, "period": 0}))
    dispatcher.handle(route, "trainer", late)  # the closed file: ValueError before
    await asyncio.wait_for(task, 5)
    assert read_jsonl(tmp_path / "metrics.jsonl") == []
    assert json.loads((tmp_path / "summary.json").read_text())["periods"] == 0


async def test_registrations_beyond_the_rate_are_deferred_and_taken_when_sent_again(
    network: InprocNetwork, tmp_path: Path
) -> None:
    """A flood of new names: the dispatcher takes a burst of them, defers the rest unanswered (counted,
    logged within a throttle), and takes a deferred one once its session sends it again with time
    passed; its session's own Register sent twice changes nothing."""
    from cadence.dispatch.roster import Registrations

    now = [0.0]
    dispatcher, task = await start(network, tmp_path)
    dispatcher.registrations = Registrations(per_s=1.0, burst=4, clock=lambda: now[0])
    await join(network, "trainer", "trainer", "inproc://trainer")
    await join(network, "publisher", "publisher", "inproc://publisher")
    flood = [await join(network, f"name-{i}", "rollout") for i in range(40)]
    welcomed = [await expect(c, Welcome) for c in flood[:2]]  # 4 taken: the trainer, publisher, 2 names
    with pytest.raises(TimeoutError):
        await expect(flood[2], Welcome, timeout=0.3)
    assert len(welcomed) == 2 and dispatcher.registrations.deferred == 38
    assert len(dispatcher.peers) == 4
    late = flood[-1]
    now[0] = 1.0  # one more a second: the last name's session sends its Register again
    await late.send(Register("rollout", proof="its-proof"))
    await expect(late, Welcome)
    with structlog.testing.capture_logs() as logs:
        await late.send(Register("rollout", proof="its-proof"))  # sent before it heard the dispatcher
        await late.send(Heartbeat("rollout"))
        await asyncio.sleep(0.1)
    assert not [e for e in logs if e["event"] == "worker_lost"]
    assert len(dispatcher.peers) == 5 and dispatcher.registrations.deferred == 38
    task.cancel()
