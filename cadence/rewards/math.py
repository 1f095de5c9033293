"""The `math` reward: 1 when a response's final answer equals the reference (`tasks/answers.py`)."""

from __future__ import annotations

from cadence.rewards.base import Sample, reward
from cadence.tasks.answers import is_correct


@reward("math")
def math_reward(sample: Sample) -> float:
    """1.0 when the response's final answer equals the reference, else 0.0."""
    return 1.0 if is_correct(sample.response, sample.answer) else 0.0
