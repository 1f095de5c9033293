"""A step's gradients divided by its normaliser and clipped, in one multiply of each.

```
 norm = ‖g‖ / normaliser ─► g × min(1, max / (norm + 1e-6)) / normaliser      (max 0: no limit)
```

Invariant: the gradients and the returned norm are those of dividing every gradient, then
`torch.nn.utils.clip_grad_norm_` (its coefficient, its epsilon), up to float rounding; one read for
the norm and one multiply, where dividing and clipping apart read and write every gradient twice.
"""

from __future__ import annotations

import torch
from torch import Tensor


def normalise_and_clip(grads: list[Tensor], normaliser: float, max_norm: float) -> Tensor:
    """Scale `grads` in place; the norm of the divided gradients, before clipping (0 with none)."""
    if not grads:
        return torch.zeros(())
    norm = torch.nn.utils.get_total_norm(grads) / normaliser
    limit = max_norm if max_norm > 0 else float("inf")
    scale = (limit / (norm + 1e-6)).clamp(max=1.0) / normaliser
    torch._foreach_mul_(grads, scale)
    return norm
