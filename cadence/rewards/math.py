"""The `math` reward: 1 when a response's final answer equals the reference (`tasks/answers.py`); the
`math_verify` reward: the same judged by math-verify (`tasks/verify.py`, an optional extra)."""

from __future__ import annotations

from cadence.rewards.base import Sample, reward
from cadence.tasks.answers import is_correct
from cadence.tasks.verify import math_verify_correct


@reward("math")
def math_reward(sample: Sample) -> float:
    """1.0 when the response's final answer equals the reference, else 0.0."""
    return 1.0 if is_correct(sample.response, sample.answer) else 0.0


@reward("math_verify")
def math_verify_reward(sample: Sample) -> float:
    """1.0 when math-verify finds the response's answer equivalent to the reference, else 0.0."""
    return 1.0 if math_verify_correct(sample.response, sample.answer) else 0.0
