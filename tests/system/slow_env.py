"""An environment whose every step waits `STEP_S` (a tool that takes its time), loaded by a run as
`environment.name = 'tests.system.slow_env:Slow'`: its episodes last until `environment.max_turns`."""

from __future__ import annotations

import asyncio

from cadence.tasks.base import Prompt, Score
from cadence.tasks.environments.base import Environment, Reply, Transcript

STEP_S = 0.1


class Slow(Environment):
    name = "slow"

    def __init__(self, prompt: Prompt, seed: int) -> None:
        self.prompt = prompt

    async def start(self) -> str:
        return self.prompt.text

    async def step(self, response: str) -> Reply:
        await asyncio.sleep(STEP_S)
        return Reply("Again.", tool_calls=1)

    async def score(self, transcript: Transcript) -> Score:
        return Score(reward=0.0, correct=0.0)
