"""A worker that hoards, without sockets: the cap counts what a worker holds, not what it asks for,
and an idle worker takes over what one sits on past a few typical groups."""

from __future__ import annotations

from cadence.dispatch.core import DispatchCore, Worker
from cadence.dispatch.hold import EARLY, Hold
from cadence.dispatch.ledger import State
from cadence.dispatch.rounds import EvalRounds
from cadence.tasks.base import Prompt
from cadence.wire.messages import Assignment, EvalResult
from cadence.wire.roles import valid_ticket
from tests.unit.test_dispatch_core import Numbered

A, B, C = b"route-a", b"route-b", b"route-c"
WORKERS = [Worker(A, "a"), Worker(B, "b"), Worker(C, "c")]


def core(per_period: int = 8, hold: Hold | None = None, eval_set: list[Prompt] | None = None) -> DispatchCore:
    rounds = EvalRounds(eval_set or [], 1 if eval_set else 0, 3, 1, keep_versions=2)
    c = DispatchCore(Numbered(), 3, per_period, 4, rounds, max_credits=2, hold=hold)  # type: ignore[arg-type]
    c.announce(0, 0.0)
    return c


def ids(sends: list[tuple[bytes, Assignment]], route: bytes) -> list[int]:
    return [a.prompt_id for r, a in sends if r == route]


def test_asking_again_after_each_assignment_gains_nothing() -> None:
    c = core()
    taken: list[int] = []
    for _ in range(6):  # a hoarder asks for more after every assignment
        c.credit(A, 65_536)
        taken += ids(c.assign(WORKERS[:1], "key"), A)
    assert taken == [0, 1]  # rollout.inflight = 2 held at once, however often it asks
    assert c.held(A) == 2 and c.room(A) == 0
    c.credit(B, 2)
    assert ids(c.assign(WORKERS[:2], "key"), B) == [2, 3]  # the rest is there for the others
    c.consume(0, [0])  # one of its groups reached the trainer: room for one more
    assert ids(c.assign(WORKERS[:2], "key"), A) == [4]


def test_a_worker_that_asks_before_its_groups_are_consumed_gets_work_once_they_are() -> None:
    """An honest worker's WorkRequest may overtake the trainer's Consumed of its groups: its credits
    wait for the room, and nothing is lost."""
    c = core()
    c.credit(A, 2)
    assert ids(c.assign(WORKERS[:1], "key"), A) == [0, 1]
    c.credit(A, 2)  # the batch is done; its groups are still on their way to the trainer
    assert c.assign(WORKERS[:1], "key") == []
    c.consume(0, [0, 1])
    assert ids(c.assign(WORKERS[:1], "key"), A) == [2, 3]


def test_an_eval_batch_left_unanswered_does_not_hold_a_worker_back() -> None:
    """A worker skips an eval batch whose weights are gone, answering nothing, and asks for as many
    credits as the batch had: the next period's prompts still reach it."""
    c = core(per_period=2, eval_set=[Prompt(-i, f"e{i}", "1") for i in range(1, 9)])
    c.credit(A, 2)
    assert ids(c.assign(WORKERS[:1], "key"), A) == [0, 1]
    c.consume(0, [0, 1])
    c.credit(A, 2)
    evals = c.assign(WORKERS[:1], "key")  # the period is out: 2 credits buy the 8 eval prompts
    assert len(evals) == 8 and all(a.eval for _, a in evals) and c.rounds.open[0].outstanding
    c.credit(A, 8)  # the batch skipped: nothing answered, its credits asked for again
    c.announce(1, 1.0)
    assert ids(c.assign(WORKERS[:1], "key"), A) == [2, 3]


