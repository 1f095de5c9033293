"""Held-out evaluation's figures: of an eval round at the dispatcher (`cadence.dispatch.rounds`), and
of `cadence eval`, both with `eval_figures` (and, for episodes, `eval_episodes`).

Invariant: the figures depend only on each prompt's rewards and correctness values, not on the order
they came in; `eval_pass_at_k` is the unbiased estimator 1 - C(n - c, k) / C(n, k) averaged over the
prompts (n samples, c of them correct); with n = k it is the share of prompts with a correct sample.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from cadence.monitor.episode_figures import episode_metrics
from cadence.wire.messages import EpisodeFigures


def pass_at_k(n: int, c: int, k: int) -> float:
    """The chance that k of n samples, c of them correct, drawn without replacement hold a correct one."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def eval_figures(groups: Sequence[tuple[Sequence[float], Sequence[float]]], k: int) -> dict[str, Any]:
    """`eval_reward` and `eval_accuracy` (means over every sample), `eval_pass_at_k` (mean over the
    prompts) of (rewards, correct) a prompt, with the counts they come from."""
    if not groups:
        raise ValueError("an eval round needs at least one prompt")
    rewards = [r for group, _ in groups for r in group]
    correct = [c for _, group in groups for c in group]
    passes = [pass_at_k(len(c), sum(1 for v in c if v >= 1.0), k) for _, c in groups]
    return {
        "eval_reward": sum(rewards) / len(rewards),
        "eval_accuracy": sum(correct) / len(correct),
        "eval_pass_at_k": sum(passes) / len(passes),
        "eval_k": k,
        "eval_prompts": len(groups),
        "eval_samples": len(rewards),
    }


def eval_episodes(groups: Sequence[EpisodeFigures | None]) -> dict[str, Any]:
    """The episode figures of the eval groups, as a period row has them (`monitor/episode_figures.py`: turns
    an episode, and over all episodes tool calls, tool errors, environment timeouts, seconds and tokens,
    `ended_<ending>` counts), each key prefixed `eval_`; {} for single-turn groups."""
    figures = episode_metrics(groups)
    endings = figures.pop("endings", {})
    figures |= {f"ended_{ending}": count for ending, count in endings.items()}
    return {f"eval_{key}": value for key, value in figures.items()}
