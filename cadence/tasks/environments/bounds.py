"""What caps an episode: turns, tokens, and time, and what a failed environment scores.

Invariant: every episode ends; one past a bound ends there and is scored as it stands (its
environment's `score` sees `Transcript.ended`); one whose environment raised is scored `on_error`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Bounds:
    max_turns: int = 8  # model turns an episode may take
    max_tokens: int = 1024  # tokens after the prompt, the model's and the environment's together
    max_turn_tokens: int = 256  # tokens one model turn may sample
    step_timeout_s: float = 10.0  # one call into the environment (start, step, score); a step past it
    # becomes a message the model reads, a start or score past it an error
    episode_timeout_s: float = 300.0  # wall clock from the episode's first message, generation included
    on_error: float = 0.0  # the reward of an episode whose environment raised
    max_message_chars: int = 4000  # an environment message (each tool result) longer is cut, with a
    # marker the model reads (`truncate`), and logged

    def __post_init__(self) -> None:
        for key in ("max_turns", "max_tokens", "max_turn_tokens", "max_message_chars"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)}")
        for key in ("step_timeout_s", "episode_timeout_s"):
            value = getattr(self, key)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{key} must be finite and positive, got {value}")
        if not math.isfinite(self.on_error):
            raise ValueError(f"on_error must be finite, got {self.on_error}")


def truncate(text: str, limit: int) -> str:
    """`text`, or its first `limit` characters and a marker the model reads saying what was cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n[truncated: {len(text)} characters, the first {limit} shown]"
