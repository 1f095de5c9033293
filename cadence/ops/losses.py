"""The policy objectives (`trainer.objective`): clipped surrogates with separate bounds, aggregated
per token (dapo, dr_grpo) or per sample (grpo, gspo), and a k3 KL penalty to a reference.

Invariant: losses here are *sums* over samples (of a per-sample quantity), never means over the
batch; `weights` [N], where given, multiply each sample's term and statistics (a sample computed once
for `weights[i]` identical ones, ops/distinct.py). The trainer divides the step's summed gradient by
`step_normaliser` once, before clipping and the step, so neither the order in which groups arrive nor the micro-batch split can change the
result beyond floating-point summation order. The formulas are in docs/objectives.md.

`mask` [N, T] marks the tokens that enter: each sample's sampled response tokens, neither padding nor
an environment's tokens (ops/sampled.py). Every term, statistic and sample length (grpo's mean, gspo's
sequence ratio) counts those alone, and an old log-prob off the mask is never read (whatever it holds).

`sample_tokens` [N], where given, are the sampled tokens of the sample each row belongs to: a sample may
be split in several rows (an agent's episode of several token sequences, each a row), and its rows
together are one sample. Token-summed objectives (dapo, dr_grpo) sum the same terms however a sample is
split; grpo's token-mean divides each row's sum by its sample's tokens, so the rows' means add up to
the sample's; gspo keeps each row's own sequence ratio (each row was sampled as a sequence of its own)
and weighs its term (KL included) by its share of its sample's tokens. None: each row is a sample.

`correction` (ops/correction.py), where given, is a detached weight on each token's surrogate term
([N, T], or [N, 1] one a sample): dapo, grpo and dr_grpo multiply each token's surrogate by it; gspo
multiplies a sample's surrogate by its [N, 1] weight and, with [N, T], each token's share of the
sequence ratio's gradient (the value of s unchanged). The KL term and every normaliser are untouched.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

OBJECTIVES = ("dapo", "grpo", "dr_grpo", "gspo")


def clipped_surrogate(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, clip_low: float, clip_high: float
) -> Tensor:
    """Per-token loss -min(r A, clip(r, 1 - clip_low, 1 + clip_high) A), r = exp(logp - old_logp)."""
    ratio = torch.exp(logp - old_logp)
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    return -torch.minimum(ratio * advantages, clipped * advantages)


def clip_active(ratio: Tensor, advantages: Tensor, clip_low: float, clip_high: float) -> Tensor:
    """Where the clip takes the gradient away: the ratio above 1 + clip_high with a positive advantage,
    or below 1 - clip_low with a negative one (elsewhere a ratio out of bounds is still unclipped)."""
    return ((advantages > 0) & (ratio > 1.0 + clip_high)) | ((advantages < 0) & (ratio < 1.0 - clip_low))


def k3_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Per-token k3 estimator of KL(policy || reference): exp(q - p) - (q - p) - 1, q = ref."""
    delta = ref_logp - logp
    return torch.exp(delta) - delta - 1.0


def _masked(values: Tensor, mask: Tensor) -> Tensor:
    return torch.where(mask.bool(), values, torch.zeros_like(values))


def _old_on_mask(old_logp: Tensor, logp: Tensor, mask: Tensor) -> Tensor:
    """The old log-probs on `mask`, the policy's own (detached: ratio 1) off it, so that no value
    there (an environment token's 0, an inf, a nan) reaches a term or a gradient."""
    return torch.where(mask.bool(), old_logp, logp.detach())


def _token_terms(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float,
    clip_high: float,
    ref_logp: Tensor | None,
    kl_beta: float,
    weights: Tensor | None,
    correction: Tensor | None,
) -> tuple[Tensor, dict[str, float]]:
    """Per-token terms [N, T] (surrogate, times `correction` where given, plus kl_beta x k3 with a
    reference) and summed statistics, both weighted by `weights` [N] where given."""
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1).expand_as(logp)
    old_logp = _old_on_mask(old_logp, logp, mask)
    per_token = clipped_surrogate(logp, old_logp, advantages, clip_low, clip_high)
    if correction is not None:
        per_token = per_token * correction.detach()
    w = _sample_weights(weights, logp)
    stats: dict[str, float] = {}
    with torch.no_grad():
        active = clip_active(torch.exp(logp - old_logp), advantages, clip_low, clip_high)
        stats["clipped_tokens"] = float(_masked(active * w, mask).sum())
    if ref_logp is not None and kl_beta > 0:
        kl = k3_kl(logp, ref_logp)
        per_token = per_token + kl_beta * kl
        stats["kl_sum"] = float(_masked(kl.detach() * w, mask).sum())
    return per_token * w, stats


def _sample_weights(weights: Tensor | None, like: Tensor) -> Tensor:
    """`weights` [N] as a [N, 1] column of `like`'s dtype, or 1."""
    if weights is None:
        return torch.ones((), dtype=like.dtype, device=like.device)
    return weights.to(dtype=like.dtype, device=like.device).unsqueeze(-1)


