"""Rollout correction (`[trainer.rollout_correction]`): a detached weight on each sampled token's
surrogate term that corrects for the engine having sampled from π_engine, not from the learner's π.

With ρ_t = π_learner(y_t) / π_engine(y_t) (ops/mismatch.py), the ratio of a `level`:

    token:      ρ = ρ_t                          (each token its own)
    sequence:   ρ = Π_t ρ_t                      (one for every token of the sample)
    geometric:  ρ = exp((1/|y|) Σ_t log ρ_t)     (the same, the geometric mean)

and the corrected importance weight f(ρ) of a `mode`:

    truncate:   f(ρ) = min(ρ, cap)                       (TIS, Yao et al. 2025)
    mask:       f(ρ) = ρ if low <= ρ <= high, else 0     (masked IS: MIS, IcePop)

The weight on a token's term is f(ρ) when the surrogate's ratio does not carry ρ (one step a period:
the old policy is the learner's own, ratio 1), and f(ρ) / ρ when it does (`carried`: the old policy is
the engine's, several steps a period, so r = π_θ / π_engine already holds ρ_t): at the token level a
token's effective importance weight outside the clip is then f(ρ_t) either way; at the sequence levels
each token keeps its own ratio r inside the clip and the sample is scaled by f(ρ) / ρ (truncate: down
where ρ > cap; mask: dropped outside the band). Sums over a sample's tokens and its length are over
its sampled tokens only (`mask`).

Invariant: where the learner's and the engine's log-probs are equal, ρ = 1 exactly and every weight is
exactly 1 (cap >= 1, low <= 1 <= high), so a step is bit for bit the uncorrected one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

MODES = ("off", "truncate", "mask")
LEVELS = ("token", "sequence", "geometric")


@dataclass(frozen=True)
class CorrectionRule:
    """`[trainer.rollout_correction]` as the learner applies it (built by `launch/build.py`)."""

    mode: str = "off"
    level: str = "token"
    cap: float = 2.0
    low: float = 0.5
    high: float = 2.0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(
                f"trainer.rollout_correction.mode must be one of {list(MODES)}, got {self.mode!r}"
            )
        if self.level not in LEVELS:
            raise ValueError(
                f"trainer.rollout_correction.level must be one of {list(LEVELS)}, got {self.level!r}"
            )

    @property
    def on(self) -> bool:
        return self.mode != "off"

    def weights(self, logp: Tensor, engine: Tensor, mask: Tensor, carried: Tensor) -> Tensor:
        """The detached weights: [N, T] at the token level, [N, 1] (one a sample) at the others;
        `carried` [N, 1] bool: the rows whose old log-probs are the engine's."""
        m = mask.bool()
        with torch.no_grad():
            log_rho = torch.where(m, logp.detach() - engine, torch.zeros_like(logp))
            if self.level != "token":
                log_rho = log_rho.sum(dim=-1, keepdim=True)
                if self.level == "geometric":
                    log_rho = log_rho / m.sum(dim=-1, keepdim=True).clamp_min(1).to(log_rho.dtype)
            rho = log_rho.exp()
            carried = carried.to(rho.device)
            if self.mode == "truncate":
                return torch.where(carried, (self.cap / rho).clamp(max=1.0), rho.clamp(max=self.cap))
            inside = (rho >= self.low) & (rho <= self.high)
            kept = torch.where(carried, torch.ones_like(rho), rho)
            return torch.where(inside, kept, torch.zeros_like(rho))


def correction_sums(weights: Tensor, mask: Tensor, counts: Tensor | None) -> dict[str, float]:
    """The summed weight over the sampled tokens (each sample `counts[i]` times) and the tokens whose
    weight is 0 (masked), for the step's `correction_weight` and `correction_zeroed` figures."""
    with torch.no_grad():
        m = mask.bool()
        w = weights.expand(m.shape).to(torch.float64)
        counts = torch.ones(m.shape[0]) if counts is None else counts
        c = counts.to(w.device, torch.float64).unsqueeze(-1) * m
        total, zeroed = torch.stack([(c * w).sum(), (c * (w == 0)).sum()]).tolist()
    return {"correction_weight_sum": total, "correction_zeroed": zeroed}
