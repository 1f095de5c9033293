"""Guess the number: the model guesses, the environment says higher or lower, until it is found.

The game (the range 1..N, N one of `RANGES`, and the number) is drawn from the prompt (its id and
text), not from the sample seed, so every sample of a group plays the same game and GRPO compares
them on one problem; the prompt's own text is not shown. A turn's guess is the last whole number in
it; a turn without one is told to give one. Each answered turn's reward is 1.0 when its guess was
still possible given the feedback so far (inside the range, above every "higher", below every
"lower"), else 0.0. The score: solved 1.0 or 0.0 (`parts["solved"]`, `correct`), the reward
0.9**(turns - 1) when solved (fewer turns, more reward), else 0.

Invariant: the same prompt gives the same game and the same replies to the same turns.
"""

from __future__ import annotations

import random
import re

from cadence.tasks.base import Prompt, Score
from cadence.tasks.environments.base import Environment, Reply, Transcript

RANGES = (10, 20, 50, 100)
_INTEGER = re.compile(r"-?\d+")


class GuessNumber(Environment):
    name = "guess_number"

    def __init__(self, prompt: Prompt, seed: int) -> None:
        rng = random.Random(f"guess_number/{prompt.prompt_id}/{prompt.text}")
        self.high = rng.choice(RANGES)
        self.number = rng.randint(1, self.high)
        self.seed = seed
        self.low_bound, self.high_bound = 1, self.high  # what the feedback so far allows
        self.solved = False

    async def start(self) -> str:
        return (
            f"I am thinking of a whole number from 1 to {self.high}. Guess it: answer with one number"
            " a turn, and I will tell you whether mine is higher or lower."
        )

    async def step(self, response: str) -> Reply:
        found = _INTEGER.findall(response)
        if not found:
            return Reply("Answer with one whole number.", reward=0.0)
        guess = int(found[-1]) if len(found[-1]) <= 6 else self.high + 1
        possible = float(self.low_bound <= guess <= self.high_bound)
        if guess == self.number:
            self.solved = True
            return Reply("Correct!", done=True, reward=possible)
        if guess < self.number:
            self.low_bound = max(self.low_bound, guess + 1)
            return Reply("Higher.", reward=possible)
        self.high_bound = min(self.high_bound, guess - 1)
        return Reply("Lower.", reward=possible)

    async def score(self, transcript: Transcript) -> Score:
        solved = float(self.solved)
        turns = max(1, len(transcript.responses))
        return Score(reward=solved * 0.9 ** (turns - 1), correct=solved, parts={"solved": solved})
