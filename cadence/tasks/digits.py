"""The built-in digits task: a few digits in, one digit out, scored for format and correctness.

Prompts look like ``3+5=`` (rule `sum`, answer the sum mod 10), ``35=`` (rule `copy`: the last
digit; rule `max`: the largest). A well-formed response is one digit and then end of sequence.
Invariant: reward = format_weight * well_formed + (1 - format_weight) * quality, in 0..1, where
quality is 1 for the right digit and, with `reward = "distance"`, 1 - |digit - answer| / 9 for a
wrong one (0 with `"exact"`); a correct response is always well formed.
"""

from __future__ import annotations

import random

from cadence.config import TaskConfig
from cadence.tasks.base import Prompt, Score


class DigitsTask:
    alphabet = "0123456789+="

    def __init__(self, cfg: TaskConfig, seed: int) -> None:
        if cfg.digits < 1:
            raise ValueError(f"task.digits must be >= 1, got {cfg.digits}")
        self.cfg = cfg
        self.seed = seed

    def prompts(self, period: int, count: int) -> list[Prompt]:
        rng = random.Random(f"digits/{self.seed}/{period}")
        out = []
        for index in range(count):
            digits = [rng.randrange(10) for _ in range(self.cfg.digits)]
            out.append(Prompt(period * count + index, self._text(digits), self._answer(digits)))
        return out

    def score(self, prompt: str, response: str, answer: str, finished: bool) -> Score:
        well_formed = finished and len(response) == 1 and response in "0123456789"
        correct = well_formed and response == answer
        if self.cfg.reward == "exact" or not well_formed:
            quality = float(correct)
        else:
            quality = 1.0 - abs(int(response) - int(answer)) / 9.0
        w = self.cfg.format_weight
        return Score(reward=w * well_formed + (1.0 - w) * quality, correct=float(correct))

    def _text(self, digits: list[int]) -> str:
        joiner = "+" if self.cfg.rule == "sum" else ""
        return joiner.join(map(str, digits)) + ("=" if self.cfg.rule == "sum" else "")

    def _answer(self, digits: list[int]) -> str:
        if self.cfg.rule == "sum":
            return str(sum(digits) % 10)
        if self.cfg.rule == "copy":
            return str(digits[-1])
        return str(max(digits))
