"""Per-token log-probabilities of given tokens under a model's logits, at the sampling temperature.

Invariant: `token_logprobs(logits, targets, T)[b, t]` is log softmax(logits[b, t] / T)[targets[b, t]],
computed in float32 whatever the logits' dtype: the distribution the engine samples from (before
top-p, whose truncation is never renormalised into a log-prob). T = 0 (greedy) and T = 1 leave the
logits as they are, so a greedy run's log-probs are those at T = 1 and T = 1 is bit for bit the
untempered computation.
"""

from __future__ import annotations

import torch
from torch import Tensor


def tempered(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """float32 `logits / temperature`; the logits themselves at temperature 0 (greedy) or 1."""
    logits = logits.float()
    return logits if temperature in (0.0, 1.0) else logits / temperature


def token_logprobs(
    logits: Tensor, targets: Tensor, temperature: float = 1.0, entropy: list[Tensor] | None = None
) -> Tensor:
    """Log-probability of each target token: logits [..., V], targets [...] -> [...]. With `entropy`,
    the (detached) entropy of each row's tempered distribution is appended to it, from the same
    softmax: no second forward."""
    logits = tempered(logits.float(), temperature)  # a bf16 forward's logits: the softmax in float32
    picked = torch.gather(logits, -1, targets.unsqueeze(-1)).squeeze(-1)
    norm = torch.logsumexp(logits, dim=-1)
    if entropy is not None:
        with torch.no_grad():
            probs = (logits - norm.unsqueeze(-1)).exp_()  # the softmax, from the normaliser at hand
            entropy.append(norm - torch.linalg.vecdot(probs, logits))  # H = logsumexp - Σ p z
    return picked - norm
