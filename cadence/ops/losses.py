"""The GRPO objective: clipped surrogate with separate bounds, and a k3 KL penalty to a reference.

Invariant: losses here are *sums* over the masked tokens, never means. The trainer divides the
period's summed gradient by the period's normaliser once, before clipping and the step, so the
order in which groups arrive cannot change the result beyond floating-point summation order.
"""

from __future__ import annotations

import torch
from torch import Tensor


def clipped_surrogate(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, clip_low: float, clip_high: float
) -> Tensor:
    """Per-token loss -min(r A, clip(r, 1 - clip_low, 1 + clip_high) A), r = exp(logp - old_logp)."""
    ratio = torch.exp(logp - old_logp)
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    return -torch.minimum(ratio * advantages, clipped * advantages)


def k3_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Per-token k3 estimator of KL(policy || reference): exp(q - p) - (q - p) - 1, q = ref."""
    delta = ref_logp - logp
    return torch.exp(delta) - delta - 1.0


def grpo_loss_sum(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float,
    clip_high: float,
    ref_logp: Tensor | None = None,
    kl_beta: float = 0.0,
) -> tuple[Tensor, dict[str, float]]:
    """Summed loss over tokens where `mask` is set, and summed statistics for logging.

    logp, old_logp, mask: [N, T]; advantages: [N] (one per sample) or [N, T].
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1).expand_as(logp)
    per_token = clipped_surrogate(logp, old_logp, advantages, clip_low, clip_high)
    stats: dict[str, float] = {}
    with torch.no_grad():
        ratio = torch.exp(logp - old_logp)
        clipped = (ratio < 1.0 - clip_low) | (ratio > 1.0 + clip_high)
        stats["clipped_tokens"] = float((clipped & mask.bool()).sum())
    if ref_logp is not None and kl_beta > 0:
        kl = k3_kl(logp, ref_logp)
        per_token = per_token + kl_beta * kl
        stats["kl_sum"] = float(torch.where(mask.bool(), kl.detach(), torch.zeros_like(kl)).sum())
    return torch.where(mask.bool(), per_token, torch.zeros_like(per_token)).sum(), stats
