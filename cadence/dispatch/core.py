"""The dispatcher's core: the period's prompts, the eval rounds, the workers' credits, and what to
send whom. Synchronous and without sockets: `cadence.actors.dispatcher` feeds it what the peers say
and sends the assignments it returns.

```
 announce(k) ──────────────► period k: B prompts of period k queued (the ledger), and with
                             sampling.oversample that share of B more; a period announced again
                             starts over with fresh prompts; k = periods: nothing more queued
 announce(v), v % eval.every == 0 or v = periods ─► eval round of v: the eval set pending
 credit(worker, n) ────────► credits += n
 assign(workers, key) ─────► the queued prompts shared out by the policy within the credits
                             (most_credits_first), each an Assignment with the ticket HMAC(trainer
                             key, period, prompt id, worker); the m a worker gets at once say
                             batch=m: it generates them together
 queue empty ──────────────► eval prompts to workers with credits left (a credit: G / eval samples
                             prompts), as batches of their own (Assignment eval=True, version v)
 round v with prompts not handed out at announce(v+1) ─► that rest goes out first, before period
                             v+1's prompts, to workers still holding v (eval_rest_first)
 round v unanswered at announce(v + weights.keep_versions) ─► eval_abandoned (no row)
 consume(k, ids) ──────────► consumed (from the queue too: a lost worker's group the trainer took)
 consume(k, filtered=ids) ─► with fewer than B issued prompts not filtered, the next ones of the
                             period's stream are queued, up to the stream's end (sampling.ceiling)
 consume(k, closed) ───────► the period's queued and assigned prompts stopped: each worker that held
                             some is told (StopPeriod)
 leave(worker) / restart ──► what it held back to the front of the queue, in prompt order
 expire(now) ──────────────► what a worker held past the hold (rollout.hold_s, else 4 x the slowest
                             group so far, at least 20 liveness timeouts, or one while another
                             worker waits with nothing to do) back to the front of the queue, for
                             another worker
 answer(eval result) ──────► a complete round ─► its eval.jsonl row and samples
```

Invariant: a prompt of period k is held by at most one worker (`Ledger`) until the trainer consumes
it or the period closes; a period's prompts are the first ones of its stream (`task.prompts(k,
stream)`, the same whoever asks), in order, so a resumed period issues the same ones; nothing of period k+1 is handed out before version k+1 is announced; an eval prompt is handed out
only while no training prompt is queued, except the rest of an older round, which goes before the new
period's prompts; a worker never gets more prompts than it has credits, save the eval prompts one
credit buys (`group_size // eval_samples`), and never holds more credits than `rollout.inflight`, nor
is given training prompts while what it holds of the period and its credits together pass it (a request
waits whole until they do, never cut).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from cadence.dispatch.ledger import Ledger
from cadence.dispatch.policy import Policy, most_credits_first
from cadence.dispatch.rounds import EvalRounds
from cadence.tasks.base import Prompt, Task
from cadence.wire.messages import Assignment, EvalResult
from cadence.wire.roles import assignment_ticket

log = structlog.get_logger()

Sends = list[tuple[bytes, Assignment]]


class Hold:
    """How long a worker may hold an assignment: `fixed` seconds (`rollout.hold_s`), or, with 0,
    derived from the run: 4 x the slowest group seen from its assignment to the trainer, never under
    `floor` (before any group is seen: `floor`); while another worker waits for work and gets none,
    never under `idle_floor` instead (0: `floor`), once a group is seen. So a worker that holds the
    period's last prompts and answers nothing keeps the others idle a few times the run's slowest
    group, not the whole floor; an honest one that is merely slow has its prompts generated again by
    an idle worker, and the first result to reach the trainer is trained."""

    def __init__(self, fixed: float = 0.0, floor: float = 60.0, idle_floor: float = 0.0) -> None:
        self.fixed = fixed
        self.floor = floor
        self.idle_floor = idle_floor
        self.slowest = 0.0

    def took(self, seconds: float) -> None:
        self.slowest = max(self.slowest, seconds)

    def deadline(self, others_idle: bool = False) -> float:
        if self.fixed > 0:
            return self.fixed
        early = others_idle and self.slowest > 0 and self.idle_floor > 0
        return max(4 * self.slowest, self.idle_floor if early else self.floor)


@dataclass(frozen=True)
class Worker:
    """A worker that may get work: its route, and the name its tickets are made out to."""

    route: bytes
    name: str


class DispatchCore:
    """`periods` periods of `prompts_per_period` prompts of `task`, each a group of `group_size`;
    `rounds`: the eval rounds; `policy`: how queued prompts are shared out between workers."""

    def __init__(
        self,
        task: Task,
        periods: int,
        prompts_per_period: int,
        group_size: int,
        rounds: EvalRounds,
        policy: Policy = most_credits_first,
        extra: int = 0,
        stream: int = 0,
        max_credits: int = 0,
        hold: Hold | None = None,
    ) -> None:
        self.task = task
        self.periods = periods
        self.B = prompts_per_period
        self.group_size = group_size
        self.rounds = rounds
        self.policy = policy
        self.extra = extra  # prompts queued beyond B at a period's start
        self.stream = stream or prompts_per_period  # the prompts a period may issue
        self.ledger = Ledger()
        self._reserve: list[Prompt] = []  # the period's stream not issued yet
        self.filtered: set[int] = set()  # the open period's groups a filter threw away
        self.max_credits = max_credits  # the credits a worker may hold (0: no cap)
        self.hold = hold or Hold()
        self.credits: dict[bytes, int] = {}
        self.period = -1  # the period whose prompts are out
        self.published = -1  # the last version announced

    # ------------------------------------------------------------------ what the peers say

    def announce(self, version: int, now: float) -> None:
        """Version `version` is published: its eval round opens if due, and period `version` starts
        (with a fresh set of prompts: a period announced again starts over), unless it is the last."""
        self.published = version
        self.rounds.announce(version, now)
        if version >= self.periods:
            log.info("periods_complete", version=version)
            self.ledger.close()
            return
        self.period = version
        stream = self.task.prompts(version, self.stream)
        first = self.B + self.extra
        self.ledger.open(version, stream[:first])
        self._reserve = list(stream[first:])
        self.filtered = set()
        log.info("period_started", period=version, version=version, prompts=self.ledger.queued)

    def consume(
        self,
        period: int,
        prompt_ids: Sequence[int],
        filtered: Sequence[int] = (),
        closed: bool = False,
        now: float = 0.0,
    ) -> dict[bytes, list[int]]:
        """The trainer took `prompt_ids` of `period` (at `now`), threw `filtered` away, and, `closed`,
        has the period's groups: the prompts stopped, by the route of the worker that held them."""
        if period == self.ledger.period:
            for pid in prompt_ids:
                since = self.ledger.held_since(pid)
                if since is not None:
                    self.hold.took(now - since)
        self.ledger.consume(period, prompt_ids)
        if period != self.period or self.ledger.period != period:
            return {}
        self.filtered |= {pid for pid in filtered if self.ledger.state(pid) is not None}
        if closed:
            held = self.ledger.stop(period)
            self._reserve = []
            log.info(
                "period_closed",
                period=period,
                issued=self.ledger.issued,
                filtered=len(self.filtered),
                stopped=sum(len(ids) for ids in held.values()),
            )
            return held
        self._refill()
        return {}

    def _refill(self) -> None:
        """Queue more of the period's stream while the prompts not filtered cannot make B."""
        short = self.B - (self.ledger.issued - len(self.filtered))
        if short > 0 and self._reserve:
            more, self._reserve = self._reserve[:short], self._reserve[short:]
            self.ledger.add(more)
            log.info(
                "prompts_drawn",
                period=self.period,
                drawn=len(more),
                issued=self.ledger.issued,
                filtered=len(self.filtered),
                left=len(self._reserve),
            )

    def credit(self, worker: bytes, count: int) -> None:
        """`worker` grants `count` more credits: at most `max_credits` held (what a worker can use)."""
        credits = self.credits.get(worker, 0) + count
        if self.max_credits and credits > self.max_credits:
            log.warning("credits_capped", asked=credits, held=self.max_credits)
            credits = self.max_credits
        self.credits[worker] = credits

    def expire(self, now: float) -> dict[bytes, list[int]]:
        """The training prompts held past the hold deadline go back to the queue (to the front, in
        prompt order): their ids, by the route of the worker that held them."""
        return self.ledger.expire(lambda worker: now - self.deadline(worker))

    def deadline(self, worker: bytes) -> float:
        """How long `worker` may hold a prompt now: shorter while another worker waits for work the
        queue cannot give it (it has credits it may use, and nothing is queued)."""
        waiting = not self.ledger.queued and any(
            other != worker and self._usable(other) > 0 for other in self.credits
        )
        return self.hold.deadline(others_idle=waiting)

    def restart(self, worker: bytes) -> int:
        """`worker` (welcomed again) drops what it held and asks afresh: its prompts back to the front
        of the queue, its credits 0. How many training prompts went back."""
        self.credits[worker] = 0
        self.rounds.requeue(worker)
        return self.ledger.requeue(worker)

    def leave(self, worker: bytes) -> int:
        """`worker` is gone: what it held goes back to the front of the queue; how many prompts."""
        self.credits.pop(worker, None)
        self.rounds.requeue(worker)
        return self.ledger.requeue(worker)

    def trainer_lost(self) -> None:
        """Nothing is handed out until a trainer announces a version again."""
        self.rounds.open.clear()
        self.ledger.close()

    def eval_problem(self, worker: bytes, msg: EvalResult) -> str | None:
        return self.rounds.problem(worker, msg.version, msg.prompt_id)

    def answer(self, msg: EvalResult, now: float) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
        """Take an eval answer `eval_problem` found nothing wrong with; the row and samples of the
        round it completes, or None."""
        done = self.rounds.answer(msg, now)
        if done is not None:
            row = done[0]
            log.info(
                "eval_done",
                version=msg.version,
                accuracy=round(row["eval_accuracy"], 4),
                reward=round(row["eval_reward"], 4),
                eval_s=round(row["eval_s"], 3),
            )
        return done

    @property
    def waiting(self) -> bool:
        """Prompts (training or eval) wait to be handed out."""
        return bool(self.ledger.queued or self.rounds.pending)

    # ------------------------------------------------------------------ what to send

    def assign(self, workers: Sequence[Worker], key: str, now: float = 0.0) -> Sends:
        """The assignments to send now to `workers` (in roster order), within their credits: the rest
        of an older eval round first, then the period's prompts by the policy, then the open round's
        eval prompts to the credits left. `key`: the trainer's, which tickets are made with."""
        sends: Sends = []
        if self.rounds.behind(self.published):
            sends += self._assign_eval(workers)
        if self.rounds.behind(self.published):  # some of that rest waits for credits
            return sends
        counts = self.policy([self._usable(w.route) for w in workers], self.ledger.queued)
        for worker, count in zip(workers, counts, strict=True):
            prompts = self.ledger.assign(worker.route, count, now)
            self.credits[worker.route] = self.credits.get(worker.route, 0) - len(prompts)
            sends += [(worker.route, self._assignment(p, worker, key, len(prompts))) for p in prompts]
        if not self.ledger.queued and self.rounds.pending:
            sends += self._assign_eval(workers)
        return sends

    def _usable(self, worker: bytes) -> int:
        """The training prompts `worker` may be given now: its credits, or none while what it holds of
        the period and its credits together pass `max_credits`. Asking again does not lift the cap
        (it counts what is held, not what was asked), and a request is delayed whole, never cut: the
        batch a worker gets does not depend on whether its request or the trainer's word on the groups
        it answered came first."""
        credits = max(self.credits.get(worker, 0), 0)
        if self.max_credits and credits + self.ledger.holding(worker) > self.max_credits:
            return 0
        return credits

    def _assignment(self, prompt: Prompt, worker: Worker, key: str, batch: int) -> Assignment:
        ticket = assignment_ticket(key, self.period, prompt.prompt_id, worker.name)
        k = self.period
        return Assignment(k, k, prompt.prompt_id, prompt.text, prompt.answer, self.group_size, ticket, batch)

    def _assign_eval(self, workers: Sequence[Worker]) -> Sends:
        """Eval prompts to the workers' credits left, each worker's as one batch of its own (a training
        batch sent before it stays whole). A credit stands for a group of `group_size` samples, so it
        buys group_size / eval samples eval prompts: a batch costs what the training groups of those
        credits would."""
        per_credit = max(1, self.group_size // self.rounds.samples)
        sends: Sends = []
        for w in workers:
            left = self.credits.get(w.route, 0)
            batch = self.rounds.give(w.route, max(left, 0) * per_credit, self.published)
            self.credits[w.route] = left - len(batch)  # below 0 until the worker's WorkRequest(len(batch))
            sends += [(w.route, self._eval_assignment(r.version, p, len(batch))) for r, p in batch]
        return sends

    def _eval_assignment(self, version: int, prompt: Prompt, batch: int) -> Assignment:
        p, samples = prompt, self.rounds.samples
        return Assignment(version, version, p.prompt_id, p.text, p.answer, samples, batch=batch, eval=True)
