"""The trainer: accepts only groups of the current version, accumulates, one optimizer step a period.

```
 session (transport/session.py): Register (with the key of the assignment tickets), heartbeats;
   Shutdown before RunDone ─► the run failed
 GroupResult without the ticket of its (period, id, worker), or meaningless (wire/meaning.py) ─► refused
   (a frame over 64 KiB: its ticket read first, the rest decoded only with it; transport/admission.py)
 (--resume: load checkpoints/resume, k = its version)
 publish version k ─► VersionReady(k) ─► period k:
   GroupResult ─► (period, id) seen before?  duplicates_dropped
              ─► version != k?              stale_dropped (a closed period's late group: the same)
              ─► accept ─► resolved at once, even while a micro-batch trains, by the period's
                           Selection (training/selection.py: filters, order)
                           ─► Consumed(k, id, filtered ids, closed)
                 kept ─► periodic: to the period's training task: forward/backward (summed loss),
                                   packed with the kept groups queued meanwhile (token budget)
                         sync: hold until the period closes, then the same
                 filtered ─► counted, written to the samples with its reason, never trained
   B kept (or every prompt the period may issue resolved: a short period, stepped with what it kept)
         ─► closed ─► grads /= normaliser ─► clip ─► step ─► publish k+1 (on the trainer's GPU
              first where it can: announced before its host bytes are in) ─► (the engine-learner gap
              above trainer.mismatch.warn_kl: mismatch_high, throttled) ─► every N periods: resume
              checkpoint of k+1 (with the metrics of k) ─► VersionReady(k+1, metrics)
 checkpoint asked with "stop" (cadence slurm stop) ─► that checkpoint, VersionReady(k+1), no period
              more: wait for Shutdown
 last period ─► final checkpoint ─► RunDone ─► wait for Shutdown
```

Invariant: each (period, prompt id) enters the gradient at most once, only with weights of the
period's version, and only once a filter has kept it; every period ends in exactly
`trainer.steps_per_period` optimizer steps (one by default), each after B / steps kept groups, save a
period short of B kept groups (`sampling.ceiling` reached), whose last step takes what it kept and
which takes none when it kept none; the new version is published after the last. The version rule lives here
and nowhere else. The loss is the learner's side's (`cadence.training.steps.Steps`): each step's
normaliser and its learning rate (step j of period k at the rate of the run's step k x steps + j, so a
resumed run continues the schedule exactly) are fixed there, not here; the micro-batches that feed
them, and the threads each computation takes, are `MicroBatches`' (`actors/trainer_batches.py`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import structlog

from cadence.actors.trainer_batches import MicroBatches
from cadence.actors.trainer_stage import VersionStaging
from cadence.monitor.metrics import PeriodStats
from cadence.monitor.mismatch import MismatchWatch
from cadence.monitor.samples import SampleWriter, sample_record
from cadence.monitor.span import span
from cadence.training.learner import Learner
from cadence.training.resume import (
    RunRecord,
    checkpoint_asked,
    clear_checkpoint_ask,
    load_resume,
    save_resume,
    stop_asked,
)
from cadence.training.selection import Selection
from cadence.training.steps import Steps
from cadence.training.trainer_settings import TrainerSettings
from cadence.transport.endpoint import Server
from cadence.transport.session import Session
from cadence.wire.buffer import Buffer
from cadence.wire.meaning import group_problem
from cadence.wire.messages import (
    Consumed,
    Envelope,
    GroupResult,
    Message,
    Peek,
    RunDone,
    Shutdown,
    VersionReady,
)
from cadence.wire.roles import valid_ticket

log = structlog.get_logger()

Publish = Callable[[int, bytes | Buffer], Awaitable[str]]
PublishEarly = Callable[[int], Awaitable[int | None]]


class Trainer:
    """`session`: with the dispatcher, registered as "trainer" at `server`'s address; `run`: what each
    resume checkpoint records of the run and a resume is checked against;
    `use_threads(n)`, `computing(busy)`: `MicroBatches`' (threads: settings' `threads` and
    `threads_alone`); `alloc(nbytes)`: the buffer a version is serialised into (a pool's `take`);
    `held(version)`: whether a worker on this host still holds a version (`trainer_stage.py`);
    `early(version)`: publish it on the trainer's GPU first (the publisher's `publish_on_device`)."""

    CHECKS: ClassVar[Mapping[type[Message], Callable[[Trainer, str, Any], tuple[str, str] | None]]]
    """The check of every message type its server takes: the problem, with the role the sender
    proved, or None (set below the class); what passes goes to the period loop."""
    SESSION_HANDLERS: ClassVar[Mapping[type[Message], Callable[[Trainer, Any], None]]]
    """What it takes from the dispatcher on its session, beside `Session.TAKES`."""

    def __init__(
        self,
        settings: TrainerSettings,
        server: Server,
        session: Session,
        learner: Learner,
        publish: Publish,
        clock: Callable[[], float],
        checkpoint_dir: Path,
        run: RunRecord,
        samples: SampleWriter | None = None,
        resume: bool = False,
        use_threads: Callable[[int], None] | None = None,
        alloc: Callable[[int], Buffer] = bytearray,
        computing: Callable[[bool], None] | None = None,
        held: Callable[[int], bool] | None = None,
        early: PublishEarly | None = None,
    ) -> None:
        self.settings = settings
        self.early = early
        self.alloc = alloc
        self.samples = samples
        self.resume = resume
        self.server = server
        self.session = session
        self.learner = learner
        self.steps = Steps(learner, settings.steps)
        self.batches = MicroBatches(settings, self.steps, clock, use_threads, computing)
        self.mismatch = MismatchWatch(settings.mismatch_warn_kl)
        self.publish = publish
        self.clock = clock
        self.checkpoint_dir = checkpoint_dir
        self.run_record = run
        self.consumed: dict[int, set[int]] = {}
        self.version_bytes = 0  # of the last version published
        self.stage = VersionStaging(learner, self.batches.compute, alloc, settings.publish_dtype, clock, held)
        self.arrivals: asyncio.Queue[tuple[float, Envelope]] = asyncio.Queue()
        self.finished = asyncio.Event()
        self.stopped = asyncio.Event()
        for kind, handler in self.SESSION_HANDLERS.items():
            session.on(kind, functools.partial(handler, self))
        server.admission.proves = self._proves  # a large frame is decoded only with its ticket

    def _proves(self, route: bytes, seen: Peek) -> str | None:
        """Why a large frame, of which only `seen` is read, may not be decoded: only a group that shows
        the ticket of its assignment to its sender is."""
        if seen.tag != GroupResult.TAG:
            return f"a stranger may not send {seen.tag} to the trainer"
        p = seen.proof
        if not valid_ticket(self.session.key, p.ticket, "assignment", p.period, p.prompt_id, seen.sender):
            return f"no assignment of prompt {p.prompt_id} of period {p.period} to {seen.sender}"
        return None

    async def run(self) -> None:
        first, row = await self._resume() if self.resume else (0, {})
        await self.session.run(self._periods(first, row), self._receive())

    def _stop(self, msg: Shutdown) -> None:
        self.stopped.set()
        if msg.stopped:  # its user ended the run: the last resume checkpoint is where it goes on from
            log.info("run_stopped", reason=msg.reason)
            return
        if not self.finished.is_set():
            raise RuntimeError(f"dispatcher stopped the run: {msg.reason}")

    async def _receive(self) -> None:
        """Take every frame off the socket as it comes, stamped with its arrival time, even mid-training;
        only groups a rollout worker was assigned, and that make sense, are kept."""
        while True:
            _, env = await self.server.recv()
            problem = self._problem(env)
            if problem is None:
                self.arrivals.put_nowait((self.clock(), env))
            else:
                role = "rollout" if problem[0] == "rollout" else "stranger"
                self.server.refuse(env.sender, role, env.message, problem[1])

    def _problem(self, env: Envelope) -> tuple[str, str] | None:
        """Why the trainer may not take `env`, with the role its sender proved, or None: a group must show
        the dispatcher's ticket for its (period, prompt id) and its sender (`cadence.wire.roles`)."""
        msg = env.message
        check = self.CHECKS.get(type(msg))
        if check is None:
            return "stranger", f"a stranger may not send {msg.TAG} to the trainer"
        return check(self, env.sender, msg)

    def _group_problem(self, sender: str, msg: GroupResult) -> tuple[str, str] | None:
        if not valid_ticket(self.session.key, msg.ticket, "assignment", msg.period, msg.prompt_id, sender):
            return "stranger", f"no assignment of prompt {msg.prompt_id} of period {msg.period} to {sender}"
        problem = group_problem(msg, self.settings.bounds)
        return None if problem is None else ("rollout", problem)

    async def _periods(self, first: int, row: dict[str, Any]) -> None:
        """`row`: a resumed run's metrics of the period before `first`, kept in its checkpoint."""
        start, digest, nbytes = await self._publish(first)
        await self.session.send(VersionReady(first, digest, nbytes, row))
        for period in range(first, self.settings.periods):
            stats = PeriodStats(period, start, oversampled=self.settings.sampling.stream > 0)
            await self._period(period, stats)
            publish_start = self.clock()
            end, digest, nbytes = await self._publish(period + 1)
            metrics = dataclasses.replace(
                stats.finish(end, end - publish_start),
                version_bytes=nbytes,
                trainable_params=self.settings.trainable_params,
            )
            log.info(
                "period_done",
                period=period,
                reward=round(metrics.reward_mean, 4),
                period_s=round(metrics.period_s, 3),
                overlap_s=round(metrics.overlap_s, 3),
                stale_dropped=metrics.stale_dropped,
                duplicates_dropped=metrics.duplicates_dropped,
            )
            row = metrics.to_row()
            self.mismatch.check(period, row)
            halt = await self._checkpoint(period + 1, row)
            await self.session.send(VersionReady(period + 1, digest, nbytes, row))
            if halt and period + 1 < self.settings.periods:  # the run ends here: its summary, this version
                log.info("trainer_halted", version=period + 1, reason="asked to stop after this checkpoint")
                await self.stopped.wait()
                return
            start = end
        final = self.checkpoint_dir / "final"
        sha = await self.batches.compute(self.learner.save, final)
        log.info("checkpoint_saved", path=str(final), version=self.settings.periods, sha256=sha)
        self.finished.set()
        await self.session.send(RunDone(self.settings.periods, sha, str(final)))
        try:
            await asyncio.wait_for(self.stopped.wait(), 10 * self.session.liveness.timeout_s)
        except TimeoutError:
            log.warning("no_shutdown_from_dispatcher")

    async def _resume(self) -> tuple[int, dict[str, Any]]:
        """Load the resume checkpoint: the version (= period) to continue from, and the metrics of the
        period before it."""
        begin = self.clock()
        state = await asyncio.to_thread(load_resume, self.checkpoint_dir, self.learner, self.run_record)
        version = int(state["version"])
        if self.samples is not None:
            self.samples.drop_from(version)
        log.info(
            "resumed", version=version, path=str(self.checkpoint_dir), load_s=round(self.clock() - begin, 3)
        )
        return version, dict(state.get("metrics", {}))

    async def _checkpoint(self, version: int, metrics: dict[str, Any]) -> bool:
        """Every `trainer.checkpoint_every` periods (and after the last), after the optimizer step and
        before version `version` is announced: the resume checkpoint of `version`, with the metrics of
        the period just done (a kill may come before the dispatcher has recorded them). True when it
        was asked for with the run to stop there (`cadence slurm stop`)."""
        every = self.settings.checkpoint_every
        asked = checkpoint_asked(self.checkpoint_dir)  # cadence slurm, before a time limit
        halt = asked and stop_asked(self.checkpoint_dir)
        if not asked and (every <= 0 or (version % every and version != self.settings.periods)):
            return False
        with span(self.clock, "checkpoint", period=version - 1, version=version) as saving:
            path = await asyncio.to_thread(
                save_resume, self.checkpoint_dir, self.learner, version, self.run_record, metrics
            )
        log.info("resume_checkpoint_saved", path=str(path), version=version, save_s=round(saving.duration, 3))
        if asked:
            clear_checkpoint_ask(self.checkpoint_dir)  # the answer
        return halt

    async def _period(self, period: int, stats: PeriodStats) -> None:
        """Resolve the period's groups as they arrive, whatever is training meanwhile (so a period
        closes, and its rest is stopped, the moment its B-th kept group is in); the kept ones are
        trained by a task of their own (periodic), or once the period is closed (sync)."""
        self.consumed.setdefault(period, set())
        self.consumed.pop(period - 3, None)
        self.batches.open(alone=self.settings.mode == "sync")
        await self.stage(period, lambda: not self.arrivals.empty(), self.version_bytes)  # once workers load
        selection = self.settings.selection(period)
        kept: asyncio.Queue[GroupResult | None] = asyncio.Queue()
        training = None
        if self.settings.mode == "periodic":
            training = asyncio.create_task(self._train_kept(kept, stats))
        try:
            while not selection.closed:
                arrived, env = await self._next_arrival(training)
                msg = self._accept(period, env, stats)
                if msg is not None:
                    await self._resolve(selection, arrived, env.sender, msg, stats, kept)
            self._closed(selection, stats)
            kept.put_nowait(None)
            if training is not None:
                await training
        finally:
            if training is not None and not training.done():
                training.cancel()
        if training is None:  # sync: every kept group now
            while (group := kept.get_nowait()) is not None:
                await self.batches.add(group, stats, flush=False)
        await self.batches.flush(stats, last=True)

    async def _next_arrival(self, training: asyncio.Task[None] | None) -> tuple[float, Envelope]:
        """The next arrival; the training task's failure, should it end first."""
        if training is None:
            return await self.arrivals.get()
        getter = asyncio.ensure_future(self.arrivals.get())
        done, _ = await asyncio.wait({getter, training}, return_when=asyncio.FIRST_COMPLETED)
        if getter in done:
            return getter.result()
        getter.cancel()
        training.result()  # its exception, if it raised
        raise RuntimeError("the period's training ended before the period closed")

    async def _resolve(
        self,
        selection: Selection,
        arrived: float,
        sender: str,
        msg: GroupResult,
        stats: PeriodStats,
        kept: asyncio.Queue[GroupResult | None],
    ) -> None:
        """An accepted group: consumed, then resolved with whatever it settles (`Selection.arrive`):
        a filtered one counted and written, a kept one queued for training."""
        self.consumed[msg.period].add(msg.prompt_id)
        stats.arrived(arrived, sender, msg, kept=False)
        verdicts = selection.arrive(msg)
        filtered = [group.prompt_id for group, reason in verdicts if reason is not None]
        await self.session.send(
            Consumed(msg.period, [msg.prompt_id], filtered=filtered, closed=selection.closed)
        )
        for group, reason in verdicts:
            if self.samples is not None and group.responses:
                self.samples.write(group.period, sample_record(group, filtered=reason))
            if reason is None:
                stats.kept(arrived, group)
                kept.put_nowait(group)
            else:
                stats.filtered_out(group, reason)
                log.info("group_filtered", period=group.period, prompt_id=group.prompt_id, reason=reason)

    def _closed(self, selection: Selection, stats: PeriodStats) -> None:
        """The period is closed: what arrived after its B-th kept group (prompt order) is stopped."""
        for group in selection.held():
            stats.stopped_after_close(group)
            if self.samples is not None and group.responses:
                self.samples.write(group.period, sample_record(group, filtered="stopped"))
        if selection.short:
            log.warning(
                "period_short",
                period=selection.period,
                kept=selection.kept,
                batch=selection.batch,
                filtered=dict(selection.filtered),
                issued_at_most=selection.stream,
            )

    async def _train_kept(self, kept: asyncio.Queue[GroupResult | None], stats: PeriodStats) -> None:
        """Periodic: train each kept group as it comes, together with whatever else is queued meanwhile
        (up to the budget) and the rest of the worker's batch that ended with it, sent right behind."""
        while (group := await kept.get()) is not None:
            await self.batches.add(group, stats, flush=kept.empty() and group.following == 0)

    def _accept(self, period: int, env: Envelope, stats: PeriodStats) -> GroupResult | None:
        """The version rule: a group of this period's version, never seen before, or None."""
        msg = env.message
        if not isinstance(msg, GroupResult):
            log.warning("unexpected_message", peer=env.sender, type=msg.TAG)
            return None
        if msg.prompt_id in self.consumed.get(msg.period, ()):
            stats.duplicates_dropped += 1
            log.info("duplicate_dropped", peer=env.sender, period=msg.period, prompt_id=msg.prompt_id)
            return None
        if self.settings.sampling.stream and msg.period < period and msg.version == msg.period:
            # a group of a period closed with its B kept groups, sent before its worker heard
            log.info("closed_period_dropped", peer=env.sender, period=msg.period, prompt_id=msg.prompt_id)
            return None
        if msg.version != period or msg.period != period:
            stats.stale_dropped += 1
            log.warning("stale_dropped", peer=env.sender, version=msg.version, current=period)
            return None
        return msg

    async def _publish(self, version: int) -> tuple[float, str, int]:
        """`version` on the trainer's GPU first where `early` can (no digest yet), else serialised."""
        with span(self.clock, "publish", period=version - 1, version=version) as publishing:
            nbytes = None if self.early is None else await self.early(version)
            version_digest = ""
            if nbytes is None:
                data = await self.batches.compute(
                    self.learner.weights, self.alloc, self.settings.publish_dtype
                )
                version_digest, nbytes = await self.publish(version, data), len(data)
        self.version_bytes = nbytes
        log.info("version_published", version=version, nbytes=nbytes, digest=version_digest)
        return publishing.end, version_digest, nbytes


Trainer.CHECKS = {GroupResult: Trainer._group_problem}
Trainer.SESSION_HANDLERS = {Shutdown: Trainer._stop}
