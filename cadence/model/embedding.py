"""The token embedding's lookup whose backward adds its rows straight into the weight's gradient.

```
 forward:   ids [B, T] ─► weight[ids] [B, T, H]          (the weight read detached)
 backward:  grad [B, T, H] ─► weight.grad.index_add_(0, ids, grad)     (weight.grad zeros if none yet)
```

Autograd's own embedding backward builds a dense [V, H] gradient of zeros for the few rows a batch
reads, and a head tied to the embedding then sums it with the head's own dense gradient: on
SmolLM2 (V = 49 152, H = 576) a fill, an add and their 113 MB each, about 0.15 s a micro-batch on a
CPU core, for a gradient of a hundred rows.

Invariant: after a backward, ``weight.grad`` is the gradient autograd's embedding would have given,
added to whatever else reached it (the tied head's, earlier micro-batches'), in whatever order the
engine runs them: the rows go in place into the gradient that exists when this backward runs, and
the weight's own accumulation adds into it in place too. Not for a weight split over ranks (FSDP2's
DTensor gradients arrive through its own hooks): the sharded learner keeps autograd's lookup.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class _LookupIntoGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, ids: Tensor, anchor: Tensor, holder: list[nn.Parameter]) -> Tensor:
        ctx.save_for_backward(ids)
        ctx.weight = holder[0]
        return F.embedding(ids, holder[0].detach())

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[None, None, None]:
        (ids,) = ctx.saved_tensors
        weight: nn.Parameter = ctx.weight
        if weight.grad is None:
            weight.grad = torch.zeros_like(weight)
        rows = grad.reshape(-1, grad.shape[-1]).to(weight.grad.dtype)
        weight.grad.index_add_(0, ids.reshape(-1), rows)
        return None, None, None


def lookup_into_grad(ids: Tensor, weight: nn.Parameter) -> Tensor:
    """``weight[ids]`` whose backward index-adds its rows into ``weight.grad``."""
    # autograd calls a backward only when a tensor input requires grad, and the weight must not be
    # one (its own accumulation would wait for these rows and take them as a dense gradient): it goes
    # in a list, which autograd does not track
    anchor = weight.new_empty(0).requires_grad_()
    out: Tensor = _LookupIntoGrad.apply(ids, anchor, [weight])
    return out
