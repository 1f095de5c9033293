"""The dispatcher's core without sockets: the ledger's transitions, the policy, and what the core
assigns to whom."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cadence.dispatch.core import DispatchCore, Worker
from cadence.dispatch.ledger import Ledger, State
from cadence.dispatch.policy import most_credits_first
from cadence.dispatch.rounds import EvalRounds
from cadence.tasks.base import Prompt
from cadence.wire.messages import Assignment, EvalResult
from cadence.wire.roles import assignment_ticket, valid_ticket

A, B = b"route-a", b"route-b"


def prompts(period: int, count: int) -> list[Prompt]:
    return [Prompt(period * count + i, f"q{period}.{i}", str(i)) for i in range(count)]


class Numbered:
    alphabet = "0123456789"

    def prompts(self, period: int, count: int) -> list[Prompt]:
        return prompts(period, count)

    def score(self, prompt: str, response: str, answer: str, finished: bool) -> object:
        raise NotImplementedError


def core(
    periods: int = 3, per_period: int = 4, eval_set: Sequence[Prompt] = (), every: int = 0, samples: int = 1
) -> DispatchCore:
    rounds = EvalRounds(eval_set, every, periods, samples, keep_versions=2)
    return DispatchCore(Numbered(), periods, per_period, group_size=4, rounds=rounds)  # type: ignore[arg-type]


def ids(sends: list[tuple[bytes, Assignment]], route: bytes | None = None) -> list[int]:
    return [a.prompt_id for r, a in sends if route is None or r == route]


# ---------------------------------------------------------------- the ledger


def test_ledger_walks_each_prompt_through_its_states() -> None:
    ledger = Ledger()
    ledger.open(0, prompts(0, 4))
    assert ledger.queued == 4 and all(ledger.state(i) is State.QUEUED for i in range(4))
    assert [p.prompt_id for p in ledger.assign(A, 3)] == [0, 1, 2]
    assert ledger.held_by(A) == [0, 1, 2] and ledger.queued == 1
    assert ledger.consume(0, [1]) == 1 and ledger.state(1) is State.CONSUMED
    assert ledger.requeue(A) == 2  # 0 and 2 go back to the front, in order, before 3
    assert [p.prompt_id for p in ledger.assign(B, 4)] == [0, 2, 3]
    assert ledger.held_by(A) == [] and ledger.held_by(B) == [0, 2, 3]


def test_ledger_ignores_another_periods_consumed_and_a_repeat() -> None:
    ledger = Ledger()
    ledger.open(1, prompts(1, 2))
    ledger.assign(A, 2)
    assert ledger.consume(0, [2, 3]) == 0  # period 0's: stale
    assert ledger.consume(1, [2, 2, 99]) == 1  # once, and an id it never had changes nothing
    assert ledger.state(3) is State.ASSIGNED


def test_a_queued_prompt_the_trainer_took_is_not_handed_out_again() -> None:
    ledger = Ledger()
    ledger.open(0, prompts(0, 3))
    ledger.assign(A, 3)
    ledger.requeue(A)  # A declared lost, but its group of prompt 1 reached the trainer
    assert ledger.consume(0, [1]) == 1
    assert [p.prompt_id for p in ledger.assign(B, 3)] == [0, 2]


def test_opening_a_period_forgets_the_last_and_refuses_repeated_ids() -> None:
    ledger = Ledger()
    ledger.open(0, prompts(0, 2))
    ledger.assign(A, 1)
    ledger.open(1, prompts(1, 2))
    assert ledger.held_by(A) == [] and ledger.queued == 2 and ledger.state(0) is None
    with pytest.raises(ValueError, match="repeat"):
        ledger.open(2, [Prompt(7, "a", "1"), Prompt(7, "b", "2")])


# ---------------------------------------------------------------- the policy


def test_most_credits_first_evens_out_and_prefers_the_first_of_equals() -> None:
    assert most_credits_first([3, 1], 2) == [2, 0]
    assert most_credits_first([3, 3], 3) == [2, 1]
    assert most_credits_first([0, 2], 5) == [0, 2]
    assert most_credits_first([], 5) == []
    assert most_credits_first([4], 0) == [0]


@given(st.lists(st.integers(0, 20), max_size=6), st.integers(0, 60))
def test_a_policy_never_gives_more_than_asked_or_queued(credits: list[int], queued: int) -> None:
    given_ = most_credits_first(credits, queued)
    assert len(given_) == len(credits)
    assert all(0 <= g <= c for g, c in zip(given_, credits, strict=True))
    assert sum(given_) == min(queued, sum(credits))  # nothing held back while asked for


# ---------------------------------------------------------------- the core


def test_nothing_goes_out_before_a_version_and_never_beyond_credits() -> None:
    c = core()
    workers = [Worker(A, "a"), Worker(B, "b")]
    c.credit(A, 3)
    assert c.assign(workers, "key") == []  # no period yet
    c.announce(0, 0.0)
    sends = c.assign(workers, "key")
    assert ids(sends, A) == [0, 1, 2] and ids(sends, B) == []
    assert all(a.batch == 3 and a.period == a.version == 0 for _, a in sends)
    assert all(valid_ticket("key", a.ticket, "assignment", 0, a.prompt_id, "a") for _, a in sends)
    assert c.assign(workers, "key") == []  # its credits are spent
    c.credit(B, 5)
    assert ids(c.assign(workers, "key"), B) == [3]
    assert sends[0][1].ticket == assignment_ticket("key", 0, 0, "a")


def test_a_lost_workers_prompts_go_to_the_next_that_asks() -> None:
    c = core()
    c.announce(0, 0.0)
    c.credit(A, 2)
    c.assign([Worker(A, "a")], "k")
    assert c.leave(A) == 2 and A not in c.credits
    c.credit(B, 4)
    assert ids(c.assign([Worker(B, "b")], "k")) == [0, 1, 2, 3]


def test_a_restarted_worker_asks_afresh() -> None:
    c = core()
    c.announce(0, 0.0)
    c.credit(A, 3)
    c.assign([Worker(A, "a")], "k")
    c.credit(A, 2)
    assert c.restart(A) == 3 and c.credits[A] == 0
    c.credit(A, 1)
    assert ids(c.assign([Worker(A, "a")], "k")) == [0]


def test_the_next_version_starts_over_and_the_last_queues_nothing() -> None:
    c = core(periods=2, per_period=2)
    c.announce(0, 0.0)
    c.credit(A, 1)
    c.assign([Worker(A, "a")], "k")
    c.announce(1, 1.0)
    assert c.ledger.queued == 2 and c.ledger.held_by(A) == [] and c.period == 1
    c.announce(2, 2.0)
    assert not c.waiting and c.period == 1 and c.published == 2


def test_eval_prompts_go_out_once_the_period_is_handed_out() -> None:
    evals = [Prompt(-1 - i, f"e{i}", "0") for i in range(6)]
    c = core(periods=2, per_period=2, eval_set=evals, every=1, samples=2)
    c.announce(0, 0.0)
    c.credit(A, 3)
    sends = c.assign([Worker(A, "a")], "k")
    training = [a for _, a in sends if not a.eval]
    eval_ = [a for _, a in sends if a.eval]
    assert [a.prompt_id for a in training] == [0, 1]
    # the credit left buys group_size / samples = 2 eval prompts, a batch of its own
    assert [a.prompt_id for a in eval_] == [-1, -2] and all(a.batch == 2 for a in eval_)
    assert c.credits[A] == -1
    assert c.eval_problem(A, result(0, -1)) is None
    assert c.eval_problem(B, result(0, -1)) is not None  # not given to B
    assert c.answer(result(0, -1), 1.0) is None


def test_the_rest_of_an_older_round_goes_before_the_new_period() -> None:
    evals = [Prompt(-1 - i, f"e{i}", "0") for i in range(3)]
    c = core(periods=3, per_period=2, eval_set=evals, every=1, samples=4)
    c.announce(0, 0.0)
    c.credit(A, 2)
    c.assign([Worker(A, "a")], "k")  # period 0's two prompts, no credit left for round 0
    c.announce(1, 1.0)
    c.credit(A, 2)
    sends = c.assign([Worker(A, "a")], "k")
    assert all(a.eval and a.version == 0 for _, a in sends)  # round 0's rest first, nothing of period 1
    assert ids(sends) == [-1, -2]
    c.credit(A, 2)
    sends = c.assign([Worker(A, "a")], "k")  # the round's last prompt, then period 1 with the credit left
    assert [(a.prompt_id, a.eval, a.version) for _, a in sends] == [(-3, True, 0), (2, False, 1)]
    c.credit(A, 3)
    sends = c.assign([Worker(A, "a")], "k")  # period 1's last, then round 1 to the credits left
    assert [(a.prompt_id, a.eval, a.version) for _, a in sends] == [
        (3, False, 1),
        (-1, True, 1),
        (-2, True, 1),
    ]


def result(version: int, prompt_id: int) -> EvalResult:
    return EvalResult(version, prompt_id, [1.0, 0.0], [1.0, 0.0], ["a", "b"], [3, 4])


# ---------------------------------------------------------------- bounded in credits and in time


def test_a_worker_holds_no_more_credits_than_it_can_use() -> None:
    rounds = EvalRounds((), 0, 3, 1, keep_versions=2)
    c = DispatchCore(Numbered(), 3, 8, 4, rounds, max_credits=2)  # type: ignore[arg-type]
    c.announce(0, 0.0)
    c.credit(A, 65_536)  # a hoarder
    c.credit(B, 2)
    sent = c.assign([Worker(A, "a"), Worker(B, "b")], "key")
    assert len(ids(sent, A)) == 2 and len(ids(sent, B)) == 2  # the other worker is not starved


def test_an_assignment_held_past_the_hold_goes_back_for_another_worker() -> None:
    from cadence.dispatch.core import Hold

    rounds = EvalRounds((), 0, 3, 1, keep_versions=2)
    hold = Hold(fixed=0.0, floor=10.0)
    c = DispatchCore(Numbered(), 3, 4, 4, rounds, max_credits=4, hold=hold)  # type: ignore[arg-type]
    c.announce(0, 0.0)
    c.credit(A, 2)
    c.assign([Worker(A, "a")], "key", now=100.0)  # prompts 0, 1
    c.credit(B, 1)
    c.assign([Worker(B, "b")], "key", now=103.0)  # prompt 2
    c.consume(0, [0], now=104.0)  # a group took 4 s: the hold is max(4 x 4, 10) = 16 s
    assert hold.deadline() == 16.0
    assert c.expire(now=115.0) == {}
    assert c.expire(now=116.5) == {A: [1]}  # held since 100, past 16 s; B's prompt 2 since 103 is not
    assert c.ledger.state(1) is State.QUEUED and c.ledger.held_by(A) == []
    c.credit(B, 1)
    assert ids(c.assign([Worker(B, "b")], "key", now=117.0)) == [1]  # the front of the queue
    assert c.expire(now=119.5) == {B: [2]}
    assert Hold(fixed=5.0, floor=60.0).deadline() == 5.0  # rollout.hold_s, when set, is the hold


def test_a_worker_holding_the_last_prompts_while_another_waits_holds_them_a_few_groups_long() -> None:
    from cadence.dispatch.core import Hold

    rounds = EvalRounds((), 0, 3, 1, keep_versions=2)
    hold = Hold(fixed=0.0, floor=200.0, idle_floor=10.0)
    c = DispatchCore(Numbered(), 3, 4, 4, rounds, max_credits=2, hold=hold)  # type: ignore[arg-type]
    c.announce(0, 0.0)
    c.credit(A, 2)
    c.assign([Worker(A, "a")], "key", now=100.0)  # prompts 0, 1
    c.credit(B, 2)
    c.assign([Worker(B, "b")], "key", now=100.0)  # prompts 2, 3: nothing left in the queue
    assert c.expire(now=150.0) == {}  # no group seen yet: the floor, whoever waits
    c.consume(0, [2, 3], now=103.0)  # B's groups took 3 s: 4 x 3 = 12 s
    assert c.deadline(A) == 200.0  # B has not asked for more: nobody waits
    c.credit(B, 2)  # B asks for work the queue cannot give: it waits
    assert c.deadline(A) == 12.0 and c.deadline(B) == 200.0
    assert c.expire(now=111.0) == {}
    assert c.expire(now=112.5) == {A: [0, 1]}  # held since 100, past 12 s while B waits
    assert ids(c.assign([Worker(B, "b")], "key", now=112.5)) == [0, 1]
    assert c.deadline(B) == 200.0  # nobody waits now: B holds them up to the floor
    hold.idle_floor = 30.0
    c.credit(A, 2)  # A (back, or another) waits: B's hold is the idle floor, over 4 x 3 s
    assert c.deadline(B) == 30.0


def test_asking_again_does_not_lift_the_cap_on_what_a_worker_holds() -> None:
    """A worker that asks for credits after each assignment holds at most `max_credits` prompts of
    the period; once the trainer has taken them, it gets more."""
    rounds = EvalRounds((), 0, 3, 1, keep_versions=2)
    c = DispatchCore(Numbered(), 3, 8, 4, rounds, max_credits=2)  # type: ignore[arg-type]
    c.announce(0, 0.0)
    held: list[int] = []
    for _ in range(5):
        c.credit(A, 2)
        held += ids(c.assign([Worker(A, "a")], "key"))
    assert held == [0, 1] and c.ledger.held_by(A) == [0, 1]
    c.consume(0, [0, 1], now=1.0)
    assert ids(c.assign([Worker(A, "a")], "key")) == [2, 3]


@pytest.mark.parametrize("credit_first", [True, False])
def test_a_request_waits_whole_for_the_trainers_word_never_cut(credit_first: bool) -> None:
    """A worker's batch of two answered: its request for two more and the trainer's word on the two
    groups come in either order, one group at a time; the next batch is two prompts either way."""
    rounds = EvalRounds((), 0, 3, 1, keep_versions=2)
    c = DispatchCore(Numbered(), 3, 8, 4, rounds, max_credits=2)  # type: ignore[arg-type]
    c.announce(0, 0.0)
    c.credit(A, 2)
    assert ids(c.assign([Worker(A, "a")], "key")) == [0, 1]
    batches: list[list[int]] = []
    steps = [lambda: c.credit(A, 2), lambda: c.consume(0, [0], now=1.0), lambda: c.consume(0, [1], now=1.0)]
    for step in steps if credit_first else steps[1:] + steps[:1]:
        step()
        sent = c.assign([Worker(A, "a")], "key")
        if sent:
            batches.append(ids(sent))
            assert all(a.batch == len(sent) for _, a in sent)
    assert batches == [[2, 3]]
