"""A registered worker that hoards, against the dispatcher on in-process channels: asking for credits
again after each assignment gets it no more than `rollout.inflight` prompts, and what it sits on goes
to an idle worker once held a few typical groups, so the period gets its groups."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest
import structlog

from cadence.monitor.run_dir import read_jsonl
from cadence.transport.inproc import InprocClient, InprocNetwork
from cadence.wire.messages import (
    Assignment,
    Consumed,
    Envelope,
    RunDone,
    Shutdown,
    VersionReady,
    Welcome,
    WorkRequest,
)
from tests.actors.test_dispatcher import ROW, answer, start
from tests.conftest import expect, join, keep_beating

pytestmark = pytest.mark.timeout(60)


async def hoard(client: InprocClient, taken: Counter[int]) -> None:
    """Ask for every credit there is on the Welcome and again after each assignment; answer nothing."""
    while True:
        got = await client.recv()
        msg = (got if isinstance(got, Envelope) else got[1]).message
        if isinstance(msg, Assignment) and not msg.eval:
            taken[msg.period] += 1
        if isinstance(msg, Welcome | Assignment):
            await client.send(WorkRequest(65_536))


async def test_a_hoarder_holds_no_more_than_its_inflight_and_an_idle_worker_takes_over_its_prompts(
    network: InprocNetwork, tmp_path: Path
) -> None:
    # a liveness timeout of 1.5 s: the least an assignment is held before another worker takes it over
    dispatcher, task = await start(network, tmp_path, "rollout.inflight=2", "transport.liveness=30")
    trainer = await join(network, "trainer", "trainer", "inproc://trainer")
    alive = [trainer, await join(network, "publisher", "publisher", "inproc://publisher")]
    beating = keep_beating(alive)
    taken: Counter[int] = Counter()
    hoarder = await join(network, "hoarder", "rollout")
    alive.append(hoarder)
    hoarding = asyncio.create_task(hoard(hoarder, taken))
    with structlog.testing.capture_logs() as logs:
        await trainer.send(VersionReady(0, "digest", 10, {}))
        while not any(e["event"] == "credits_capped" and e["assigned"] == 2 for e in logs):
            await asyncio.sleep(0.02)  # it asked again while holding its two: capped
        honest = await join(network, "honest", "rollout")
        alive.append(honest)
        await expect(honest, Welcome)
        await honest.send(WorkRequest(2))
        mine = [(await expect(honest, Assignment)).prompt_id for _ in range(2)]
        hoarded = sorted({0, 1, 2, 3} - set(mine))
        assert len(hoarded) == 2 and taken[0] == 2  # the rest of period 0 waited for the honest worker
        for pid in mine:  # its groups reach the trainer: the run's typical group time
            await trainer.send(Consumed(0, [pid]))
        await honest.send(WorkRequest(2))  # idle now, while the hoarder sits on the other two
        over = [await expect(honest, Assignment, timeout=20) for _ in range(2)]
        assert sorted(a.prompt_id for a in over) == hoarded and all(a.period == 0 for a in over)
        await trainer.send(Consumed(0, [hoarded[0]]))
        await trainer.send(Consumed(0, [hoarded[1]], closed=True))
        await trainer.send(VersionReady(1, "digest", 10, ROW))
        while dispatcher.core.period != 1 or not taken[1]:
            await asyncio.sleep(0.02)  # period 1 starts; the hoarder asks and is given two again
    hoarding.cancel()
    beating.cancel()
    moved = [e for e in logs if e["event"] == "assignment_taken_over"]
    assert [(e["peer"], e["to"], sorted(e["prompt_ids"])) for e in moved] == [("hoarder", "honest", hoarded)]
    assert dispatcher.reassigned == 2
    assert taken[0] == 2 and dispatcher.core.held(hoarder.route) <= 2
    task.cancel()


async def work(client: InprocClient, trainer: InprocClient, consumed: set[int]) -> None:
    """An honest worker: each training prompt's group reaches the trainer (its Consumed), each eval
    prompt is answered, and each credit is asked for again once its assignment is done."""
    while True:
        got = await client.recv()
        msg = (got if isinstance(got, Envelope) else got[1]).message
        if isinstance(msg, Assignment) and msg.eval:
            await client.send(answer(msg, 1.0))
        elif isinstance(msg, Assignment):
            await asyncio.sleep(0.05)  # its group's time
            await trainer.send(Consumed(msg.period, [msg.prompt_id]))
            consumed.add(msg.prompt_id)
        if isinstance(msg, Welcome):
            await client.send(WorkRequest(2))
        elif isinstance(msg, Assignment):
            await client.send(WorkRequest(1))


async def test_the_final_eval_round_a_hoarder_sits_on_is_taken_over_and_the_run_ends(
    network: InprocNetwork, tmp_path: Path
) -> None:
    """The end of the run waits for the final eval round: a hoarder that takes its prompts and never
    answers delays it by a few typical groups, not for ever."""
    settings = ("periods=1", "eval.every=1", "eval.prompts=4", "rollout.inflight=2", "transport.liveness=30")
    dispatcher, task = await start(network, tmp_path, *settings)
    trainer = await join(network, "trainer", "trainer", "inproc://trainer")
    alive = [trainer, await join(network, "publisher", "publisher", "inproc://publisher")]
    beating = keep_beating(alive)
    taken: Counter[int] = Counter()
    consumed: set[int] = set()
    hoarder = await join(network, "hoarder", "rollout")
    honest = await join(network, "honest", "rollout")
    alive += [hoarder, honest]
    working = [
        asyncio.create_task(hoard(hoarder, taken)),
        asyncio.create_task(work(honest, trainer, consumed)),
    ]
    with structlog.testing.capture_logs() as logs:
        await trainer.send(VersionReady(0, "digest", 10, {}))
        while consumed != {0, 1, 2, 3}:  # the hoarder's two of period 0 taken over by the honest worker
            await asyncio.sleep(0.02)
        await trainer.send(VersionReady(1, "digest", 10, ROW))
        await trainer.send(RunDone(1, "sha", "/x"))
        assert (await expect(trainer, Shutdown, timeout=30)).reason == "run complete"
    for t in (*working, beating):
        t.cancel()
    rows = read_jsonl(tmp_path / "eval.jsonl")
    assert [r["version"] for r in rows] == [0, 1] and all(r["eval_accuracy"] == 1.0 for r in rows)
    moved = [e for e in logs if e["event"] == "assignment_taken_over"]
    assert moved and all((e["peer"], e["to"]) == ("hoarder", "honest") for e in moved)
    assert any(e["eval"] for e in moved) and any(not e["eval"] for e in moved)
    await asyncio.wait_for(task, 5)
