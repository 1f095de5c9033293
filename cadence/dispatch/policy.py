"""Which worker gets how many of the queued prompts: a pure function of the workers' credits.

A policy takes the credits of the workers that may get work (in roster order) and the number of
prompts queued, and returns how many each of them gets, never more than its credits and never more
than are queued in all. A new policy (a worker's measured speed, a small batch for a slow worker at
a period's tail) is a function of this shape, tested on numbers alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Policy(Protocol):
    def __call__(self, credits: Sequence[int], queued: int) -> list[int]: ...


def most_credits_first(credits: Sequence[int], queued: int) -> list[int]:
    """One prompt at a time to the worker with the most credits left (the first of equals): work goes
    where the most is asked for, and evens out between workers that asked for as much."""
    left = list(credits)
    given = [0] * len(left)
    for _ in range(queued):
        best = max(range(len(left)), key=lambda i: left[i], default=None)
        if best is None or left[best] <= 0:
            break
        left[best] -= 1
        given[best] += 1
    return given
