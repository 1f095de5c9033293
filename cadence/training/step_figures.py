"""An optimizer step's figures from the sums its micro-batches (and ranks) added up.

Invariant: a figure is a function of the step's sums alone, so neither the micro-batch split nor the
ranks change it beyond float summation order: sums of the loss are divided by the step's normaliser
(as the gradient was), means are over the tokens they count, and the gap between the engine's and the
learner's log-probs keeps its extremes and its counts (ops/mismatch.py), so a period can weigh its
steps.
"""

from __future__ import annotations

from collections.abc import Mapping

from cadence.ops.mismatch import EXTREMES, SUM_KEYS, mismatch_figures

PER_TOKEN = ("tokens", "entropy_sum", "entropy_tokens", "computed_tokens")
CORRECTION = ("correction_weight_sum", "correction_zeroed")


def summarise(sums: Mapping[str, float], normaliser: float) -> dict[str, float]:
    """A step's statistics from its micro-batches' sums: the loss and the other sums divided by the
    normaliser (as the gradient was), and means over the trained tokens (`tokens`: the sampled ones,
    never an environment's): `clip_fraction` (tokens whose clip is active) and, with a reference, `kl`
    (k3); `entropy` (of the tempered policy) over the sampled tokens computed (a sample with advantage
    0 is not, ops/distinct.py); `computed_tokens`: the packed tokens the step's forwards and backwards
    took, environment tokens included; `loss_tokens`: the sampled tokens that reached a loss term (a
    skipped sample's do not); `mismatch_*` (ops/mismatch.py) and, with a rollout correction,
    `correction_weight` (its mean weight) and `correction_zeroed` (the share of tokens it masked) over
    the computed tokens."""
    apart = PER_TOKEN + SUM_KEYS + EXTREMES + CORRECTION
    info = {k: round(v / normaliser, 6) for k, v in sums.items() if k not in apart}
    if "computed_tokens" in sums:
        info["computed_tokens"] = sums["computed_tokens"]
    if "entropy_tokens" in sums:  # the sampled tokens of the computed samples, each by its count
        info["loss_tokens"] = sums["entropy_tokens"]
    tokens = sums.get("tokens", 0.0)
    computed = sums.get("entropy_tokens", 0.0)
    if computed > 0:
        info["entropy"] = round(sums.get("entropy_sum", 0.0) / computed, 6)
        if "correction_weight_sum" in sums:
            info["correction_weight"] = sums["correction_weight_sum"] / computed
            info["correction_zeroed"] = sums["correction_zeroed"] / computed
    if tokens > 0 and "clipped_tokens" in sums:
        info["clip_fraction"] = round(sums["clipped_tokens"] / tokens, 6)
        if "kl_sum" in sums:
            info["kl"] = round(sums["kl_sum"] / tokens, 6)
    return info | mismatch_figures(sums)
