"""The scorer a rollout worker uses: the task's own reward, or a weighted sum of named reward functions.

With `rewards.weights` empty, a response scores exactly as its task scores it. Otherwise
reward = sum(weight * fn(sample)) over the named functions, each function's raw value is reported in
`parts` by name, and `correct` still comes from the task.

```
 sync function  ─► a thread of the scorer's pool ┐ each within rewards.timeout_s; the event loop (and
 async function ─► awaited on the event loop     ┘ so the worker's heartbeats) never waits on one
 raised, timed out or not finite ─► reward_function_failed(function, prompt_id, why); the part is
                                    rewards.on_error
```

Invariant: every name is resolved when the scorer is made, so an unknown name fails the run at start,
never in the middle of a period; every part of a score is a finite float, whatever a function does.
Sync functions run on daemon threads of the scorer's own (one more starts when all are busy, up to
32); one past its deadline keeps its thread until it returns (Python cannot stop a thread), which
never keeps the process from exiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import math
import queue
import threading
from collections.abc import Callable
from typing import Any

import structlog

from cadence.config import ConfigError, RunConfig
from cadence.rewards.base import RewardFn, Sample, get_reward, load_modules, registered
from cadence.tasks.base import Score, Task

log = structlog.get_logger()


class Scorer:
    def __init__(self, task: Task, cfg: RunConfig, functions: dict[str, tuple[float, RewardFn]]) -> None:
        self.task = task
        self.settings = cfg.rewards
        self.functions = functions  # name -> (weight, function); empty: the task's own reward
        self._threads = _Threads()

    async def score(
        self, prompt: str, response: str, answer: str, finished: bool, prompt_id: int = -1
    ) -> Score:
        own = self._own(prompt, response, answer, finished, prompt_id)
        if not self.functions:
            return Score(reward=own.reward, correct=own.correct, parts={"task": own.reward})
        sample = Sample(prompt, response, answer, finished, self.settings)
        parts: dict[str, float] = {}
        total = 0.0
        for name, (weight, fn) in self.functions.items():
            parts[name] = await self._part(name, fn, sample, prompt_id)
            total += weight * parts[name]
        return Score(reward=total, correct=own.correct, parts=parts)

    def _own(self, prompt: str, response: str, answer: str, finished: bool, prompt_id: int) -> Score:
        """The task's own score (a reasoning-gym checker is third-party code), guarded as a function's."""
        try:
            own = self.task.score(prompt, response, answer, finished)
        except Exception as exc:
            value = self._failed("task", prompt_id, f"{type(exc).__name__}: {exc}", exc_info=True)
            return Score(reward=value, correct=0.0)
        if not math.isfinite(own.reward):
            value = self._failed("task", prompt_id, f"returned {own.reward}, not a finite value")
            return Score(reward=value, correct=own.correct)
        return own

    async def _part(self, name: str, fn: RewardFn, sample: Sample, prompt_id: int) -> float:
        """`fn`'s value for `sample`, or `rewards.on_error` (logged) when it fails."""
        timeout = self.settings.timeout_s
        try:
            value = await asyncio.wait_for(self._call(fn, sample), timeout)
            result = float(value)
        except TimeoutError:
            return self._failed(name, prompt_id, f"no value within rewards.timeout_s = {timeout:g}s")
        except Exception as exc:
            return self._failed(name, prompt_id, f"{type(exc).__name__}: {exc}", exc_info=True)
        if not math.isfinite(result):
            return self._failed(name, prompt_id, f"returned {result}, not a finite value")
        return result

    async def _call(self, fn: RewardFn, sample: Sample) -> Any:
        if inspect.iscoroutinefunction(fn):
            return await fn(sample)
        value = await self._threads.submit(fn, sample)
        if inspect.isawaitable(value):  # a sync function that hands back an awaitable
            value = await value
        return value

    def _failed(self, name: str, prompt_id: int, why: str, exc_info: bool = False) -> float:
        log.warning(
            "reward_function_failed",
            function=name,
            prompt_id=prompt_id,
            why=why,
            reward=self.settings.on_error,
            exc_info=exc_info,
        )
        return self.settings.on_error


class _Threads:
    """Daemon threads that call sync reward functions; a new one starts when every one is busy (a
    hung function holds its thread), up to `limit`, after which calls wait (and time out) in line."""

    def __init__(self, limit: int = 32) -> None:
        self.limit = limit
        self.calls: queue.SimpleQueue[tuple[Callable[[], Any], Callable[[Any, BaseException | None], None]]]
        self.calls = queue.SimpleQueue()
        self.threads = 0
        self.busy = 0
        self.lock = threading.Lock()

    def submit(self, fn: RewardFn, sample: Sample) -> asyncio.Future[Any]:
        """`fn(sample)` on one of the threads; a future of its value on the running loop."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()

        def settle(value: Any, error: BaseException | None) -> None:
            if future.done():  # given up on (timed out or cancelled)
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(value)

        def reply(value: Any, error: BaseException | None) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(settle, value, error)

        with self.lock:
            self.busy += 1
            if self.busy > self.threads and self.threads < self.limit:
                self.threads += 1
                threading.Thread(target=self._serve, name="reward", daemon=True).start()
        self.calls.put((lambda: fn(sample), reply))
        return future

    def _serve(self) -> None:
        while True:
            call, reply = self.calls.get()
            try:
                value, error = call(), None
            except Exception as exc:
                value, error = None, exc
            with self.lock:
                self.busy -= 1
            reply(value, error)


def make_scorer(cfg: RunConfig, task: Task) -> Scorer:
    """A scorer for `task` under `cfg.rewards`; unknown reward names raise `ConfigError` naming them."""
    if not cfg.rewards.weights:
        return Scorer(task, cfg, {})
    load_modules(cfg.rewards.modules)
    functions: dict[str, tuple[float, RewardFn]] = {}
    for name, weight in cfg.rewards.weights.items():
        try:
            functions[name] = (weight, get_reward(name))
        except KeyError:
            raise ConfigError(
                f"rewards.weights: no reward function {name!r}; registered: {', '.join(registered())}"
                " (add a module that registers it to rewards.modules)"
            ) from None
    return Scorer(task, cfg, functions)
