"""The rollout worker: pulls work by credit, loads the version each assignment names, generates,
scores, and pushes every finished group to the trainer at once.

```
 session (transport/session.py): Register, heartbeats, until the dispatcher's Shutdown
 Welcome(trainer, publisher) ─► WorkRequest(inflight)
 a later Welcome (the trainer came back) ─► drop queued and current jobs, reconnect, WorkRequest(inflight)
 broadcast weights.transport: BroadcastJoin ─► publisher; its plans received beside the jobs
 Assignment(k, v, batch=m) ─► queue ─► the m sent together (same v) ─► v loaded? else v broadcast to
                            this worker? load it : pull v, verify, load
                            ─► G samples of each prompt seeded by (seed, k, prompt id, i), all m
                               prompts decoded together ─► each group, as soon as its own G samples
                               have ended: scored ─► GroupResult ─► trainer
                            ─► WorkRequest(m) ─► dispatcher once the batch is done; on an
                               engine that joins (the built-in one), WorkRequest(1) as each group
                               leaves, and the batches of v that come meanwhile join the call
                               (rollout.join)
 StopPeriod(k) ────────────► period k closed: its queued assignments skipped, the batch of k being
                            generated dropped between two decode steps (nothing of it sent)
 Assignment(eval, v)  ─────► the same at the eval temperature (0: greedy) ─► m EvalResults ─► dispatcher
 with environment.name: the G x m samples are episodes (rollout/play.py), run together turn by
   turn with version v held (no load until all end) ─► scored by the environment ─► each group: its
   prompt, the ids after it with their masks (0: the environment's) and figures; environment calls: spans
```

The groups themselves are made by the `GroupMaker` it is given (`cadence/rollout/`), which `cadence
eval` uses too: the worker keeps the session, the queue of assignments and the weights (the version
loaded, fetched and held: `WorkerWeights`, `actors/rollout_weights.py`).

Invariant: a group is generated entirely with the weights of the version its assignment names,
verified by checksum, every turn of every episode too; an assignment of a period older than the
newest one seen, or of a stopped period, is skipped (an eval assignment is not: its round may outlive
its period); nothing of a stopped period is sent once the StopPeriod is in; an eval answer never goes
to the trainer.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import msgspec
import structlog

from cadence.actors.rollout_weights import WorkerWeights, pull_address
from cadence.monitor.samples import is_sampled
from cadence.monitor.span import Overlapping, span
from cadence.rollout.joining import Joining
from cadence.rollout.maker import GroupMaker
from cadence.rollout.results import GroupSamples, eval_result, group_result
from cadence.rollout.single_turn import Ready
from cadence.tasks.base import Prompt
from cadence.transport.broadcast import MEMBER_TAKES
from cadence.transport.buffers import BufferPool
from cadence.transport.endpoint import Client
from cadence.transport.session import Session, first_of
from cadence.transport.weights import PULL_REPLIES, WeightError
from cadence.wire.messages import Assignment, Message, StopPeriod, Welcome, WorkRequest

log = structlog.get_logger()


@dataclass(frozen=True)
class WorkerSettings:
    """What a rollout worker reads of the run's configuration (built by `launch/settings.py`).

    `on_trainer_loss`: "wait" when a lost trainer may come back (so a failing publisher may be
    replaced), "fail" when its loss ends the run. `seed`: which groups are kept as samples (the
    maker has the run's seed for the samples themselves)."""

    seed: int
    inflight: int
    samples_fraction: float
    weights_transport: Literal["zmq", "gloo", "nccl", "hccl"]
    broadcast_timeout_s: float
    on_trainer_loss: Literal["fail", "wait"]
    threads: int = 0  # torch threads of its loads and generation (0: leave the process's count)
    threads_alone: int = 0  # while the trainer waits, where its engine computes alike (0: `threads`)
    trainer_beside: bool = False  # periodic: the trainer may compute meanwhile (its activity says when)
    host: str = ""  # this host's name: a publisher on it is pulled from through its ipc:// address
    share_weights: bool = False  # map the versions a publisher on this host shares (weights.share_on_host)
    join: bool = True  # batches join a running call, a credit back a group (rollout.join; the engine's too)


class RolloutWorker:
    """`session`: with the dispatcher, registered as "rollout"; `connect(name, address)` opens a
    channel to the trainer or publisher a Welcome names; `maker`: makes the groups, on the engine the
    worker loads versions into (`maker.engine`, its `weights`: `actors/rollout_weights.py`); `buffers`:
    where pulled versions are assembled (`WorkerWeights`)."""

    SESSION_HANDLERS: ClassVar[Mapping[type[Message], Callable[[RolloutWorker, Any], None]]]
    """What it takes from the dispatcher on its session, beside `Session.TAKES` (set below the class)."""
    FROM_PUBLISHER: ClassVar[tuple[type[Message], ...]] = PULL_REPLIES + MEMBER_TAKES
    """What it takes from the publisher: the replies of its pulls, and a broadcast member's messages."""

    def __init__(
        self,
        settings: WorkerSettings,
        name: str,
        session: Session,
        connect: Callable[[str, str], Client],
        maker: GroupMaker,
        clock: Callable[[], float],
        use_threads: Callable[[int], None] | None = None,
        buffers: BufferPool | None = None,
    ) -> None:
        self.maker = maker
        self.settings = settings
        self.weights = WorkerWeights(maker.engine, settings, session.liveness, clock, use_threads, buffers)
        self.name = name
        self.session = session
        self.liveness = session.liveness
        self.connect = connect
        self.clock = clock
        self.queue: asyncio.Queue[Assignment] = asyncio.Queue()
        self._held_back: list[Assignment] = []  # taken from the queue for a batch it did not belong to
        self.welcome: Welcome | None = None
        self.rejoin = asyncio.Event()  # set by every Welcome: (re)connect to the trainer and publisher
        self.newest_period = -1
        self.groups_sent = 0
        self.stopped: set[int] = set()  # periods the dispatcher closed (the newest few)
        self._stop_at: dict[int, float] = {}  # when each stop came
        for kind, handler in self.SESSION_HANDLERS.items():
            session.on(kind, functools.partial(handler, self))

    async def run(self) -> None:
        await self.session.run(self._work())
        log.info("worker_stopped", groups_sent=self.groups_sent)

    def _assigned(self, msg: Assignment) -> None:
        if not msg.eval:
            self.newest_period = max(self.newest_period, msg.period)
        self.queue.put_nowait(msg)

    def _stop(self, msg: StopPeriod) -> None:
        """Period `msg.period` is closed: nothing more of it is generated or sent."""
        self.stopped = {p for p in self.stopped if p > msg.period - 4} | {msg.period}
        self._stop_at[msg.period] = self.clock()
        log.info("period_stop_received", period=msg.period)

    def _is_stopped(self, job: Assignment) -> bool:
        return not job.eval and job.period in self.stopped

    def _welcomed(self, msg: Welcome) -> None:
        if self.welcome is not None:  # a new trainer: what was assigned for the old one is void
            dropped = len(self._held_back)
            self._held_back.clear()
            while not self.queue.empty():
                self.queue.get_nowait()
                dropped += 1
            log.info(
                "trainer_changed",
                trainer=msg.trainer_address,
                publisher=msg.publisher_address,
                dropped=dropped,
            )
        self.welcome = msg
        self.newest_period = -1
        self.stopped.clear()  # a resumed trainer may run a stopped period again
        self.rejoin.set()

    async def _work(self) -> None:
        """Serve the trainer and publisher of the latest Welcome; a later Welcome (a trainer that came
        back from its resume checkpoint) ends the job in hand and starts over with the new ones."""
        while True:
            await self.rejoin.wait()
            self.rejoin.clear()
            assert self.welcome is not None
            self.weights.loaded = None
            trainer = self.connect(self.name, self.welcome.trainer_address)
            publisher_address = pull_address(self.welcome, self.settings.host)
            publisher = self.connect(self.name, publisher_address)
            log.info("worker_ready", trainer=self.welcome.trainer_address, publisher=publisher_address)
            loops = [self._jobs(trainer, publisher), self.rejoin.wait()]
            channels = [trainer, publisher]
            self.weights.member = None
            if self.settings.weights_transport != "zmq":
                from cadence.transport.broadcast import BroadcastMember

                member = self.weights.member = BroadcastMember(self.name)
                channels.append(self.connect(f"{self.name}.weights", self.welcome.publisher_address))
                loops.append(member.run(channels[-1]))
            try:
                await first_of(*loops)
            finally:
                for channel in channels:
                    channel.close()

    async def _jobs(self, trainer: Client, publisher: Client) -> None:
        await self.session.send(WorkRequest(self.settings.inflight))
        while True:
            batch = await self._next_batch()
            jobs = self._fresh(batch)
            owed = len(batch)
            if jobs and jobs[0].eval:
                await self._evaluate(jobs, publisher)
            elif jobs:
                owed = await self._train(jobs, publisher, trainer, owed)
            if owed:
                await self.session.send(WorkRequest(owed))

    def _fresh(self, batch: list[Assignment]) -> list[Assignment]:
        """The jobs of `batch` to make: eval ones, and training ones of the newest period seen and not
        stopped; each other one skipped (logged)."""
        fresh = [j for j in batch if j.eval or (j.period >= self.newest_period and not self._is_stopped(j))]
        for job in batch:
            if job not in fresh:
                log.info("assignment_skipped", period=job.period, prompt_id=job.prompt_id)
        return fresh

    async def _next_batch(self) -> list[Assignment]:
        """The next assignment and the others the dispatcher sent with it (`Assignment.batch`), of the
        same version and group size; the batch is what was sent together, whenever the frames came, so
        it does not depend on timing (eval and training assignments never share a batch). One that does
        not belong waits for the next batch."""
        first = self._held_back.pop(0) if self._held_back else await self.queue.get()
        batch = [first]
        while len(batch) < first.batch:
            if self._held_back:
                job = self._held_back.pop(0)
            else:
                try:
                    job = await asyncio.wait_for(self.queue.get(), self.liveness.timeout_s)
                except TimeoutError:
                    log.warning("batch_incomplete", expected=first.batch, got=len(batch), period=first.period)
                    break
            if (job.version, job.group_size, job.eval) != (first.version, first.group_size, first.eval):
                self._held_back.append(job)
                break
            batch.append(job)
        return batch

    async def _evaluate(self, jobs: list[Assignment], publisher: Client) -> None:
        """Answer eval assignments to the dispatcher. Weights that can no longer be had (the round
        outlived the versions the publisher keeps) lose the round, not the worker; weights older than
        the newest period's are not even fetched for an eval (they may be leaving the publisher, and
        the next period's groups wait behind)."""
        if jobs[0].version != self.weights.loaded and jobs[0].version < self.newest_period:
            log.info("eval_skipped", version=jobs[0].version, newest=self.newest_period, prompts=len(jobs))
            return
        try:
            made, gen_s = await self._make(jobs, publisher)
        except WeightError as err:
            log.warning("eval_weights_unavailable", version=jobs[0].version, error=str(err))
            return
        for job, samples in zip(jobs, made, strict=True):
            if samples is not None:
                await self.session.send(eval_result(job, samples, gen_s))

    async def _train(self, jobs: list[Assignment], publisher: Client, trainer: Client, owed: int) -> int:
        """Make the groups of `jobs` and send each to the trainer as soon as its own samples are made
        and scored; a result's `gen_s` is the generation time since the batch's group before it left
        (the batch's groups together: its generation time), `following` the groups of the batch
        already made and sent right behind it. Nothing once the period is stopped.

        With `settings.join`, on an engine that joins (`GroupMaker.joins`), the batches of the same version that come while
        it decodes join the call (`_feed`), and a credit goes back to the dispatcher as each group
        leaves, so that what it sends for it joins too. The credits still owed, of the `owed` the
        batch came with and those of the batches that joined."""
        load_s = await self.weights.ensure(jobs[0], publisher)
        sent: list[float] = []
        owing = [owed]
        joins = self.settings.join and self.maker.joins
        joining: Joining[Assignment] | None = Joining(self.maker.tokenizer) if joins else None

        async def ready(i: int, samples: GroupSamples, following: int) -> None:
            if joining is not None:
                job = jobs[i] if i < len(jobs) else joining.taken[i - len(jobs)].tag
                owing[0] -= 1
                await self.session.send(WorkRequest(1))
            else:
                job = jobs[i]
            if self._is_stopped(job):
                return
            now = self.clock()
            gen_s = now - (sent[-1] if sent else started)
            sent.append(now)
            keep = is_sampled(self.settings.seed, job.prompt_id, self.settings.samples_fraction)
            first = len(sent) == 1
            first_load = load_s if first else 0.0
            source = self.weights.source if first else ""
            result = group_result(job, samples, keep, gen_s, first_load, now, following, source)
            await trainer.send(result)
            self.groups_sent += 1

        started = self.clock()
        joined: list[Assignment] = []  # the jobs of the batches that joined, in the order they did
        feeding = asyncio.ensure_future(self._feed(joining, jobs[0], owing)) if joining else None
        welcome = self.welcome
        try:
            made, _ = await self._make(jobs, publisher, ready, joining)
        finally:
            if feeding is not None and joining is not None:
                joined += await self._joined(feeding, joining, owing, keep=self.welcome is welcome)
        if joined:
            log.info("assignments_joined", period=jobs[0].period, prompt_ids=[j.prompt_id for j in joined])
        dropped = sum(1 for samples in made if samples is None)
        if dropped:
            period = jobs[0].period
            stop_at = self._stop_at.pop(period, started)
            # the generation after the stop came: drawn apart on the timeline
            log.debug("span", kind="stopped", start=max(stop_at, started), end=self.clock(), period=period)
            log.info("groups_stopped", period=period, groups=dropped, sent=len(sent))
        return owing[0]

    async def _joined(
        self, feeding: asyncio.Future[None], joining: Joining[Assignment], owing: list[int], keep: bool
    ) -> list[Assignment]:
        """The call has returned: the feeding stopped, and the jobs that joined it. What was offered
        and not taken is first in line for the next call, each batch of what it offered (its skipped
        jobs owed now) so that the next call's batch is whole; not `keep` (a new trainer welcomed the
        worker meanwhile: what was assigned for the old one is void), it is dropped."""
        feeding.cancel()
        await asyncio.gather(feeding, return_exceptions=True)
        left = [[j.tag for j in batch] for batch in joining.close()]
        if keep:
            self._held_back[:0] = [msgspec.structs.replace(job, batch=len(b)) for b in left for job in b]
        owing[0] -= sum(len(b) for b in left)
        return [j.tag for j in joining.taken]

    async def _feed(self, joining: Joining[Assignment], first: Assignment, owing: list[int]) -> None:
        """While a call of `first`'s version decodes: each whole batch that comes of that version and
        group size offered to `joining` (its stale or stopped jobs skipped), and its credits added to
        `owing`; a batch of anything else ends the feeding, first in line for the next call. Moves
        jobs from the queue to `_held_back` and whole batches off its front only, so that cancelling
        it loses none."""
        key = (first.version, first.group_size, False)
        while True:
            while not self._held_back:
                self._held_back.append(await self.queue.get())
            while not self.queue.empty():
                self._held_back.append(self.queue.get_nowait())
            head = self._held_back[0]
            batch = self._held_back[: head.batch]
            if any((job.version, job.group_size, job.eval) != key for job in batch):
                return
            if len(batch) < head.batch:  # the rest of it is still on its way
                self._held_back.append(await self.queue.get())
                continue
            del self._held_back[: head.batch]
            owing[0] += len(batch)
            fresh = self._fresh(batch)  # training jobs all: `key` says so
            offered = [
                (job, Prompt(job.prompt_id, job.prompt, job.answer), self._seeds(job)) for job in fresh
            ]
            if fresh and not joining.offer(offered):
                self._held_back[:0] = batch  # the call has returned: the next one takes it
                owing[0] -= len(batch)
                return

    def _seeds(self, job: Assignment) -> list[int]:
        return self.maker.seeds(job.period, job.prompt_id, job.group_size)

    async def _make(
        self,
        jobs: list[Assignment],
        publisher: Client,
        ready: Ready | None = None,
        joining: Joining[Assignment] | None = None,
    ) -> tuple[list[GroupSamples | None], float]:
        """The groups of `jobs` (one version), made together with that version loaded and held (none
        loaded until all are made; with episodes, their environment calls timed), each handed to
        `ready` as soon as it is made; a group of a period stopped meanwhile is dropped (None). The
        groups, and each one's share of the generation time."""
        first = jobs[0]
        await self.weights.ensure(first, publisher)
        prompts = [Prompt(job.prompt_id, job.prompt, job.answer) for job in jobs]
        hold = functools.partial(self.weights.turn, first.version)
        waits = None
        if self.maker.episodes is not None:
            waits = Overlapping(self.clock, "environment", period=first.period, eval=first.eval)
        ids = [job.prompt_id for job in jobs]
        self.weights.playing = first.version
        try:
            with span(self.clock, "generate", period=first.period, prompt_ids=ids) as generating:
                made = await self.maker.make(
                    prompts,
                    first.period,
                    first.group_size,
                    first.eval,
                    hold,
                    waits,
                    ready,
                    functools.partial(self._is_stopped, first),
                    joining,
                )
        finally:
            self.weights.playing = None
        return made, generating.duration / len(jobs)


RolloutWorker.SESSION_HANDLERS = {
    Assignment: RolloutWorker._assigned,
    Welcome: RolloutWorker._welcomed,
    StopPeriod: RolloutWorker._stop,
}
