"""Group-relative advantages: each sample's reward against the others of its prompt's group.

Invariant: advantages of one group sum to zero; a group whose rewards are all equal carries no
signal and gets exactly zero advantages, scaled or not (never a division by zero, never the rounding
of a float mean: such a group adds nothing to the gradient and the learner skips it).
"""

from __future__ import annotations

import torch
from torch import Tensor


def group_advantages(rewards: Tensor, scale: bool = True, eps: float = 1e-6) -> Tensor:
    """(r - mean) / std over the last dimension (a group); without `scale`, r - mean (Dr. GRPO)."""
    centred = rewards - rewards.mean(dim=-1, keepdim=True)
    uniform = (rewards == rewards[..., :1]).all(dim=-1, keepdim=True)
    centred = torch.where(uniform, torch.zeros_like(centred), centred)
    if not scale:
        return centred
    std = rewards.std(dim=-1, keepdim=True, unbiased=False)
    return torch.where(std > eps, centred / std.clamp_min(eps), torch.zeros_like(centred))
