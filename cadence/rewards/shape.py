"""Rewards for the shape of a response rather than its content: a required format, a length budget.

Invariant: `format` is 1.0 or 0.0 and only a finished response can earn it; `length` is never positive.
"""

from __future__ import annotations

import re

from cadence.rewards.base import Sample, reward


@reward("format")
def format_reward(sample: Sample) -> float:
    """1.0 when the response finished and contains `rewards.format_pattern` (e.g. a `\\boxed{}`)."""
    found = re.search(sample.settings.format_pattern, sample.response, re.DOTALL) is not None
    return 1.0 if found and sample.finished else 0.0


@reward("length")
def length_reward(sample: Sample) -> float:
    """Minus `rewards.length_penalty` per character beyond `rewards.length_limit` (0 limit: off)."""
    limit = sample.settings.length_limit
    if limit <= 0:
        return 0.0
    return -sample.settings.length_penalty * max(0, len(sample.response) - limit)
