"""The scorer a rollout worker uses: the task's own reward, or a weighted sum of named reward functions.

With `rewards.weights` empty, a response scores exactly as its task scores it. Otherwise
reward = sum(weight * fn(sample)) over the named functions, each function's raw value is reported in
`parts` by name, and `correct` still comes from the task.
Invariant: every name is resolved when the scorer is made, so an unknown name fails the run at start,
never in the middle of a period.
"""

from __future__ import annotations

import inspect

from cadence.config import ConfigError, RunConfig
from cadence.rewards.base import RewardFn, Sample, get_reward, load_modules, registered
from cadence.tasks.base import Score, Task


class Scorer:
    def __init__(self, task: Task, cfg: RunConfig, functions: dict[str, tuple[float, RewardFn]]) -> None:
        self.task = task
        self.settings = cfg.rewards
        self.functions = functions  # name -> (weight, function); empty: the task's own reward

    async def score(self, prompt: str, response: str, answer: str, finished: bool) -> Score:
        own = self.task.score(prompt, response, answer, finished)
        if not self.functions:
            return Score(reward=own.reward, correct=own.correct, parts={"task": own.reward})
        sample = Sample(prompt, response, answer, finished, self.settings)
        parts: dict[str, float] = {}
        total = 0.0
        for name, (weight, fn) in self.functions.items():
            value = fn(sample)
            if inspect.isawaitable(value):
                value = await value
            parts[name] = float(value)
            total += weight * parts[name]
        return Score(reward=total, correct=own.correct, parts=parts)


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
