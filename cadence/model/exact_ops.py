"""The decode step's reductions and transcendentals as the eager step computes them, also when the
step is compiled.

Inductor writes its own loops for what it fuses, and where a result depends on the order of a sum or
on a math library's rounding they give other last bits than ATen's kernels: an RMS norm's mean of
squares (up to 1e-6 apart), a softmax's sums (3e-8), the rotary cos and sin (6e-8) — after
SmolLM2's 30 layers, a sampled token's log-prob 2.0e-5 from the eager step's. Inside a trace these
three go through custom ops whose bodies are the eager code itself, so Inductor calls ATen for them
rather than generating them; the rest of a step (products, rotary's products and sums, SiLU·mul,
residual sums, cache writes) was measured equal bit for bit fused or not. A compiled step then
computes the eager step's bits.

Invariant: outside a trace every function here is the plain eager call (no op dispatch added to the
eager step); inside one, the op runs that same call on the same inputs.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from cadence.model.rope import rope_cos_sin
from cadence.model.transformer import RMSNorm, rms_norm


@torch.library.custom_op("cadence::rms_norm", mutates_args=())
def _rms_norm_op(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return rms_norm(x, weight, eps)


@_rms_norm_op.register_fake
def _(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return x.new_empty(x.shape, dtype=torch.promote_types(weight.dtype, x.dtype))


@torch.library.custom_op("cadence::softmax", mutates_args=())
def _softmax_op(x: Tensor) -> Tensor:
    return torch.softmax(x, dim=-1)


@_softmax_op.register_fake
def _(x: Tensor) -> Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op("cadence::rope_cos_sin", mutates_args=())
def _cos_sin_op(inv_freq: Tensor, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    return rope_cos_sin(inv_freq, positions, dtype)


@_cos_sin_op.register_fake
def _(inv_freq: Tensor, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    shape = (*positions.shape[:-1], 1, positions.shape[-1], 2 * inv_freq.shape[0])
    return inv_freq.new_empty(shape, dtype=dtype), inv_freq.new_empty(shape, dtype=dtype)


def norm(module: nn.Module, x: Tensor) -> Tensor:
    """``module(x)``; an ``RMSNorm`` inside a trace as the eager kernels compute it."""
    if type(module) is RMSNorm and torch.compiler.is_compiling():
        return _rms_norm_op(x, module.weight, module.eps)
    return module(x)


def softmax(x: Tensor) -> Tensor:
    """``torch.softmax(x, -1)``, inside a trace as the eager kernel computes it."""
    if torch.compiler.is_compiling():
        return _softmax_op(x)
    return torch.softmax(x, dim=-1)


def cos_sin(inv_freq: Tensor, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """``rope.rope_cos_sin``, inside a trace as the eager kernels compute it."""
    if torch.compiler.is_compiling():
        return _cos_sin_op(inv_freq, positions, dtype)
    return rope_cos_sin(inv_freq, positions, dtype)
