"""Groups that join a single-turn call while it decodes: continuous batching across a worker's
assignments.

```
 event loop: offer(batch) ─► offers (in order) ─► engine thread, between two decode steps:
                                                  take(room) ─► the front batches whose prompts fit
                                                                `room`, whole, in order ─► taken
 the call returns ─► close() ─► the batches never taken, in order (the worker's next batch)
```

Invariant: batches are taken whole and in the order they were offered, so the groups taken are a
prefix of those offered, and the call's group `n + j` (after its own `n`) is `taken[j]`; once closed,
nothing more is taken, and every batch offered is either taken or returned by `close`, once.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from cadence.model.tokenizer import TextTokenizer
from cadence.tasks.base import Prompt

T = TypeVar("T")


@dataclass(frozen=True)
class Joined(Generic[T]):
    """A group offered to a running call: what the offerer knows it by, its prompt, its seeds and the
    prompt's ids."""

    tag: T
    prompt: Prompt
    seeds: list[int]
    ids: list[int]


class Joining(Generic[T]):
    """Batches offered to one running call (`single_turn.complete`), taken by its engine."""

    def __init__(self, tokenizer: TextTokenizer) -> None:
        self.tokenizer = tokenizer
        self.taken: list[Joined[T]] = []
        self._offers: deque[list[Joined[T]]] = deque()
        self._closed = False
        self._lock = threading.Lock()

    def offer(self, batch: Sequence[tuple[T, Prompt, list[int]]]) -> bool:
        """Offer a batch of (tag, prompt, seeds) to join together; False once the call has returned
        (then it is not offered)."""
        joined = [Joined(tag, p, seeds, self.tokenizer.encode_prompt(p.text)) for tag, p, seeds in batch]
        with self._lock:
            if self._closed:
                return False
            self._offers.append(joined)
            return True

    def take(self, room: int) -> list[tuple[list[int], list[int]]]:
        """(On the engine's thread.) The front batches whose every prompt has at most `room` tokens,
        as (prompt ids, seeds) groups, now joined to the call."""
        out: list[tuple[list[int], list[int]]] = []
        with self._lock:
            while self._offers and not self._closed and all(len(j.ids) <= room for j in self._offers[0]):
                batch = self._offers.popleft()
                self.taken += batch
                out += [(j.ids, j.seeds) for j in batch]
        return out

    def close(self) -> list[list[Joined[T]]]:
        """The call has returned: nothing more joins it. The batches offered and never taken."""
        with self._lock:
            self._closed = True
            left = list(self._offers)
            self._offers.clear()
        return left
