"""The rollout worker: pulls work by credit, loads the version each assignment names, generates,
scores, and pushes every finished group to the trainer at once.

```
 Register ─► Welcome(trainer, publisher) ─► WorkRequest(inflight)
 Assignment(k, v) ─► queue ─► v loaded? else pull v from publisher, verify, load
                            ─► G samples seeded by (seed, k, prompt id, i) ─► score
                            ─► GroupResult ─► trainer ; WorkRequest(1) ─► dispatcher
```

Invariant: a group is generated entirely with the weights of the version its assignment names,
verified by checksum; an assignment of a period older than the newest one seen is skipped.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable
from typing import Protocol

import structlog

from cadence.actors.base import first_of, keep_alive
from cadence.config import RunConfig
from cadence.messages import Assignment, GroupResult, Heartbeat, Register, Shutdown, Welcome, WorkRequest
from cadence.model.engine import Completion, sample_seed
from cadence.model.tokenizer import TextTokenizer
from cadence.samples import is_sampled
from cadence.tasks.base import Score
from cadence.transport.endpoint import Client
from cadence.transport.heartbeat import Liveness
from cadence.transport.weights import pull_weights

log = structlog.get_logger()


class Scorer(Protocol):
    async def score(self, prompt: str, response: str, answer: str, finished: bool) -> Score: ...


class RolloutEngine(Protocol):
    def load(self, weights: bytes) -> None: ...

    def generate(self, prompt: list[int], seeds: list[int]) -> list[Completion]: ...


class RolloutWorker:
    def __init__(
        self,
        cfg: RunConfig,
        name: str,
        dispatcher: Client,
        connect: Callable[[str, str], Client],
        engine: RolloutEngine,
        scorer: Scorer,
        tokenizer: TextTokenizer,
        clock: Callable[[], float],
    ) -> None:
        self.cfg = cfg
        self.name = name
        self.dispatcher = dispatcher
        self.connect = connect
        self.engine = engine
        self.scorer = scorer
        self.tokenizer = tokenizer
        self.clock = clock
        self.liveness = Liveness(cfg.transport.heartbeat_s, cfg.transport.liveness, clock)
        self.queue: asyncio.Queue[Assignment] = asyncio.Queue()
        self.welcome: asyncio.Future[Welcome] = asyncio.get_running_loop().create_future()
        self.newest_period = -1
        self.loaded: int | None = None
        self.groups_sent = 0

    async def run(self) -> None:
        await self.dispatcher.send(Register("rollout", "", os.getpid(), socket.gethostname()))
        self.liveness.seen("dispatcher")
        await first_of(self._work(), self._listen(), keep_alive(self.dispatcher, "rollout", self.liveness))
        log.info("worker_stopped", groups_sent=self.groups_sent)

    async def _listen(self) -> None:
        while True:
            env = await self.dispatcher.recv()
            self.liveness.seen("dispatcher")
            msg = env.message
            if isinstance(msg, Assignment):
                self.newest_period = max(self.newest_period, msg.period)
                self.queue.put_nowait(msg)
            elif isinstance(msg, Welcome) and not self.welcome.done():
                self.welcome.set_result(msg)
            elif isinstance(msg, Shutdown):
                log.info("shutdown", reason=msg.reason)
                return
            elif not isinstance(msg, Heartbeat | Welcome):
                log.warning("unexpected_message", peer=env.sender, type=msg.TAG)

    async def _work(self) -> None:
        welcome = await self.welcome
        trainer = self.connect(self.name, welcome.trainer_address)
        publisher = self.connect(self.name, welcome.publisher_address)
        log.info("worker_ready", trainer=welcome.trainer_address, publisher=welcome.publisher_address)
        try:
            await self.dispatcher.send(WorkRequest(self.cfg.rollout.inflight))
            while True:
                job = await self.queue.get()
                if job.period < self.newest_period:
                    log.info("assignment_skipped", period=job.period, prompt_id=job.prompt_id)
                else:
                    await trainer.send(await self._rollout(job, publisher))
                    self.groups_sent += 1
                await self.dispatcher.send(WorkRequest(1))
        finally:
            trainer.close()
            publisher.close()

    async def _rollout(self, job: Assignment, publisher: Client) -> GroupResult:
        load_s = 0.0
        if job.version != self.loaded:
            begin = self.clock()
            data = await pull_weights(publisher, job.version, self.liveness.timeout_s)
            await asyncio.to_thread(self.engine.load, data)
            self.loaded = job.version
            end = self.clock()
            load_s = end - begin
            log.info("weights_loaded", version=job.version, nbytes=len(data), load_s=round(load_s, 4))
            log.debug("span", kind="load", start=begin, end=end, period=job.period, version=job.version)
        begin = self.clock()
        prompt = self.tokenizer.encode_prompt(job.prompt)
        seeds = [sample_seed(self.cfg.seed, job.period, job.prompt_id, i) for i in range(job.group_size)]
        completions = await asyncio.to_thread(self.engine.generate, prompt, seeds)
        texts = [self.tokenizer.decode_response(c.tokens) for c in completions]
        scores = [
            await self.scorer.score(job.prompt, text, job.answer, c.finished)
            for text, c in zip(texts, completions, strict=True)
        ]
        keep = is_sampled(self.cfg.seed, job.prompt_id, self.cfg.monitor.samples_fraction)
        end = self.clock()
        log.debug("span", kind="generate", start=begin, end=end, period=job.period, prompt_id=job.prompt_id)
        return GroupResult(
            period=job.period,
            version=job.version,
            prompt_id=job.prompt_id,
            prompt_tokens=prompt,
            completions=[c.tokens for c in completions],
            logprobs=[c.logprobs for c in completions],
            rewards=[s.reward for s in scores],
            correct=[s.correct for s in scores],
            gen_s=end - begin,
            load_s=load_s,
            finished_at=end,
            reward_parts={name: [s.parts.get(name, 0.0) for s in scores] for name in scores[0].parts},
            prompt=job.prompt if keep else "",
            answer=job.answer if keep else "",
            responses=texts if keep else [],
        )
