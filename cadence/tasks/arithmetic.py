"""The arithmetic task for checkpoints with a real tokenizer: add two numbers, answer with the sum.

Prompts read ``What is 23 + 58? Answer with the number only.`` A response is well formed when it
finished and its text, stripped, is one integer; it is correct when that integer is the sum.
Invariant: reward = format_weight * well_formed + (1 - format_weight) * correct, in 0..1.
"""

from __future__ import annotations

import random
import re

from cadence.config import TaskConfig
from cadence.tasks.base import Prompt, Score

_INTEGER = re.compile(r"[+-]?\d+")


class ArithmeticTask:
    alphabet = "0123456789+-=?. WAabcdefghijklmnopqrstuvwxyz"

    def __init__(self, cfg: TaskConfig, seed: int) -> None:
        self.cfg = cfg
        self.seed = seed

    def prompts(self, period: int, count: int) -> list[Prompt]:
        rng = random.Random(f"arithmetic/{self.seed}/{period}")
        out = []
        for index in range(count):
            a, b = rng.randint(0, self.cfg.max_operand), rng.randint(0, self.cfg.max_operand)
            text = f"What is {a} + {b}? Answer with the number only."
            out.append(Prompt(period * count + index, text, str(a + b)))
        return out

    def score(self, prompt: str, response: str, answer: str, finished: bool) -> Score:
        text = response.strip()
        well_formed = finished and _INTEGER.fullmatch(text) is not None
        correct = well_formed and int(text) == int(answer)
        w = self.cfg.format_weight
        return Score(reward=w * well_formed + (1.0 - w) * correct, correct=float(correct))
