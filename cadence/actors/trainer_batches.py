"""The trainer's micro-batches: kept groups packed up to the token budget, trained, and stepped.

```
 add(group) ─► over the token budget with it? ─► what is held is trained first
            ─► held ─► trained now if nothing else waits (`flush`, in arrival order only) or the
                       step's share of groups is in
 train ─► one packed forward and backward of the held groups (summed loss: Steps.train)
       ─► B / steps_per_period groups trained since the last step (or the period closed: `last`)
          ─► Steps.step: normalise, clip, step ─► the step's figures to the period's stats
 compute(fn) ─► fn in a worker thread with `threads`, or `threads_alone` once no worker generates;
               `computing(True)` before it, `computing(False)` after (the workers on this host
               size their threads by it)
```

Invariant: a kept group is trained once, in the micro-batch it was added to; a micro-batch is over the
token budget only when it is one group; a step follows every B / steps_per_period groups trained, and
a closed period short of B kept groups steps with those trained since its last step (none: no step).
In prompt order (`sampling.order`) nothing that depends on timing cuts a micro-batch: periodic mode
trains the micro-batches of sync mode, and a run its own every time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

import structlog

from cadence.monitor.metrics import PeriodStats
from cadence.monitor.span import span
from cadence.training.steps import Steps, group_tokens
from cadence.training.trainer_settings import TrainerSettings
from cadence.wire.messages import GroupResult

log = structlog.get_logger()

T = TypeVar("T")


class MicroBatches:
    """`steps`: the period's optimizer steps (the learner's side); `use_threads(n)`: make the calling
    thread compute with n threads, called in the worker thread before each computation;
    `computing(busy)`: told True as each computation begins and False as it ends."""

    def __init__(
        self,
        settings: TrainerSettings,
        steps: Steps,
        clock: Callable[[], float],
        use_threads: Callable[[int], None] | None = None,
        computing: Callable[[bool], None] | None = None,
    ) -> None:
        self.settings = settings
        self.steps = steps
        self.clock = clock
        self.use_threads = use_threads
        self.computing = computing
        if computing is not None:
            computing(False)  # nothing computed yet: the workers beside it may take its cores
        self.alone = True  # no worker generates while this one computes (between periods, in sync)
        self.trained = 0  # groups of the current period trained so far
        self.micro: list[GroupResult] = []  # accepted groups not yet trained
        self.micro_tokens = 0

    def open(self, alone: bool) -> None:
        """A period begins, none of its groups trained; `alone`: no worker generates meanwhile (sync)."""
        self.alone = alone
        self.trained = 0

    async def add(self, msg: GroupResult, stats: PeriodStats, flush: bool) -> None:
        """Put a group in the micro-batch: trained when the token budget or the optimizer step's
        share of groups would be exceeded, or when `flush` (nothing else is waiting: a fact of timing,
        heeded in arrival order only)."""
        budget = self.settings.micro_batch_tokens
        size = group_tokens(msg)
        if self.micro and (budget == 0 or self.micro_tokens + size > budget):
            await self.flush(stats)
        self.micro.append(msg)
        self.micro_tokens += size
        idle = flush and self.settings.sampling.order == "arrival"
        if idle or self.steps.groups + len(self.micro) >= self.settings.groups_per_step:
            await self.flush(stats)

    async def flush(self, stats: PeriodStats, last: bool = False) -> None:
        """Train the micro-batch (one packed forward and backward, summed loss); after every
        B / steps_per_period groups, normalise and step. `last`: the period is closed: a period short
        of B kept groups steps with those trained since its last step (none: no step)."""
        if self.micro:
            micro, self.micro, self.micro_tokens = self.micro, [], 0
            # the period's last micro-batch comes after its last group: no worker has anything left to
            # generate. Decided by the micro-batch, not by the moment the last group arrived, so that a
            # run's arithmetic (threads included) does not depend on timing
            self.trained += len(micro)
            self.alone = self.alone or last or self.trained == self.settings.prompts_per_period
            with span(self.clock, "train", period=stats.period, groups=len(micro)) as training:
                await self.compute(self.steps.train, micro)
            stats.spans.append((training.start, training.end))
        if self.steps.groups == 0 or (self.steps.groups < self.settings.groups_per_step and not last):
            return
        with span(self.clock, "step", period=stats.period) as stepping:
            normaliser, info = await self.compute(self.steps.step, stats.period, len(stats.steps))
        stats.step_s += stepping.duration
        stats.stepped(info)
        log.info("optimizer_step", period=stats.period, normaliser=normaliser, **info)

    async def compute(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` in a worker thread, with the thread budget of the moment: `threads` while
        workers generate, `threads_alone` from the period's last micro-batch on (and in sync mode)."""
        threads = self.settings.threads_alone if self.alone else self.settings.threads

        def run() -> T:
            if self.use_threads is not None and threads > 0:
                self.use_threads(threads)
            if self.computing is None:
                return fn(*args)
            self.computing(True)
            try:
                return fn(*args)
            finally:
                self.computing(False)

        return await asyncio.to_thread(run)
