"""What a task is: a deterministic prompt stream and a scorer of responses.

Invariant: `prompts(period, count)` depends only on (task config, run seed, period), and prompt ids
are unique across the run (`period * count + index`), so any actor can regenerate any period.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class Prompt:
    prompt_id: int
    text: str
    answer: str


@dataclass(frozen=True)
class Score:
    reward: float  # in 0..1
    correct: float  # 1.0 when the answer is right
    parts: dict[str, float] = field(default_factory=dict)  # each reward function's value, by name


class Task(Protocol):
    alphabet: str

    def prompts(self, period: int, count: int) -> list[Prompt]: ...

    def score(self, prompt: str, response: str, answer: str, finished: bool) -> Score: ...
