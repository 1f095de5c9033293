"""One decode step over the engine's slots: a token for each of the first ``B`` slots, written into
the slot cache in place, attending each slot's own earlier tokens.

Invariant: the arithmetic is the model's own (``transformer.py``: the same norms, projections,
rotary and attention), so a step gives the logits a full forward gives at that position up to float
summation order; every shape is fixed by (``B``, ``width``) and the cache's size, and every per-row
value (token, position, where it writes) is a tensor, so the step can be compiled once and replayed.
A row whose ``write_at`` is the cache's last position (the spare one no row attends) writes nowhere
that is read: a padded or ended row changes no other row's result.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cadence.model.exact_ops import cos_sin, norm, softmax, weighted_values
from cadence.model.invariance import by_chunks
from cadence.model.lora import LoraLinear
from cadence.model.transformer import MLP, DecoderLayer, Linear, Transformer, rotate_half

# a torch without nested compile regions (before 2.8) compiles the step unrolled over its layers
_region: Callable[[Callable[..., Tensor]], Callable[..., Tensor]] = getattr(
    torch.compiler, "nested_compile_region", lambda fn: fn
)


def decode_step(
    model: Transformer,
    keys: Sequence[Tensor],
    values: Sequence[Tensor],
    tokens: Tensor,
    positions: Tensor,
    write_at: Tensor,
    width: int,
    weights_first: bool = False,
    by_rows: bool = False,
    live: int | None = None,
) -> Tensor:
    """Float32 logits [B, V] of the next token of each of the slots 0..B-1.

    ``keys``/``values``: the slot cache, a tensor a layer [slots, kv heads, length, head dim], each
    written in place by index (a compiled step then writes only those positions: a view of one
    tensor of all layers would be copied whole a step); ``tokens`` [B]:
    each slot's newest token, at position ``positions`` [B] (its cache index too); ``write_at`` [B]:
    where its keys and values go (its position, or the spare last one for a row that writes nowhere);
    ``width``: the cache positions attended (every row's position is below it); ``weights_first``:
    the float32 products as W·xᵀ (``project``; what ``weights_first_here`` says for this process);
    ``by_rows``: the attention of each row alike whatever the batch (``attend``); ``live``: only the
    slots below it hold rows (the rest pad the products up to the rows that keep each row alike:
    they attend nothing, and their logits are meaningless); None: all B."""
    b = tokens.shape[0]
    # the step's rows are slots: a layer's slice of them is [:b] whole. Said before the layers, so
    # that a count this bound fixes (2 rows of 2 slots) is fixed before a layer's region is traced
    torch._check(b <= keys[0].shape[0])
    rows = torch.arange(b, device=tokens.device).unsqueeze(1)  # [B, 1]
    kv = torch.arange(model.cfg.num_kv_heads, device=tokens.device).unsqueeze(0)  # [1, KV]
    at = write_at.unsqueeze(1)  # [B, 1]
    x = model.model.embed_tokens(tokens).unsqueeze(1)  # [B, 1, H]
    cos, sin = cos_sin(model.inv_freq, positions.unsqueeze(1), x.dtype)  # [B, 1, 1, D]
    span = torch.arange(width, device=tokens.device)
    seen = (span.unsqueeze(0) <= positions.unsqueeze(1)).view(b, 1, 1, width)
    for i, layer in enumerate(model.model.layers):
        x = layer_step(
            cast(DecoderLayer, layer),
            x,
            keys[i],
            values[i],
            cos,
            sin,
            (rows, kv, at),
            seen,
            weights_first,
            by_rows,
            b if live is None else live,
        )
    return project(model.lm_head, norm(model.model.norm, x), weights_first)[:, 0].float().contiguous()


@_region
def layer_step(
    layer: DecoderLayer,
    x: Tensor,
    keys: Tensor,
    values: Tensor,
    cos: Tensor,
    sin: Tensor,
    where: tuple[Tensor, Tensor, Tensor],
    seen: Tensor,
    weights_first: bool,
    by_rows: bool,
    live: int,
) -> Tensor:
    """One layer of the step: ``x`` [B, 1, H] after it, the layer's keys and values of the step
    written into its slots at ``where`` (rows, kv heads, positions), the first ``live`` rows
    attending (the others' attention 0: rows that only pad the products). A nested compile region: a
    compiled step traces and compiles it once and stamps it out for every layer (SmolLM2's 30: a
    compile of seconds, not of the minutes a step unrolled over its layers took)."""
    attn = layer.self_attn
    b, width = x.shape[0], seen.shape[-1]
    heads, kv_heads, head_dim = attn.heads, attn.kv_heads, attn.head_dim
    h = norm(layer.input_layernorm, x)
    q = project(attn.q_proj, h, weights_first).contiguous().view(b, 1, heads, head_dim)
    k = project(attn.k_proj, h, weights_first).contiguous().view(b, 1, kv_heads, head_dim)
    if attn.q_norm is not None and attn.k_norm is not None:
        q, k = norm(attn.q_norm, q), norm(attn.k_norm, k)
    q, k = q.transpose(1, 2), k.transpose(1, 2)
    v = project(attn.v_proj, h, weights_first).contiguous().view(b, 1, kv_heads, head_dim).transpose(1, 2)
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    held = keys.dtype  # the model's, or float32 for a 16-bit model on the CPU (slots.cache_dtype)
    keys.index_put_(where, k[:, :, 0].to(held))
    values.index_put_(where, v[:, :, 0].to(held))
    grouped = kv_heads != heads
    out = attend(
        q[:live].to(held), keys[:live, :, :width], values[:live, :, :width], seen[:live], grouped, by_rows
    )
    if live < b:
        out = torch.cat([out, out.new_zeros(b - live, *out.shape[1:])])
    out = out.to(x.dtype)
    x = x + project(attn.o_proj, out.transpose(1, 2).reshape(b, 1, heads * head_dim), weights_first)
    return x + _mlp(layer.mlp, norm(layer.post_attention_layernorm, x), weights_first)


def attend(q: Tensor, k: Tensor, v: Tensor, seen: Tensor, grouped: bool, by_rows: bool = True) -> Tensor:
    """Each row's query [B, H, 1, D] over its keys and values [B, KV, W, D] where ``seen`` [B, 1, 1, W].
    ``by_rows`` on the CPU: as products of each key head's queries (GQA without repeating the keys),
    every row's result then what it is in any batch and at any width W, where the CPU's flash kernel
    splits its work by the batch's size and a row's last bits change with it (about half the rows of
    12 to 47, two threads); as fast here. Its weighted sum of the values goes by chunks of positions
    (``exact_ops.values_by_chunks``): one product over all W positions is summed in an order W
    chooses. Otherwise ``scaled_dot_product_attention``."""
    if not by_rows or q.device.type != "cpu":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=seen, enable_gqa=grouped)
    b, heads, _, dim = q.shape
    kv = k.shape[1]
    scores = torch.matmul(q.reshape(b, kv, heads // kv, dim), k.transpose(-1, -2)) * dim**-0.5
    weights = softmax(scores.masked_fill(~seen, float("-inf")))
    return weighted_values(weights, v).reshape(b, heads, 1, dim)


WEIGHTS_FIRST_CPUS = frozenset({"AVX2"})
"""The CPUs (``torch.backends.cpu.get_cpu_capability()``) whose MKL runs a step's float32 products
faster as W·xᵀ: an AMD EPYC with AVX2 (1.16-1.43x whole calls at 8 rows). On an Intel Xeon with
AVX-512 it was the other way round at every row count (x·Wᵀ 1.07-1.11x whole calls, 8 to 32 rows)."""


def weights_first_here(device: torch.device, capability: str | None = None) -> bool:
    """Whether a step on ``device`` in this process computes its float32 products as W·xᵀ: on a CPU
    of ``WEIGHTS_FIRST_CPUS`` (``capability``: this one's) with two threads or more (``project``
    says why). Read by the caller, outside a compiled step: the CPU and the thread count, never a
    timing, so two runs of one config on one host compute alike."""
    if device.type != "cpu" or torch.get_num_threads() < 2:
        return False
    return (capability or torch.backends.cpu.get_cpu_capability()) in WEIGHTS_FIRST_CPUS


def project(linear: nn.Module, x: Tensor, weights_first: bool = True) -> Tensor:
    """``linear(x)`` for x [..., in]: the same products and sums in another order, equal to float
    rounding, and possibly a transposed view (``.contiguous()`` where the layout matters).

    With ``weights_first``, a plain float32 ``nn.Linear`` on the CPU is computed as W·xᵀ. With a
    step's few rows and two threads, MKL runs that product 1.2 to 2.2x faster than x·Wᵀ
    (``F.linear``) when the weights stream from memory, as a decode step's do (SmolLM2's 211 products
    of a step, 1 to 96 rows, AMD EPYC AVX2); with one thread it is up to 1.4x slower, in bfloat16
    slower too, on an Intel Xeon with AVX-512 slower (``WEIGHTS_FIRST_CPUS``), and a GPU's kernels
    do not care. Anything else (not ``weights_first``, another dtype
    or device, a wrapper other than an adapter's ``LoraLinear``, whose base goes so and its low-rank
    product is added as its forward adds it, a module with hooks) is called as it is. A module the
    engine marked (``transformer.mark_rows``) computes more rows than the probe's by chunks
    (``invariance.by_chunks``), each row then alike whatever the batch."""
    if (
        not weights_first
        or type(linear) not in (nn.Linear, Linear, LoraLinear)
        or x.device.type != "cpu"
        or x.dtype != torch.float32
        or linear._forward_hooks
        or linear._forward_pre_hooks
    ):
        return linear(x)
    assert isinstance(linear, nn.Linear)
    flat = x.reshape(-1, x.shape[-1]).contiguous()  # rows in order, as the probe's: a compiled step's too
    weight = linear.weight
    out = by_chunks(lambda rows: torch.mm(weight, rows.t()).t(), flat, getattr(linear, "least_first", 0))
    if linear.bias is not None:
        out = out + linear.bias
    out = out.reshape(*x.shape[:-1], out.shape[-1])
    if isinstance(linear, LoraLinear):  # its base as above, then its low-rank product as its forward adds it
        return out + linear.lora_B(linear.lora_A(linear.dropout(x))) * linear.scale
    return out


def _mlp(mlp: nn.Module, x: Tensor, weights_first: bool) -> Tensor:
    if type(mlp) is not MLP:
        return mlp(x)
    mlp = cast(MLP, mlp)
    gate, up = project(mlp.gate_proj, x, weights_first), project(mlp.up_proj, x, weights_first)
    return project(mlp.down_proj, F.silu(gate) * up, weights_first)
