"""The gap between the engine's log-probs and the learner's on the tokens the engine sampled.

For a sampled token y_t (drawn by the engine from π_engine), with π_learner the policy as the learner
computes it in the forward it trains with:

    ρ_t  = π_learner(y_t) / π_engine(y_t) = exp(log π_learner - log π_engine)
    k3_t = ρ_t - 1 - log ρ_t

k3 is Schulman's estimator of KL(π_engine ‖ π_learner) from the engine's own samples (E[ρ] = 1 under
π_engine): never negative, 0 where the two agree. It is computed in float64 as expm1(d) - d, d = log ρ,
so that a gap at float32 rounding level (d ~ 1e-7) is measured, not rounded away.

Invariant: figures are over the sampled tokens (`mask`: never an environment's, never padding) of the
samples a micro-batch computes, each sample counted `weights[i]` times (ops/distinct.py); the sums add
across micro-batches, steps and ranks with `add_sums` (`*_min` by min, `*_max` by max, the rest by +),
so a period's figures do not depend on how its groups were split.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

SUM_KEYS = (
    "mismatch_tokens",
    "mismatch_k3_sum",
    "mismatch_ratio_sum",
    "mismatch_beyond_tokens",
    "mismatch_samples",
    "mismatch_beyond_samples",
)
EXTREMES = ("mismatch_ratio_min", "mismatch_ratio_max")


def mismatch_sums(
    logp: Tensor, engine: Tensor, mask: Tensor, weights: Tensor | None, bound: float
) -> dict[str, float]:
    """The summed figures of one micro-batch: logp, engine, mask [N, T] (the learner's and the engine's
    log-probs, the sampled tokens that have both), `weights` [N] (each sample's count; None: 1), and a
    ratio outside [1 / bound, bound] counted as beyond. {} when no token is measured. The figures
    leave the device in one transfer."""
    with torch.no_grad():
        m = mask.bool()
        zero = torch.zeros((), dtype=torch.float64, device=m.device)
        d = torch.where(m, logp.detach().double() - engine.to(m.device, torch.float64), zero)
        ratio = d.exp()
        counts = torch.ones(m.shape[0]) if weights is None else weights
        w = counts.to(m.device, torch.float64).unsqueeze(-1) * m  # each token its sample's count
        beyond = m & ((ratio > bound) | (ratio < 1.0 / bound))
        row = w.amax(dim=-1) if m.shape[-1] else zero.expand(m.shape[0])  # a sample's count, or 0
        inf = torch.full((), float("inf"), dtype=torch.float64, device=m.device)
        figures = torch.stack(
            [
                w.sum(),
                (w * (torch.expm1(d) - d)).sum(),
                (w * ratio).sum(),
                (w * beyond).sum(),
                row.sum(),
                (row * beyond.any(dim=-1)).sum(),
                torch.where(m, ratio, inf).amin() if m.numel() else inf,
                torch.where(m, ratio, -inf).amax() if m.numel() else -inf,
            ]
        ).tolist()
    if figures[0] <= 0:
        return {}
    return dict(zip(SUM_KEYS + EXTREMES, figures, strict=True))


def add_sums(into: dict[str, float], stats: Mapping[str, float]) -> None:
    """Add `stats` into `into`: a `*_min` key by min, a `*_max` key by max, any other by +."""
    for key, value in stats.items():
        if key not in into:
            into[key] = value
        elif key.endswith("_min"):
            into[key] = min(into[key], value)
        elif key.endswith("_max"):
            into[key] = max(into[key], value)
        else:
            into[key] += value


def mismatch_figures(sums: Mapping[str, float]) -> dict[str, float]:
    """A step's figures from its sums: the token mean of k3 (`mismatch_kl`) and of the ratio, its
    extremes, the shares of tokens and of samples beyond the bound, and the two counts (to combine
    steps into a period, monitor/mismatch.py); {} when nothing was measured."""
    tokens, samples = sums.get("mismatch_tokens", 0.0), sums.get("mismatch_samples", 0.0)
    if tokens <= 0 or samples <= 0:
        return {}
    return {
        "mismatch_kl": sums["mismatch_k3_sum"] / tokens,
        "mismatch_ratio_mean": sums["mismatch_ratio_sum"] / tokens,
        "mismatch_ratio_min": sums["mismatch_ratio_min"],
        "mismatch_ratio_max": sums["mismatch_ratio_max"],
        "mismatch_beyond_token_share": sums["mismatch_beyond_tokens"] / tokens,
        "mismatch_beyond_sample_share": sums["mismatch_beyond_samples"] / samples,
        "mismatch_tokens": tokens,
        "mismatch_samples": samples,
    }