def test_an_idle_worker_takes_over_what_one_sits_on_past_a_few_typical_groups() -> None:
    hold = Hold(fixed=0.0, floor=200.0, early_floor=1.0)
    c = core(per_period=4, hold=hold)
    c.credit(A, 2)
    c.assign(WORKERS[:1], "key", now=0.0)  # the hoarder: 0, 1, never answered
    c.credit(B, 2)
    c.assign(WORKERS[:2], "key", now=0.0)  # 2, 3
    c.consume(0, [2, 3], now=2.0)  # a typical group: 2 s
    assert hold.typical() == 2.0 and hold.early() == EARLY * 2.0
    assert c.take_over(WORKERS, "key", now=7.0) == []  # B asked for nothing more: no one is idle
    c.credit(B, 2)
    assert c.take_over(WORKERS, "key", now=7.0) == []  # held 7 s: under 4 x 2 s
    sends = c.take_over(WORKERS, "key", now=8.5)
    assert ids(sends, B) == [0, 1] and all(a.batch == 2 for _, a in sends)
    assert c.ledger.held_by(A) == [] and c.ledger.held_by(B) == [0, 1]
    assert all(
        valid_ticket("key", a.ticket, "assignment", 0, a.prompt_id, "b") for _, a in sends
    )  # B's own tickets
    assert c.take_over(WORKERS, "key", now=9.0) == []  # taken over once; B is busy now
    c.consume(0, [0], now=9.5)  # the first result to reach the trainer wins, whoever sends it
    assert c.ledger.state(0) is State.CONSUMED and c.ledger.held_by(B) == [1]
    c.credit(A, 2)  # the one that sat on its prompts asks again: it takes nothing back this period
    assert c.take_over(WORKERS, "key", now=30.0) == []
    c.credit(C, 1)
    assert ids(c.take_over(WORKERS, "key", now=30.0), C) == [1]  # B sits too: C takes prompt 1 over
    c.announce(1, 31.0)
    assert c.sat_on == set()  # a new period: everyone starts afresh


def test_no_take_over_while_prompts_are_queued_or_before_any_group_is_seen() -> None:
    hold = Hold(fixed=0.0, floor=200.0, early_floor=1.0)
    c = core(per_period=6, hold=hold)
    c.credit(A, 2)
    c.assign(WORKERS[:1], "key", now=0.0)
    c.credit(C, 2)
    assert c.take_over(WORKERS, "key", now=100.0) == []  # no group seen yet: only the hold applies
    c.assign(WORKERS, "key", now=0.0)  # C: 2, 3; 4 and 5 queued
    c.consume(0, [2, 3], now=1.0)
    c.credit(C, 1)
    assert c.take_over(WORKERS, "key", now=100.0) == []  # 4 and 5 are queued: C takes those
    assert ids(c.assign(WORKERS, "key", now=100.0), C) == [4]


def test_the_early_hold_is_the_median_of_recent_groups_and_never_under_its_floor() -> None:
    hold = Hold(fixed=0.0, floor=60.0, early_floor=10.0)
    assert hold.early() is None and hold.deadline() == 60.0
    for seconds in (1.0, 1.0, 30.0):
        hold.took(seconds)
    assert hold.typical() == 1.0 and hold.early() == 10.0  # one slow group moves the median not
    for seconds in (5.0, 5.0, 5.0, 5.0):
        hold.took(seconds)
    assert hold.early() == EARLY * 5.0 and hold.deadline() == 120.0  # the hold: 4 x the slowest


def test_an_eval_batch_one_sits_on_is_taken_over_and_the_first_answer_wins() -> None:
    hold = Hold(fixed=0.0, floor=200.0, early_floor=1.0)
    c = core(per_period=2, hold=hold, eval_set=[Prompt(-i, f"e{i}", "1") for i in range(1, 5)])
    c.credit(A, 1)
    c.credit(B, 1)
    c.assign(WORKERS[:2], "key", now=0.0)  # A: 0, B: 1
    c.consume(0, [0, 1], now=2.0)  # a typical group: 2 s
    c.credit(A, 1)
    evals = c.assign(WORKERS[:1], "key", now=2.0)  # A's credit buys the round's 4 prompts; it sits on them
    assert [a.prompt_id for _, a in evals] == [-1, -2, -3, -4]
    c.credit(B, 1)  # B is idle
    assert c.take_over(WORKERS, "key", now=9.0) == []  # held 7 s: under 4 x 2 s
    sends = c.take_over(WORKERS, "key", now=10.5)
    assert ids(sends, B) == [-1, -2, -3, -4] and all(
        a.eval and a.version == 0 and a.batch == 4 for _, a in sends
    )
    assert c.eval_problem(A, _answer(-1)) is None  # the first holder may still answer
    assert c.answer(_answer(-1), 11.0) is None
    assert "answered already" in (c.eval_problem(B, _answer(-1)) or "")  # the later answer is refused
    for pid in (-2, -3):
        c.answer(_answer(pid), 11.0)
    assert c.eval_problem(B, _answer(-4)) is None
    done = c.answer(_answer(-4), 12.0)
    assert done is not None and done[0]["version"] == 0  # the round completes


def _answer(prompt_id: int) -> EvalResult:
    return EvalResult(0, prompt_id, [1.0], [1.0], ["1"], [3])