def grpo_loss_sum(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float,
    clip_high: float,
    ref_logp: Tensor | None = None,
    kl_beta: float = 0.0,
    weights: Tensor | None = None,
    *,
    sample_mean: bool = False,
    correction: Tensor | None = None,
    sample_tokens: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """The token-level terms where `mask` is set, summed (dapo, dr_grpo) or, with `sample_mean`,
    averaged over each sample's tokens (`sample_tokens` [N] where a sample spans several rows, else
    the row's own) and the means summed over samples (grpo); and summed statistics for logging.

    logp, old_logp, mask: [N, T]; advantages: [N] (one per sample) or [N, T].
    """
    per_token, stats = _token_terms(
        logp, old_logp, advantages, mask, clip_low, clip_high, ref_logp, kl_beta, weights, correction
    )
    if not sample_mean:
        return _masked(per_token, mask).sum(), stats
    counted = mask.sum(dim=-1) if sample_tokens is None else sample_tokens.to(mask.device)
    lengths = counted.clamp_min(1).to(per_token.dtype)
    return (_masked(per_token, mask).sum(dim=-1) / lengths).sum(), stats


def gspo_loss_sum(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float,
    clip_high: float,
    ref_logp: Tensor | None = None,
    kl_beta: float = 0.0,
    weights: Tensor | None = None,
    correction: Tensor | None = None,
    sample_tokens: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """gspo: the sum over samples of -min(s A, clip(s, 1 - clip_low, 1 + clip_high) A) with the
    sequence ratio s = exp(token-mean of logp - old_logp); the KL term as a token-mean per sample. A
    row of a sample split in several (`sample_tokens` [N]) has its own ratio, its term times its
    share of the sample's tokens.

    advantages: [N], one per sample."""
    if advantages.dim() != 1:
        raise ValueError("gspo takes one advantage per sample, [N]")
    lengths = mask.sum(dim=-1).clamp_min(1).to(logp.dtype)
    policy = _token_weighted(logp, correction)
    log_ratio = _masked(policy - _old_on_mask(old_logp, logp, mask), mask).sum(dim=-1) / lengths
    ratio = torch.exp(log_ratio)
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_sample = -torch.minimum(ratio * advantages, clipped * advantages)
    if correction is not None and correction.shape[-1] == 1:
        per_sample = per_sample * correction.detach().squeeze(-1)
    w = _sample_weights(weights, logp).squeeze(-1)
    stats: dict[str, float] = {}
    with torch.no_grad():
        active = clip_active(ratio, advantages, clip_low, clip_high)
        stats["clipped_tokens"] = float((mask.sum(dim=-1) * active * w).sum())  # a clipped sample's tokens
    if ref_logp is not None and kl_beta > 0:
        kl = _masked(k3_kl(logp, ref_logp), mask)
        per_sample = per_sample + kl_beta * kl.sum(dim=-1) / lengths
        stats["kl_sum"] = float((kl.detach().sum(dim=-1) * w).sum())
    if sample_tokens is not None:  # a row's share of its sample's tokens
        per_sample = per_sample * lengths / sample_tokens.to(lengths).clamp_min(1)
    has_tokens = mask.any(dim=-1)
    return torch.where(has_tokens, per_sample * w, torch.zeros_like(per_sample)).sum(), stats


def _token_weighted(logp: Tensor, correction: Tensor | None) -> Tensor:
    """`logp` with the same values and each token's gradient times its `correction` weight (a token-level
    [N, T] one); `logp` itself otherwise. At a weight of 1 the values and gradient are exactly logp's."""
    if correction is None or correction.shape[-1] == 1:
        return logp
    held = logp.detach()
    return held + correction.detach() * (logp - held)


def objective_loss_sum(
    objective: str,
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float,
    clip_high: float,
    ref_logp: Tensor | None = None,
    kl_beta: float = 0.0,
    weights: Tensor | None = None,
    correction: Tensor | None = None,
    sample_tokens: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """The summed loss of `objective` (one of `OBJECTIVES`) and its summed statistics, each sample
    weighted by `weights` [N] where given, each token's surrogate by `correction` (ops/correction.py),
    each row of a sample split in several counted as its part of it (`sample_tokens` [N])."""
    args = (logp, old_logp, advantages, mask, clip_low, clip_high, ref_logp, kl_beta, weights)
    if objective in ("dapo", "dr_grpo", "grpo"):
        mean = objective == "grpo"
        return grpo_loss_sum(*args, sample_mean=mean, correction=correction, sample_tokens=sample_tokens)
    if objective == "gspo":
        return gspo_loss_sum(*args, correction=correction, sample_tokens=sample_tokens)
    raise ValueError(f"trainer.objective must be one of {list(OBJECTIVES)}, got {objective!r}")


def step_normaliser(objective: str, normaliser: str, lengths: Sequence[int], max_new_tokens: int) -> float:
    """What one optimizer step divides its summed gradient by, from the lengths of its completions
    (their sampled tokens: ops/sampled.py `sampled_lengths`; a sample split in several rows is one
    length, its rows' sum): dapo the response tokens (or, `normaliser
    = "samples"`, the samples), grpo and gspo the samples, dr_grpo the constant max_new_tokens x
    samples; at least 1."""
    if objective == "dapo":
        total = sum(lengths) if normaliser == "tokens" else len(lengths)
    elif objective == "dr_grpo":
        total = max_new_tokens * len(lengths)
    else:
        total = len(lengths)
    return float(max(total, 1))
