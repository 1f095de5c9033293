"""The prompt dispatcher: the period state machine, the roster, and every assignment until consumed.

```
 any message ───────────────► from a registered route (else only Register), under the name that route
                              registered, may a peer of that role send it (wire/roles.py), does it
                              carry the trainer's MAC where it must (roles.SIGNED), and does it make
                              sense (wire/meaning.py)? else refused, logged, and nothing changes
 Register(name) ────────────► from a new route beyond the rate (roster.Registrations): deferred,
                              unanswered (its session sends it again); its own session's again: nothing;
                              refused while a live session holds that name without showing its proof
                              (roster.claim_problem); a holder whose connection is gone: re-registered
 Register(trainer/publisher) ► refused while another peer holds that role (unless the run waits for
                              a lost trainer); the trainer's key ─► TrainerKey to the publisher
 trainer ─ VersionReady(k) ─► the core (dispatch/core.py): period k's prompts queued, its eval round
                              opened if due; metrics of k-1 ─► metrics.jsonl (rewound first if the
                              trainer resumed from a checkpoint)
 worker  ─ WorkRequest(n) ──► the core: credits += n; what it assigns goes out at once
 trainer ─ Consumed(k, ids) ► the core: consumed; filtered ones may draw more of the period's prompts;
                              closed: its rest stopped ─► StopPeriod(k) to each worker holding some
 worker  ─ EvalResult ──────► the core: answered; a complete round ─► eval.jsonl, samples/
 worker silent > liveness ──► the core: what it held goes back to the front of the queue, reassigned
 an assignment held past the hold (rollout.hold_s) ─► the same for it alone (assignment_expired)
 worker welcomed again ─────► the same, and its credits start from 0
 no worker left, prompts pending for rollout.wait_for_workers_s ─► fail the run naming the lost workers
 trainer ─ RunDone ─────────► (after the final eval round) summary.json, Shutdown to everyone, stop
 the run folder's disk full (a metrics row, an eval round, the summary refused: DiskFull) ─► disk_full,
                              the run fails naming it (the row that met it kept whole: monitor/run_dir.py)
 stop() (SIGUSR2) ──────────► summary.json of the periods recorded, Shutdown(stopped) to everyone, stop;
                              a VersionReady still on its way is logged (version_after_end), not recorded
 trainer or publisher lost ─► trainer.on_loss = "fail": fail the run
                              "wait": trainer_lost_waiting; nothing pending, nothing assigned, until a
                              trainer registers again ─► a fresh Welcome to every worker
                              ─► its VersionReady(k, metrics of k-1) (k from its resume checkpoint):
                              metrics.jsonl rewound to k-1, that row recorded, period k started over
```

The state of the prompts, the eval rounds and the choice of worker are the core's
(`cadence.dispatch.core`); the roster and who may claim what, `cadence.dispatch.roster`. This actor is
the loop around them: it checks each message (`dispatch/checks.py`), hands it to its type's handler
(`HANDLERS`), sends what the core decided, and keeps time (liveness, lost peers).

Invariant: every message type the dispatcher may take (`AUTHORISED["dispatcher"]`) has a handler, and
a message is acted on only by its handler, after its checks; a prompt of period k is held by at most
one live worker until the trainer reports it consumed (the core's ledger).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import structlog

from cadence.dispatch.checks import message_problem
from cadence.dispatch.core import DispatchCore, Hold, Worker
from cadence.dispatch.losses import PeerLosses
from cadence.dispatch.period_row import period_row
from cadence.dispatch.roster import (
    Peer,
    Registrations,
    introductions,
    joined,
    same_session,
    trainer_key,
)
from cadence.dispatch.rounds import EvalRounds
from cadence.dispatch.settings import DispatcherSettings
from cadence.monitor.logstream import LogHub
from cadence.monitor.run_dir import DiskFull, RunRecorder
from cadence.tasks.base import Prompt, Task
from cadence.transport.endpoint import Server
from cadence.transport.heartbeat import Liveness
from cadence.transport.session import first_of
from cadence.wire.messages import (
    Consumed,
    EvalResult,
    Heartbeat,
    LogBatch,
    Message,
    Register,
    RunDone,
    Shutdown,
    StopPeriod,
    Subscribe,
    VersionReady,
    Welcome,
    WorkRequest,
)

log = structlog.get_logger()

UNREGISTERED = "its route never registered: a stranger, whatever name it gives"

Handler = Callable[["Dispatcher", bytes, str, Any], None]


class Dispatcher:
    """`liveness`: how often to beat every peer and how long one may be silent before it is lost;
    `eval_set`: the held-out prompts (`cadence.tasks.heldout`), evaluated every `eval_every` versions."""

    HANDLERS: ClassVar[Mapping[type[Message], Handler]]
    """The handler of every message type the dispatcher takes (set below the class)."""

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
        s = settings
        self.settings = s
        rounds = EvalRounds(eval_set, s.eval_every, s.periods, s.eval_samples, s.keep_versions)
        self.core = DispatchCore(
            task,
            s.periods,
            s.prompts_per_period,
            s.group_size,
            rounds,
            extra=s.oversample,
            stream=s.stream,
            max_credits=s.max_credits,
            hold=Hold(s.hold_s, s.hold_floor_s, s.hold_idle_floor_s),
        )
        self.run_done: RunDone | None = None
        self.stopped = False  # its user ended the run before its last period
        self.hub = hub
        self.server = server
        self.recorder = recorder
        self.clock = clock
        self.liveness = liveness
        self.peers: dict[bytes, Peer] = {}
        self.registrations = Registrations(clock=clock)  # new routes' registrations: rate-limited
        server.admission.known = self.peers.__contains__  # only a registered route's large frames
        self.losses = PeerLosses(
            self.peers, self.core, liveness, clock, s.on_trainer_loss == "wait", s.wait_for_workers_s
        )
        self.done = asyncio.Event()
        self.failure: str | None = None
        self._outbox: list[tuple[bytes, Message]] = []

    @property
    def reassigned(self) -> int:
        """Prompts given back to the queue from a worker lost or too slow."""
        return self.losses.reassigned

    @property
    def lost(self) -> list[str]:
        """The workers lost, in order."""
        return self.losses.lost

    # ------------------------------------------------------------------ life

    async def run(self) -> None:
        log.info(
            "dispatcher_started", address=self.server.address, periods=self.settings.periods, B=self.core.B
        )
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
            except DiskFull as exc:  # what the run must keep cannot be: it ends, saying so
                self._disk_full(exc)
            except Exception as exc:  # one peer's message must not end the run
                log.error(
                    "message_failed", peer=env.sender, type=env.message.TAG, error=repr(exc), exc_info=True
                )

    async def _take(self, peer: bytes, sender: str, msg: Message) -> None:
        """Handle one message: log traffic to the hub, anything else through `handle`."""
        if isinstance(msg, LogBatch | Subscribe) and self.hub is not None:
            if isinstance(msg, LogBatch):
                await self._log_batch(self.hub, peer, sender, msg)
            else:
                await self.hub.subscribe(peer, sender, msg)
            return
        self.handle(peer, sender, msg)
        await self._flush()

    async def _log_batch(self, hub: LogHub, peer: bytes, sender: str, msg: LogBatch) -> None:
        """A registered peer's own log lines to the hub; anyone else's refused."""
        known = self.peers.get(peer)
        role = known.role if known is not None else "stranger"
        problem = message_problem(
            self.peers, peer, sender, role, msg, self.settings, self.core, self.server.reachable
        )
        if problem is not None:
            self.server.refuse(sender, role, msg, problem)
            return
        self.liveness.seen(sender)
        await hub.batch(msg)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.liveness.interval_s)
            self._fail(self.losses.lose_silent())
            self._fail(self.losses.check_workers())
            if self.losses.expire():
                self._assign()
            for peer in list(self.peers):
                await self.server.send(peer, Heartbeat("dispatcher"))
            await self._flush()
            if self.hub is not None:
                await self.hub.tick()

    # ------------------------------------------------------------------ messages

    def handle(self, peer: bytes, sender: str, msg: Message) -> None:
        """Check one message, then act on it by its type's handler; replies are queued in
        `self._outbox` and sent by `_flush`."""
        known = peer in self.peers
        if not known and not isinstance(msg, Register):  # a route that never registered: a stranger's
            log.warning("message_from_unregistered_peer", peer=sender, type=msg.TAG, reason=UNREGISTERED)
            if sender in self.lost:  # declared dead, then woke up: it must not work on unseen
                self._outbox.append((peer, Shutdown(f"{sender} was declared lost; start it again to rejoin")))
            return
        if not known and not self.registrations.take():  # more at once than it takes: it asks again
            log.warning("registration_deferred", peer=sender, deferred=self.registrations.deferred,
                        per_s=self.registrations.per_s)  # fmt: skip
            return
        role = self.peers[peer].role if known else "stranger"
        handler = self.HANDLERS.get(type(msg))
        if handler is None:
            problem: str | None = f"the dispatcher has no handler for {msg.TAG}"
        else:
            problem = message_problem(
                self.peers, peer, sender, role, msg, self.settings, self.core, self.server.reachable
            )
        if problem is not None:
            self.server.refuse(sender, role, msg, problem)
            if not known:  # a refused claim: the claimant stops, told why
                self._outbox.append((peer, Shutdown(f"registration refused: {problem}", refused=True)))
            return
        assert handler is not None
        self.liveness.seen(sender)
        handler(self, peer, sender, msg)
        self._finish()
        self._assign()

    def _on_heartbeat(self, peer: bytes, sender: str, msg: Heartbeat) -> None:
        """Its liveness is all (`handle` noted it)."""

    def _on_work_request(self, peer: bytes, sender: str, msg: WorkRequest) -> None:
        self.core.credit(peer, msg.credits)

    def _on_consumed(self, peer: bytes, sender: str, msg: Consumed) -> None:
        held = self.core.consume(msg.period, msg.prompt_ids, msg.filtered, msg.closed, self.clock())
        for route in held:  # a worker still holding some of the closed period's prompts
            if route in self.peers:
                self._outbox.append((route, StopPeriod(msg.period)))

    def _on_run_done(self, peer: bytes, sender: str, msg: RunDone) -> None:
        log.info("run_done", version=msg.version, sha256=msg.sha256, checkpoint=msg.checkpoint)
        self.run_done = msg
        self.core.rounds.close_before(msg.version)

    def _on_log_traffic(self, peer: bytes, sender: str, msg: LogBatch | Subscribe) -> None:
        """Log traffic reaches `handle` only where no log hub runs."""
        log.warning(
            "unexpected_message", peer=sender, type=msg.TAG, reason="this dispatcher keeps no log hub"
        )

    def stop(self) -> None:
        """End the run now, cleanly (`cadence slurm stop`): the summary of the periods recorded so far
        (`final_version`: the last one announced; no final weights), and every peer told to stop."""
        if self.done.is_set():
            return
        log.warning("run_stopped", period=self.core.period, published=self.core.published)
        self.stopped = True
        try:
            self.recorder.finish(self.clock(), self.core.published, "", stopped=True)
        except DiskFull as exc:
            self._disk_full(exc)
        self.done.set()

    def _disk_full(self, exc: DiskFull) -> None:
        """The run folder's disk is full: the run fails, naming it."""
        log.error("disk_full", error=str(exc))
        self._fail(str(exc))

    def _fail(self, failure: str | None) -> None:
        """The run ends with `failure` (None: it goes on); the first failure is the one it names."""
        if failure is not None:
            self.failure = self.failure or failure
            self.done.set()

    def _finish(self) -> None:
        """End the run once the trainer is done and the final eval round (if any) is recorded."""
        msg = self.run_done
        if msg is None or self.done.is_set() or self.core.rounds.open:
            return
        self.recorder.finish(self.clock(), msg.version, msg.sha256)
        self.done.set()

    # ------------------------------------------------------------------ evaluation

    def _on_eval_result(self, peer: bytes, sender: str, msg: EvalResult) -> None:
        done = self.core.answer(msg, self.clock())
        if done is not None:
            self.recorder.evaluation(*done)

    # ------------------------------------------------------------------ roster

    def _on_register(self, peer: bytes, sender: str, msg: Register) -> None:
        now = self.peers.get(peer)
        if now is not None and now.name == sender and same_session(now, msg):
            return  # its registration again, sent before it heard the dispatcher: it is registered
        for name in {p.name for k, p in self.peers.items() if k == peer or p.name == sender}:
            self._lost(name, 0.0, reason="re-registered")  # its session again, or its process restarted
            self.liveness.seen(sender)
        if msg.role in ("trainer", "publisher") and self.settings.on_trainer_loss == "wait":
            for old in [p.name for p in self.peers.values() if p.role == msg.role]:
                self._lost(old, 0.0, reason=f"replaced by {sender}")
                self.liveness.seen(sender)
        self.peers[peer] = joined(sender, msg)

    def _on_version_ready(self, peer: bytes, sender: str, msg: VersionReady) -> None:
        # a period's row replaces any earlier row of it and of the periods after it: a trainer that
        # resumed from its checkpoint starts over there (its first version carries the row before)
        if self.done.is_set():  # the summary is written (a stop): nothing is recorded after it
            log.warning("version_after_end", version=msg.version, reason="the run has ended; not recorded")
            return
        self.peers[peer].announced = msg.version
        row = period_row(msg.metrics, self.peers, self.reassigned, self.core.ledger)
        dropped = self.recorder.rewind(msg.version - 1 if msg.metrics else msg.version)
        if dropped:
            log.info("metrics_rewound", version=msg.version, dropped=dropped)
        if row is not None:
            self.recorder.period(row)
        self.core.announce(msg.version, self.clock())

    def _lost(self, name: str, silent_s: float, reason: str = "silent") -> None:
        self._fail(self.losses.lose(name, silent_s, reason))

    # ------------------------------------------------------------------ sending

    def _assign(self) -> None:
        """Tell the publisher the trainer's key, welcome new workers, and send what the core assigns."""
        for peer, msg in introductions(self.peers, max(self.core.period, 0)):
            if isinstance(msg, Welcome):  # it drops what it held and asks for work afresh
                self.core.restart(peer)
            self._outbox.append((peer, msg))
        key = trainer_key(self.peers)
        workers = [Worker(k, p.name) for k, p in self.peers.items() if p.role == "rollout" and p.welcomed]
        self._outbox.extend(self.core.assign(workers, key, self.clock()))

    async def _flush(self) -> None:
        outbox, self._outbox = self._outbox, []
        for peer, msg in outbox:
            await self.server.send(peer, msg)


Dispatcher.HANDLERS = {
    Register: Dispatcher._on_register,
    Heartbeat: Dispatcher._on_heartbeat,
    WorkRequest: Dispatcher._on_work_request,
    Consumed: Dispatcher._on_consumed,
    VersionReady: Dispatcher._on_version_ready,
    EvalResult: Dispatcher._on_eval_result,
    RunDone: Dispatcher._on_run_done,
    LogBatch: Dispatcher._on_log_traffic,
    Subscribe: Dispatcher._on_log_traffic,
}
