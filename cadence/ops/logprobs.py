"""Per-token log-probabilities of given tokens under a model's logits.

Invariant: `token_logprobs(logits, targets)[b, t]` is log softmax(logits[b, t])[targets[b, t]],
computed in float32 whatever the logits' dtype.
"""

from __future__ import annotations

import torch
from torch import Tensor


def token_logprobs(logits: Tensor, targets: Tensor) -> Tensor:
    """Log-probability of each target token: logits [..., V], targets [...] -> [...]."""
    logits = logits.float()
    picked = torch.gather(logits, -1, targets.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)
