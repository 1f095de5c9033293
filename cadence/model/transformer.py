"""A compact Llama/Qwen2/Qwen3-family decoder-only transformer.

Invariant: the parameter names and the arithmetic are those of Hugging Face ``LlamaForCausalLM``,
``Qwen2ForCausalLM`` and ``Qwen3ForCausalLM`` (RMSNorm, rotate-half rotary embeddings with optional
linear/llama3 scaling, grouped-query attention, optional q/k/v(/o) biases, optional per-head q/k
RMS norms, SwiGLU, optional tied head), so a state dict moves between this model and transformers
unchanged; an explicit ``attn_mask`` is honoured exactly, a forward with a ``KVCache`` gives the
logits of the full forward, and one with ``logits_at`` the full forward's logits at those positions.
A packed row's ``SegmentMask`` (ops/block_attention.py) is attended by blocks, as its dense mask is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import structlog
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import skip_init
from torch.utils.checkpoint import checkpoint

from cadence.model.config import ModelConfig
from cadence.model.embedding import lookup_into_grad
from cadence.model.invariance import linear_rows
from cadence.model.rope import rope_cos_sin, rope_inv_freq
from cadence.ops.block_attention import SegmentMask

log = structlog.get_logger()


class KVCache:
    """Per-layer keys and values of the tokens seen so far; every batch row has the same length.

    With ``capacity`` the buffers are allocated once and written in place; without, they grow by concat.
    """

    def __init__(self, capacity: int | None = None) -> None:
        self.capacity = capacity
        self._keys: list[Tensor] = []
        self._values: list[Tensor] = []
        self._length = 0

    @property
    def length(self) -> int:
        return self._length

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store ``k``/``v`` [B, KV, T, D] of ``layer`` after the cached ones; return all of them."""
        end = self._length + k.shape[2]
        if layer == len(self._keys):
            size = self.capacity if self.capacity is not None else end
            if end > size:
                raise ValueError(f"KVCache capacity {self.capacity} exceeded: {end} tokens")
            shape = (k.shape[0], k.shape[1], size, k.shape[3])
            self._keys.append(k.new_empty(shape))
            self._values.append(v.new_empty(shape))
        elif self.capacity is None:
            self._keys[layer] = torch.cat([self._keys[layer][:, :, : self._length], k], dim=2)
            self._values[layer] = torch.cat([self._values[layer][:, :, : self._length], v], dim=2)
            return self._keys[layer], self._values[layer]
        elif end > self.capacity:
            raise ValueError(f"KVCache capacity {self.capacity} exceeded: {end} tokens")
        self._keys[layer][:, :, self._length : end] = k
        self._values[layer][:, :, self._length : end] = v
        return self._keys[layer][:, :, :end], self._values[layer][:, :, :end]

    def advance(self, num_tokens: int) -> None:
        """Called once per forward, after every layer stored its ``num_tokens`` new entries."""
        self._length += num_tokens

    def fork(self) -> KVCache:
        """A growing cache that starts with this one's entries and leaves them as they are (a later
        ``update`` of the fork concatenates into new tensors)."""
        if self.capacity is not None:
            raise ValueError("fork needs a cache without capacity (one that grows by concat)")
        forked = KVCache()
        forked._keys, forked._values, forked._length = list(self._keys), list(self._values), self._length
        return forked

    def segments(self, start: int, sizes: Sequence[int]) -> list[KVCache]:
        """Batch-1 caches, one a segment: this cache's first ``start`` entries (a shared beginning)
        followed by the segment's own, the segments lying one after another from ``start`` on."""
        if any(k.shape[0] != 1 for k in self._keys):
            raise ValueError("segments needs a cache of batch size 1")
        if start + sum(sizes) > self._length:
            raise ValueError(f"segments of {sum(sizes)} entries after {start} exceed {self._length}")
        parts: list[KVCache] = []
        offset = start
        for size in sizes:
            part = KVCache()
            part._keys = [
                torch.cat([k[:, :, :start], k[:, :, offset : offset + size]], 2) for k in self._keys
            ]
            part._values = [
                torch.cat([v[:, :, :start], v[:, :, offset : offset + size]], 2) for v in self._values
            ]
            part._length = start + size
            parts.append(part)
            offset += size
        return parts

    def repeat_batch(self, n: int) -> None:
        """Turn a batch-1 cache into ``n`` identical rows (one prefill shared by ``n`` samples)."""
        if any(k.shape[0] != 1 for k in self._keys):
            raise ValueError("repeat_batch needs a cache of batch size 1")
        self._keys = [k.repeat(n, 1, 1, 1) for k in self._keys]
        self._values = [v.repeat(n, 1, 1, 1) for v in self._values]


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """``weight`` times ``x`` over its root mean square (in float32), as transformers' ``LlamaRMSNorm``."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


class Linear(nn.Linear):
    """`nn.Linear` whose product an engine may ask to compute by chunks of rows (`least`, set by
    `mark_rows`: each row then alike whatever else is in the batch, invariance.py); 0: as it comes."""

    least = 0  # the fewest rows a chunk of x·Wᵀ holds; 0: the product whole
    least_first = 0  # the same for W·xᵀ (decode_step.project)

    def forward(self, x: Tensor) -> Tensor:
        return linear_rows(x, self.weight, self.bias, self.least)


def mark_rows(model: nn.Module, least: int, least_first: int) -> None:
    """Every linear module of `model` computes its products by chunks of `least` (x·Wᵀ) or
    `least_first` (W·xᵀ) to `invariance.PROBE_ROWS` rows; 0 and 0: whole."""
    for module in model.modules():
        if isinstance(module, Linear):
            module.least, module.least_first = least, least_first


def _linear(d_in: int, d_out: int, bias: bool = False) -> nn.Linear:
    # no global RNG draw (init_model or a load fills it); honours `with torch.device("meta")`
    return skip_init(Linear, d_in, d_out, bias=bias, device=torch.get_default_device())


def rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer, self.heads, self.kv_heads, self.head_dim = (
            layer,
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
        )
        bias = cfg.attention_bias
        self.q_proj = _linear(cfg.hidden_size, cfg.num_heads * cfg.head_dim, bias)
        self.k_proj = _linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias)
        self.v_proj = _linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias)
        self.o_proj = _linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, cfg.o_proj_bias)
        self.q_norm: RMSNorm | None = None
        self.k_norm: RMSNorm | None = None
        if cfg.qk_norm:  # Qwen3: RMS norm over each head's vector, before rotary
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)

    def forward(
        self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | SegmentMask | None, cache: KVCache | None
    ) -> Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if cache is not None:
            k, v = cache.update(self.layer, k, v)
        grouped = self.kv_heads != self.heads
        if grouped and (t > 1 or isinstance(mask, SegmentMask)):
            k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
            v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        if isinstance(mask, SegmentMask):  # a packed row by blocks: no [T, T] tensor
            out = mask.attend(q, k, v)
            return self.o_proj(out.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))
        causal = mask is None and t > 1  # None with t > 1 only happens without cached tokens
        # a decode step reads the cached keys and values of every query head's group in place: no
        # copy of the whole cache a step (a whole forward is faster with the repeated copies)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=grouped and t == 1
        )
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = _linear(cfg.hidden_size, cfg.intermediate_size)
        self.up_proj = _linear(cfg.hidden_size, cfg.intermediate_size)
        self.down_proj = _linear(cfg.intermediate_size, cfg.hidden_size)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)
        # activation checkpointing (Transformer.recompute_blocks): inside forward, so that hooks on the
        # block (FSDP2's gathers) stay outside what the backward computes again
        self.recompute = False

    def forward(
        self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | SegmentMask | None, cache: KVCache | None
    ) -> Tensor:
        if self.recompute and cache is None and torch.is_grad_enabled():
            # only the block's input is kept; its activations are made again in the backward (same
            # kernels on the same inputs, the random state restored: the same values)
            out: Tensor = checkpoint(self._block, x, cos, sin, mask, None, use_reentrant=False)
            return out
        return self._block(x, cos, sin, mask, cache)

    def _block(
        self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | SegmentMask | None, cache: KVCache | None
    ) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = skip_init(
            nn.Embedding, cfg.vocab_size, cfg.hidden_size, device=torch.get_default_device()
        )
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Transformer(nn.Module):
    """``LlamaForCausalLM`` (or Qwen2/Qwen3) in miniature: ``forward`` returns float32 logits [B, T, V].

    Built under ``with torch.device("meta")`` it allocates no weights (a loader assigns them); the
    rotary frequencies stay a real float32 buffer whatever the device or a later ``.to(dtype)``.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg)
        self.lm_head = _linear(cfg.hidden_size, cfg.vocab_size)
        self.tie_weights()
        # the embedding's backward adds its rows into the weight's gradient in place (embedding.py);
        # a learner whose weights are not split over ranks turns it on
        self.lookup_into_grad = False
        with torch.no_grad():  # defined values until init_model or a load
            for name, p in self.named_parameters():
                p.fill_(1.0 if name.endswith("norm.weight") else 0.0)
        device = torch.get_default_device()
        self.inv_freq: Tensor
        self.register_buffer(
            "inv_freq", rope_inv_freq(cfg, "cpu" if device.type == "meta" else device), persistent=False
        )

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> Transformer:
        super()._apply(fn, recurse)
        # recomputed on the new device: a .to(dtype) must not round them, nor to_empty() erase them
        self.inv_freq = rope_inv_freq(self.cfg, self.inv_freq.device)
        return self

    def recompute_blocks(self, on: bool) -> None:
        """Activation checkpointing: with ``on``, a forward that builds a graph without a ``KVCache``
        keeps each block's input alone and computes the block again in the backward (one more forward
        of the blocks; the gradients are those without it)."""
        for layer in self.model.layers:
            assert isinstance(layer, DecoderLayer)
            layer.recompute = on

    def tie_weights(self) -> None:
        """Make ``lm_head.weight`` the embedding matrix itself when the config ties them."""
        if self.cfg.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(
        self,
        input_ids: Tensor,
        position_ids: Tensor | None = None,
        attn_mask: Tensor | SegmentMask | None = None,
        cache: KVCache | None = None,
        logits_at: Tensor | None = None,
        head: Callable[[Tensor, nn.Linear], Tensor] | None = None,
    ) -> Tensor:
        """Float32 logits [B, T, V]; with ``logits_at`` (bool [B, T]) only those positions' logits,
        [N, V] in row-major order: the head and its softmax cost nothing where no target is read.
        With ``head``, ``head(final normed hidden states, lm_head)`` instead of the logits (a reader
        of log-probs applies the head a chunk at a time, ops/logprobs.py)."""
        b, t = input_ids.shape
        past = cache.length if cache is not None else 0
        if position_ids is None:
            position_ids = torch.arange(past, past + t, device=input_ids.device).expand(b, t)
        mask = self._attention_mask(attn_mask, b, t, past, input_ids.device)
        weight = self.model.embed_tokens.weight
        if self.lookup_into_grad and weight.requires_grad and torch.is_grad_enabled():
            x = lookup_into_grad(input_ids, weight)
        else:
            x = self.model.embed_tokens(input_ids)
        cos, sin = rope_cos_sin(self.inv_freq, position_ids, x.dtype)  # [B, 1, T, D]
        for layer in self.model.layers:
            x = layer(x, cos, sin, mask, cache)
        if cache is not None:
            cache.advance(t)
        if logits_at is not None:
            x = x[logits_at]
        if head is not None:
            return head(self.model.norm(x), self.lm_head)
        return self.lm_head(self.model.norm(x)).float()

    @staticmethod
    def _attention_mask(
        attn_mask: Tensor | SegmentMask | None, b: int, t: int, past: int, device: torch.device
    ) -> Tensor | SegmentMask | None:
        """The bool mask [B|1, 1, T, S] for sdpa, or None where ``is_causal`` (or no mask) is exact; a
        segment mask as it is where it fits (one row, no cache), else as its dense mask (logged)."""
        s = past + t
        if isinstance(attn_mask, SegmentMask):
            if b == 1 and past == attn_mask.context and attn_mask.length == t:
                return attn_mask
            log.info(
                "attention_dense_fallback", rows=b, tokens=t, cached=past, segment_tokens=attn_mask.length
            )
            attn_mask = attn_mask.dense(device)
        if attn_mask is not None:
            if attn_mask.dtype != torch.bool:
                raise ValueError(f"attn_mask must be bool (True = may attend), got {attn_mask.dtype}")
            if attn_mask.dim() == 3:
                attn_mask = attn_mask.unsqueeze(1)
            if attn_mask.dim() != 4 or attn_mask.shape[-2:] != (t, s) or attn_mask.shape[0] not in (1, b):
                raise ValueError(f"attn_mask shape {tuple(attn_mask.shape)} is not [B, (1,) {t}, {s}]")
            return attn_mask
        if past == 0 or t == 1:
            return None  # plain causal (is_causal) or one new token that sees everything cached
        rows = torch.arange(past, s, device=device).unsqueeze(1)
        return (torch.arange(s, device=device).unsqueeze(0) <= rows).view(1, 1, t, s)


def init_model(cfg: ModelConfig, seed: int) -> Transformer:
    """A freshly initialised model that depends only on ``cfg`` and ``seed`` (not on global RNG)."""
    model = Transformer(cfg)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=generator)
    return model
