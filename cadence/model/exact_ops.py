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

One more is a sum whose order the width of a step would otherwise choose: a row's attention
weights times its values, summed over the positions attended (``weighted_values``). As one product
of [heads, W] by [W, head dim], MKL splits that sum into blocks by W once W passes a few hundred
positions, so a row at position 300 came out other in its last bits at width 448 than at 320
(float32, AVX-512, 1 and 2 threads), and the step's width is its longest row's: a sample depended on
what it was decoded beside. It is summed in chunks of ``CHUNK`` positions instead, each a product of
that one shape, added in order: the chunks past a row's position add exact zeros.

Invariant: outside a trace every function here is the plain eager call (no op dispatch added to the
eager step); inside one, the op runs that same call on the same inputs.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from cadence.model.rope import rope_cos_sin
from cadence.model.slots import WIDTH_STEP
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


CHUNK = WIDTH_STEP
"""The positions a chunk of ``weighted_values`` sums: a step's width is a multiple of it, except at
the cache's full length (a model's positions need not be one)."""


def values_by_chunks(weights: Tensor, values: Tensor) -> Tensor:
    """``weights @ values`` for weights [..., M, W] and values [..., W, D] whose leading dimensions
    merge into one (a view of the slot cache's rows and key heads): summed over W by ``CHUNK``
    positions, each chunk one product of K = ``CHUNK`` added to the sum in order (a last one shorter
    where W is not a multiple, only at the cache's full length, which every row that reaches it is
    computed at). A row whose weights are 0 past its position comes out the same at every width."""
    *lead, m, width = weights.shape
    flat_w = weights.reshape(-1, m, width)
    flat_v = values.reshape(-1, width, values.shape[-1])
    out = torch.bmm(flat_w[:, :, :CHUNK], flat_v[:, :CHUNK])
    for start in range(CHUNK, width, CHUNK):
        out.baddbmm_(flat_w[:, :, start : start + CHUNK], flat_v[:, start : start + CHUNK])
    return out.view(*lead, m, values.shape[-1])


@torch.library.custom_op("cadence::values_by_chunks", mutates_args=())
def _values_op(weights: Tensor, values: Tensor) -> Tensor:
    return values_by_chunks(weights, values)


@_values_op.register_fake
def _(weights: Tensor, values: Tensor) -> Tensor:
    return weights.new_empty((*weights.shape[:-1], values.shape[-1]))


def weighted_values(weights: Tensor, values: Tensor) -> Tensor:
    """``values_by_chunks``, inside a trace as the eager step computes it (a loop over a symbolic
    width would be compiled again for every width)."""
    if torch.compiler.is_compiling():
        return _values_op(weights, values)
    return values_by_chunks(weights, values)


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
