"""The prompt dispatcher: the period state machine, the roster, and every assignment until consumed.

```
 any message ───────────────► from a registered route (else only Register), under the name that route
                              registered, may a peer of that role send it (wire/roles.py), does it
                              carry the trainer's MAC where it must (roles.SIGNED), and does it make
                              sense (wire/meaning.py)? else refused, logged, and nothing changes
 Register(name) ────────────► refused while a live session holds that name without showing its proof
                              (roster.claim_problem); a holder whose connection is gone: re-registered
 Register(trainer/publisher) ► refused while another peer holds that role (unless the run waits for
                              a lost trainer); the trainer's key ─► TrainerKey to the publisher
 trainer ─ VersionReady(k) ─► start period k: B prompts of period k → pending
 worker  ─ WorkRequest(n) ──► credits[worker] += n ─► assign pending → outstanding (worker,
                              Assignment with the ticket HMAC(trainer key, period, prompt id, worker));
                              the m assigned to a worker at once say batch=m: it generates them together
 trainer ─ Consumed(k, ids) ► outstanding -= ids
 worker silent > liveness ──► its outstanding prompts go back to the front of pending, reassigned
 no worker left, prompts pending for rollout.wait_for_workers_s ─► fail the run naming the lost workers
 worker welcomed again ─────► the same (_requeue): what it held goes back to the front of pending
 trainer ─ VersionReady(k+1, metrics of k) ─► metrics.jsonl line ─► period k+1 (or wait for RunDone)
 VersionReady(v), v % eval.every == 0 or v = periods ─► eval round of v: the eval set pending
 pending empty (the period's prompts all assigned) ─► eval prompts to workers with credits left (a
                              credit: G / eval samples prompts), as batches of their own
                              (Assignment eval=True, version v)
 worker  ─ EvalResult ──────► an eval prompt of the round given to that worker? else refused; round
                              complete ─► eval.jsonl row, samples/eval-period-v.jsonl
 round v with prompts not handed out at VersionReady(v+1) ─► that rest goes out first, before
                              period v+1's prompts, to workers still holding v (eval_rest_first)
 round v unanswered at VersionReady(v + weights.keep_versions) ─► eval_abandoned (no row)
 trainer ─ RunDone ─────────► (after the final eval round) summary.json, Shutdown to everyone, stop
 stop() (SIGUSR2) ──────────► summary.json of the periods recorded, Shutdown(stopped) to everyone, stop
 trainer or publisher lost ─► trainer.on_loss = "fail": fail the run
                              "wait": trainer_lost_waiting; nothing pending, nothing assigned, until a
                              trainer registers again ─► a fresh Welcome to every worker
                              ─► its VersionReady(k, metrics of k-1) (k from its resume checkpoint):
                              metrics.jsonl rewound to k-1, that row recorded, period k started over
```

Invariant: a prompt of period k is outstanding at exactly one live worker or pending, until the
trainer reports it consumed; nothing of period k+1 is released before version k+1 is published; an
eval prompt is handed out only while no training prompt is pending, except the rest of an older round,
which goes before the new period's prompts.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

import structlog

from cadence.actors.roster import Peer, WorkerWait, claim_problem, welcome_message
from cadence.monitor.evaluation import EvalRounds
from cadence.monitor.logstream import LogHub
from cadence.monitor.period_metrics import PeriodMetrics
from cadence.monitor.run_dir import RunRecorder
from cadence.tasks.base import Prompt, Task
from cadence.transport.endpoint import Server
from cadence.transport.heartbeat import Liveness
from cadence.transport.session import first_of
from cadence.wire.meaning import (
    eval_result_problem,
    run_done_problem,
    version_ready_problem,
    work_request_problem,
)
from cadence.wire.messages import (
    Assignment,
    Consumed,
    EvalResult,
    Heartbeat,
    LogBatch,
    Message,
    Register,
    RunDone,
    Shutdown,
    Subscribe,
    TrainerKey,
    VersionReady,
    WorkRequest,
)
from cadence.wire.roles import SIGNED, assignment_ticket, may_send, signed

log = structlog.get_logger()

UNREGISTERED = "its route never registered: a stranger, whatever name it gives"


@dataclass(frozen=True)
class DispatcherSettings:
    """What the dispatcher reads of the run's configuration (built by `launch/settings.py`).

    `on_trainer_loss`: "fail" ends the run when the trainer or its publisher is lost; "wait" holds
    the workers until a trainer resumed from its checkpoint registers again. `wait_for_workers_s`:
    how long prompts may wait with no rollout worker left before the run fails. `eval_every`: the
    versions evaluated on the eval set (0: none); `eval_samples`: samples an eval prompt;
    `keep_versions`: the versions the publisher keeps (an eval round lasts that long)."""

    periods: int
    prompts_per_period: int
    group_size: int
    on_trainer_loss: Literal["fail", "wait"]
    wait_for_workers_s: float = 300.0
    eval_every: int = 0
    eval_samples: int = 1
    keep_versions: int = 2  # the publisher's: an eval round lasts until that many versions later


class Dispatcher:
    """`liveness`: how often to beat every peer and how long one may be silent before it is lost;
    `eval_set`: the held-out prompts (`cadence.tasks.heldout`), evaluated every `eval_every` versions."""

    def __init__(
        self,
        settings: DispatcherSettings,
        server: Server,
        task: Task,
        recorder: RunRecorder,
        liveness: Liveness,
        clock: Callable[[], float],
        hub: LogHub | None = None,
        eval_set: Sequence[Prompt] = (),
    ) -> None:
        self.settings = settings
        s = settings
        self.evals = EvalRounds(eval_set, s.eval_every, s.periods, s.eval_samples, s.keep_versions)
        self.run_done: RunDone | None = None
        self.stopped = False  # its user ended the run before its last period
        self.hub = hub
        self.server = server
        self.task = task
        self.recorder = recorder
        self.clock = clock
        self.B = settings.prompts_per_period
        self.liveness = liveness
        self.peers: dict[bytes, Peer] = {}
        self.period = -1
        self.published = -1  # the last version announced
        self.pending: deque[Prompt] = deque()
        self.outstanding: dict[int, tuple[bytes, Prompt]] = {}
        self.reassigned = 0
        self.lost: list[str] = []
        self.done = asyncio.Event()
        self.failure: str | None = None
        self._outbox: list[tuple[bytes, Message]] = []
        self.worker_wait = WorkerWait(settings.wait_for_workers_s)

    # ------------------------------------------------------------------ life

    async def run(self) -> None:
        log.info("dispatcher_started", address=self.server.address, periods=self.settings.periods, B=self.B)
        self.recorder.start(self.clock())
        await first_of(self._receive(), self._watch(), self.done.wait())
        reason = self.failure or ("run stopped by its user" if self.stopped else "run complete")
        for peer in list(self.peers):
            await self.server.send(peer, Shutdown(reason, stopped=self.stopped))
        if self.hub is not None:
            await self.hub.tick()
        await asyncio.sleep(0.2)  # let the shutdowns leave before the socket closes
        if self.failure:
            raise RuntimeError(self.failure)

    async def _receive(self) -> None:
        while True:
            peer, env = await self.server.recv()
            try:
                await self._take(peer, env.sender, env.message)
            except Exception as exc:  # one peer's message must not end the run
                log.error(
                    "message_failed", peer=env.sender, type=env.message.TAG, error=repr(exc), exc_info=True
                )

    async def _take(self, peer: bytes, sender: str, msg: Message) -> None:
        """Handle one message: log traffic to the hub, anything else through `handle`."""
        if isinstance(msg, LogBatch | Subscribe):
            if self.hub is None:
                log.warning("unexpected_message", peer=sender, type=msg.TAG)
            elif isinstance(msg, LogBatch):
                await self.hub.batch(msg)
            else:
                await self.hub.subscribe(peer, sender, msg)
            return
        self.handle(peer, sender, msg)
        await self._flush()

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.liveness.interval_s)
            # the trainer first: when its process dies, the publisher it hosts goes silent with it
            for name, silent in sorted(self.liveness.expired(), key=lambda e: self._role(e[0]) != "trainer"):
                self._lost(name, silent)
            self._check_workers()
            for peer in list(self.peers):
                await self.server.send(peer, Heartbeat("dispatcher"))
            await self._flush()
            if self.hub is not None:
                await self.hub.tick()

    # ------------------------------------------------------------------ handlers

    def handle(self, peer: bytes, sender: str, msg: Message) -> None:
        """Update state for one message; replies are queued in `self._outbox` and sent by `_flush`."""
        known = peer in self.peers
        if not known and not isinstance(msg, Register):  # a route that never registered: a stranger's
            log.warning("message_from_unregistered_peer", peer=sender, type=msg.TAG, reason=UNREGISTERED)
            if sender in self.lost:  # declared dead, then woke up: it must not work on unseen
                self._outbox.append((peer, Shutdown(f"{sender} was declared lost; start it again to rejoin")))
            return
        role = self.peers[peer].role if known else "stranger"
        problem = self._problem(peer, sender, role, msg)
        if problem is not None:
            self.server.refuse(sender, role, msg, problem)
            if not known:  # a refused claim: the claimant stops, told why
                self._outbox.append((peer, Shutdown(f"registration refused: {problem}", refused=True)))
            return
        self.liveness.seen(sender)
        if isinstance(msg, Register):
            self._register(peer, sender, msg)
        elif isinstance(msg, WorkRequest):
            self.peers[peer].credits += msg.credits
        elif isinstance(msg, Consumed):
            self._consumed(msg)
        elif isinstance(msg, VersionReady):
            self.peers[peer].announced = msg.version
            self._version_ready(msg)
        elif isinstance(msg, EvalResult):
            self._eval_result(msg)
        elif isinstance(msg, RunDone):
            log.info("run_done", version=msg.version, sha256=msg.sha256, checkpoint=msg.checkpoint)
            self.run_done = msg
            self.evals.close_before(msg.version)
        self._finish()
        self._assign()

    def stop(self) -> None:
        """End the run now, cleanly (`cadence slurm stop`): the summary of the periods recorded so far
        (`final_version`: the last one announced; no final weights), and every peer told to stop."""
        if self.done.is_set():
            return
        log.warning("run_stopped", period=self.period, published=self.published)
        self.stopped = True
        self.recorder.finish(self.clock(), self.published, "", stopped=True)
        self.done.set()

    def _finish(self) -> None:
        """End the run once the trainer is done and the final eval round (if any) is recorded."""
        msg = self.run_done
        if msg is None or self.done.is_set() or self.evals.open:
            return
        self.recorder.finish(self.clock(), msg.version, msg.sha256)
        self.done.set()

    def _problem(self, peer: bytes, sender: str, role: str, msg: Message) -> str | None:
        """Why `sender`, on route `peer`, as `role`, may not send `msg` now (`cadence.wire.roles`,
        `cadence.wire.meaning`), or None."""
        known = self.peers.get(peer)
        if known is not None and known.name != sender:
            return f"sent as {sender!r} from the route {known.name!r} registered from"
        if not may_send("dispatcher", role, msg.TAG):
            return f"a {role} may not send {msg.TAG} to the dispatcher"
        if isinstance(msg, Register):
            waits = self.settings.on_trainer_loss == "wait"
            return claim_problem(self.peers, peer, sender, msg, waits, self.server.reachable)
        problem = self._meaning(peer, msg)
        if problem is None and msg.TAG in SIGNED and known is not None and not signed(known.key, msg):
            return f"no MAC of the registered trainer's key on {msg.TAG}"
        return problem

    def _meaning(self, peer: bytes, msg: Message) -> str | None:
        """What the message must also mean (`cadence.wire.meaning`)."""
        announced = self.peers[peer].announced
        if isinstance(msg, VersionReady):
            return version_ready_problem(msg, self.settings.periods, self.published, first=announced < 0)
        if isinstance(msg, RunDone):
            return run_done_problem(msg, self.settings.periods, announced)
        if isinstance(msg, WorkRequest):
            return work_request_problem(msg)
        if isinstance(msg, EvalResult):
            return self._eval_problem(peer, msg)
        return None

    def _eval_problem(self, peer: bytes, msg: EvalResult) -> str | None:
        """An eval answer makes sense, and answers a prompt of the open round given to its sender."""
        problem = eval_result_problem(msg, self.settings.eval_samples)
        return problem or self.evals.problem(peer, msg.version, msg.prompt_id)

    # ------------------------------------------------------------------ evaluation

    def _eval_result(self, msg: EvalResult) -> None:
        record = {"rewards": msg.rewards, "correct": msg.correct, "responses": msg.responses}
        done = self.evals.answer(msg.version, msg.prompt_id, record, self.clock())
        if done is None:
            return
        row, samples = done
        self.recorder.evaluation(row, samples)
        log.info(
            "eval_done",
            version=msg.version,
            accuracy=round(row["eval_accuracy"], 4),
            reward=round(row["eval_reward"], 4),
            eval_s=round(row["eval_s"], 3),
        )

    def _register(self, peer: bytes, sender: str, msg: Register) -> None:
        for name in {p.name for k, p in self.peers.items() if k == peer or p.name == sender}:
            self._lost(name, 0.0, reason="re-registered")  # its session again, or its process restarted
            self.liveness.seen(sender)
        if msg.role in ("trainer", "publisher") and self.settings.on_trainer_loss == "wait":
            for old in [p.name for p in self.peers.values() if p.role == msg.role]:
                self._lost(old, 0.0, reason=f"replaced by {sender}")
                self.liveness.seen(sender)
        local = msg.local if msg.role == "publisher" else ""
        key = msg.key if msg.role == "trainer" else ""
        self.peers[peer] = Peer(
            sender, msg.role, msg.address, key=key, local=local, host=msg.host, proof=msg.proof, pid=msg.pid
        )
        log.info(
            "peer_joined",
            peer=sender,
            role=msg.role,
            address=msg.address,
            peer_pid=msg.pid,
            peer_host=msg.host,
        )

    def _consumed(self, msg: Consumed) -> None:
        for pid in msg.prompt_ids:
            owner = self.outstanding.pop(pid, None)
            if owner is not None and owner[0] in self.peers:
                self.peers[owner[0]].outstanding.discard(pid)

    def _version_ready(self, msg: VersionReady) -> None:
        # a period's row replaces any earlier row of it and of the periods after it: a trainer that
        # resumed from its checkpoint starts over there (its first version carries the row before)
        row = PeriodMetrics.from_row(msg.metrics) if msg.metrics else None
        dropped = self.recorder.rewind(msg.version - 1 if msg.metrics else msg.version)
        if dropped:
            log.info("metrics_rewound", version=msg.version, dropped=dropped)
        self.published = msg.version
        if row is not None:
            workers = sum(1 for p in self.peers.values() if p.role == "rollout")
            self.recorder.period(replace(row, workers=workers, reassigned=self.reassigned))
        self.evals.announce(msg.version, self.clock())
        if msg.version >= self.settings.periods:
            log.info("periods_complete", version=msg.version)
            self.pending.clear()
            return
        self.period = msg.version
        self.pending = deque(self.task.prompts(self.period, self.B))
        self.outstanding.clear()
        for p in self.peers.values():
            p.outstanding.clear()
        log.info("period_started", period=self.period, version=msg.version, prompts=len(self.pending))

    def _lost(self, name: str, silent_s: float, reason: str = "silent") -> None:
        peer = next((k for k, p in self.peers.items() if p.name == name), None)
        if peer is None:
            return
        info = self.peers.pop(peer)
        self.liveness.forget(name)
        if info.role != "rollout" and self.settings.on_trainer_loss == "wait":
            self._await_trainer(info, silent_s, reason)
            return
        if info.role != "rollout":
            who = name if name == info.role else f"{info.role} {name}"
            self.failure = self.failure or f"{who} lost ({reason} for {silent_s:.1f}s)"  # the first says why
            log.error("peer_lost", peer=name, role=info.role, silent_s=round(silent_s, 2), reason=reason)
            self.done.set()
            return
        back = self._requeue(info)
        self.evals.requeue(peer)
        self.reassigned += back
        self.lost.append(name)
        log.warning("worker_lost", peer=name, silent_s=round(silent_s, 2), reason=reason, requeued=back)

    def _role(self, name: str) -> str:
        return next((p.role for p in self.peers.values() if p.name == name), "")

    def _requeue(self, info: Peer) -> int:
        """Put what `info` held, still outstanding, back at the front of pending, in prompt order;
        it holds nothing after. How many went back."""
        back = [self.outstanding.pop(pid)[1] for pid in sorted(info.outstanding) if pid in self.outstanding]
        self.pending.extendleft(reversed(back))
        info.outstanding.clear()
        return len(back)

    def _check_workers(self) -> None:
        """Say so when prompts wait and no rollout worker is left, and when one is back; fail the run
        when none has come for `wait_for_workers_s`."""
        workers = sum(1 for p in self.peers.values() if p.role == "rollout")
        waiting = bool(self.pending or self.evals.pending)
        failure = self.worker_wait.check(
            workers, waiting, self.clock(), self.period, len(self.pending), self.lost
        )
        if failure is not None:
            self.failure = self.failure or failure
            self.done.set()

    def _await_trainer(self, info: Peer, silent_s: float, reason: str) -> None:
        """A trainer (or its publisher) is gone but can come back from its resume checkpoint: hold
        every worker until both are there again (a fresh Welcome); a new trainer's first version
        names the period that starts over."""
        if info.role == "trainer":
            self.evals.open.clear()
            self.pending.clear()
            self.outstanding.clear()
            for p in self.peers.values():
                p.outstanding.clear()
        for p in self.peers.values():
            p.welcomed = p.welcomed and p.role != "rollout"
        log.warning(
            "trainer_lost_waiting",
            peer=info.name,
            role=info.role,
            silent_s=round(silent_s, 2),
            reason=reason,
            period=self.period,
        )

    # ------------------------------------------------------------------ assignment

    def _assign(self) -> None:
        welcome = welcome_message(self.peers, max(self.period, 0))
        key = next((p.key for p in self.peers.values() if p.role == "trainer"), "")
        for peer, info in self.peers.items():
            if info.role == "publisher" and key and info.told != key:
                info.told = key
                self._outbox.append((peer, TrainerKey(key)))
        for peer, info in self.peers.items():
            if info.role == "rollout" and not info.welcomed and welcome is not None:
                info.welcomed = True
                info.credits = 0  # a welcomed worker drops what it held and asks for work afresh
                self._requeue(info)
                self.evals.requeue(peer)
                self._outbox.append((peer, welcome))
        workers = [(k, p) for k, p in self.peers.items() if p.role == "rollout" and p.welcomed]
        if self.evals.behind(self.published):  # the rest of an older round first
            self._assign_eval(workers)
        held = self.evals.behind(self.published)  # some of that rest waits for credits
        given: dict[bytes, list[Prompt]] = {}
        while self.pending and workers and not held:
            peer, info = max(workers, key=lambda kp: kp[1].credits)
            if info.credits <= 0:
                break
            prompt = self.pending.popleft()
            info.credits -= 1
            info.outstanding.add(prompt.prompt_id)
            self.outstanding[prompt.prompt_id] = (peer, prompt)
            given.setdefault(peer, []).append(prompt)
        for peer, prompts in given.items():  # what a worker gets at once, it generates as one batch
            for prompt in prompts:
                assignment = Assignment(
                    self.period,
                    self.period,
                    prompt.prompt_id,
                    prompt.text,
                    prompt.answer,
                    self.settings.group_size,
                    assignment_ticket(key, self.period, prompt.prompt_id, self.peers[peer].name),
                    batch=len(prompts),
                )
                self._outbox.append((peer, assignment))
        if not self.pending and self.evals.pending:
            self._assign_eval(workers)

    def _assign_eval(self, workers: list[tuple[bytes, Peer]]) -> None:
        """Eval prompts to the workers' credits left, once no training prompt is pending (or before
        them, the rest of an older round): each worker's as one batch of its own (a training batch
        sent before it stays whole). A credit stands for a group of `group_size` samples, so it buys group_size / eval
        samples eval prompts: a batch costs what the training groups of those credits would."""
        per_credit = max(1, self.settings.group_size // self.settings.eval_samples)  # as many samples
        for peer, info in workers:
            batch = self.evals.give(peer, max(info.credits, 0) * per_credit, self.published)
            info.credits -= len(batch)  # below 0 until the worker's WorkRequest(len(batch)) after it
            for r, prompt in batch:
                assignment = Assignment(
                    r.version,
                    r.version,
                    prompt.prompt_id,
                    prompt.text,
                    prompt.answer,
                    self.settings.eval_samples,
                    batch=len(batch),
                    eval=True,
                )
                self._outbox.append((peer, assignment))

    async def _flush(self) -> None:
        outbox, self._outbox = self._outbox, []
        for peer, msg in outbox:
            await self.server.send(peer, msg)
