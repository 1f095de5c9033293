"""A period's figures of the gap between the engine's log-probs and the learner's (ops/mismatch.py),
from its optimizer steps', and the warning when that gap is large.

Invariant: a period's figure is that of its steps' sums taken together: means weighted by each step's
measured tokens (samples, for the share of samples), extremes over the steps, so a period of several
steps reads as one of a single step over the same tokens. No torch here: the figures are plain floats.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import structlog

log = structlog.get_logger()

WARN_EVERY = 10  # periods between two mismatch_high warnings while the gap stays high


def period_mismatch(steps: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """A period's figures from its steps' (ops/mismatch.py `mismatch_figures`); {} when no step
    measured any token."""
    measured = [s for s in steps if s.get("mismatch_tokens", 0.0) > 0]
    if not measured:
        return {}
    tokens = sum(s["mismatch_tokens"] for s in measured)
    samples = sum(s["mismatch_samples"] for s in measured)

    def by_tokens(key: str) -> float:
        return math.fsum(s[key] * s["mismatch_tokens"] for s in measured) / tokens

    shares = math.fsum(s["mismatch_beyond_sample_share"] * s["mismatch_samples"] for s in measured)
    return {
        "mismatch_kl": by_tokens("mismatch_kl"),
        "mismatch_ratio_mean": by_tokens("mismatch_ratio_mean"),
        "mismatch_ratio_min": min(s["mismatch_ratio_min"] for s in measured),
        "mismatch_ratio_max": max(s["mismatch_ratio_max"] for s in measured),
        "mismatch_beyond_token_share": by_tokens("mismatch_beyond_token_share"),
        "mismatch_beyond_sample_share": shares / samples,
    }


class MismatchWatch:
    """Logs `mismatch_high` for a period whose `mismatch_kl` exceeds `level` (0: never), then stays
    quiet for `WARN_EVERY` periods, however high the gap stays."""

    def __init__(self, level: float) -> None:
        self.level = level
        self.last: int | None = None  # the period last warned about

    def check(self, period: int, row: Mapping[str, object]) -> bool:
        """Whether `period`'s row (`metrics.jsonl`) was warned about."""
        kl = row.get("mismatch_kl")
        if self.level <= 0 or not isinstance(kl, float) or kl <= self.level:
            return False
        if self.last is not None and period - self.last < WARN_EVERY:
            return False
        self.last = period
        log.warning(
            "mismatch_high",
            period=period,
            mismatch_kl=kl,
            warn_kl=self.level,
            ratio_min=row.get("mismatch_ratio_min"),
            ratio_max=row.get("mismatch_ratio_max"),
            beyond_token_share=row.get("mismatch_beyond_token_share"),
        )
        return True
