"""Calls into an environment, each under a timeout, a failure contained to its episode.

```
 create / start() / step(text) / score(t) / close()   on the episode's own loop (`episode_loop.py`)
   │ wait_for(step_timeout_s, or the time left to the episode if less: start and step only)
   ├─ value      ─► Called(value)
   ├─ timed out  ─► environment_timed_out(environment, prompt_id, stage, timeout_s); Called(timed_out,
   │                past_deadline when the episode's own time ran out)
   └─ raised     ─► environment_failed(environment, prompt_id, stage, why, traceback); Called(failed)
```

Invariant: every call's time is added to the episode's `env_seconds` and every cut call to its
`timeouts`; nothing an environment raises (an `Exception`) leaves `call`. The wait is bounded on the
caller's loop whatever the environment does on its own; a timeout then cancels the call's coroutine
there, which stops code that awaits, not code that blocks (it runs on in the episode's thread).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import structlog

from cadence.tasks.environments.episode_record import Episode

log = structlog.get_logger()

T = TypeVar("T")


class Waits(Protocol):
    """Where the time of every environment call is counted (a worker's `monitor.span.Overlapping`)."""

    def inside(self) -> AbstractContextManager[None]: ...


@dataclass(frozen=True)
class Called(Generic[T]):
    value: T | None = None
    timed_out: bool = False
    past_deadline: bool = False  # timed out because the episode's own time ran out
    failed: bool = False  # raised (logged with its traceback)


async def call(
    episode: Episode,
    stage: str,
    make: Callable[[], Awaitable[T]],
    timeout_s: float,
    clock: Callable[[], float],
    within_episode: bool = True,
    waits: Waits | None = None,
) -> Called[T]:
    """`await make()` on the episode's loop within `timeout_s` (and, `within_episode`, the episode's
    time left), timed in `waits`."""
    limit = min(timeout_s, episode.deadline - clock()) if within_episode else timeout_s
    if limit <= 0:
        episode.timeouts += 1
        _timed_out(episode, stage, 0.0)
        return Called(timed_out=True, past_deadline=True)
    started = clock()
    loop = episode.loop
    try:
        with waits.inside() if waits is not None else nullcontext():
            value = await asyncio.wait_for(loop.run(make) if loop is not None else make(), limit)
    except TimeoutError:
        episode.timeouts += 1
        _timed_out(episode, stage, limit)
        return Called(timed_out=True, past_deadline=limit < timeout_s)
    except Exception as exc:
        failed(episode, stage, f"{type(exc).__name__}: {exc}", exc_info=True)
        return Called(failed=True)
    finally:
        episode.env_seconds += clock() - started
    return Called(value)


def failed(episode: Episode, stage: str, why: str, exc_info: bool = False) -> None:
    """Log an environment's failure (call it inside the `except` to log the traceback)."""
    log.warning(
        "environment_failed",
        **_which(episode),
        stage=stage,
        turn=episode.model_turns,
        why=why,
        exc_info=exc_info,
    )


def _timed_out(episode: Episode, stage: str, timeout_s: float) -> None:
    log.warning(
        "environment_timed_out",
        **_which(episode),
        stage=stage,
        turn=episode.model_turns,
        timeout_s=round(timeout_s, 3),
    )


def timeout_message(timeout_s: float) -> str:
    """What the model reads in place of a step's answer that did not come in time."""
    return f"[tool timed out after {timeout_s:.1f} s]"


def no_room(episode: Episode, ending: str, max_tokens: int, max_context: int) -> None:
    """Log an episode that ends before the model's first turn: its opening leaves no room to sample
    (raise `model.max_position`, or shorten the opening)."""
    log.warning(
        "episode_without_room",
        **_which(episode),
        ending=ending,
        opening_tokens=len(episode.prompt_tokens),
        max_tokens=max_tokens,
        max_context=max_context,
    )


class WallTime:
    """The seconds of wall clock in which at least one environment call of a batch runs (the union of
    the calls' spans: eight episodes waiting 15 s at once are 15 s here, 120 s of the episodes'
    `env_seconds`), each call also counted in `also` (a worker's spans)."""

    def __init__(self, clock: Callable[[], float], also: Waits | None = None) -> None:
        self.clock = clock
        self.also = also
        self.seconds = 0.0
        self.running = 0
        self.since = 0.0

    @contextmanager
    def inside(self) -> Iterator[None]:
        if self.running == 0:
            self.since = self.clock()
        self.running += 1
        try:
            with self.also.inside() if self.also is not None else nullcontext():
                yield
        finally:
            self.running -= 1
            if self.running == 0:
                self.seconds += self.clock() - self.since


def truncated(episode: Episode, chars: list[int], limit: int) -> None:
    """Warn of a reply whose texts were cut at `max_message_chars` (the model reads the marker)."""
    log.warning(
        "environment_message_truncated", **_which(episode), turn=episode.model_turns, chars=chars, kept=limit
    )


def over_budget(episode: Episode, tokens: int, room: int) -> None:
    """Warn of a message that was not appended: it would leave no room for the model's next token."""
    log.warning(
        "environment_message_over_budget",
        **_which(episode),
        turn=episode.model_turns,
        tokens=tokens,
        room=room,
    )


def _which(episode: Episode) -> dict[str, object]:
    """What names an episode in its log lines: the environment, the prompt and the sample seed."""
    return {"environment": episode.name, "prompt_id": episode.prompt.prompt_id, "seed": episode.seed}
