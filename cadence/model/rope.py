"""Rotary position embeddings: inverse frequencies and the cos/sin of given positions.

Invariant: the arithmetic is that of Hugging Face's rope functions (``default``, ``linear``, ``llama3``)
op for op in float32, so cos/sin equal transformers' for the same config and positions.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from cadence.model.config import ModelConfig


def rope_inv_freq(cfg: ModelConfig, device: torch.device | str = "cpu") -> Tensor:
    """The float32 inverse frequencies [head_dim / 2] of ``cfg`` (its rope_theta and rope_scaling)."""
    dim = cfg.head_dim
    exponents = torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim
    inv_freq = 1.0 / (cfg.rope_theta**exponents)
    scaling = cfg.rope_scaling
    if scaling is None:
        return inv_freq
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    # llama3: long wavelengths are divided by factor, short ones kept, the band between interpolated
    old_context = scaling.original_max_position
    low_freq_wavelen = old_context / scaling.low_freq_factor
    high_freq_wavelen = old_context / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_context / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def rope_cos_sin(inv_freq: Tensor, position_ids: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos and sin [B, 1, T, head_dim] of ``position_ids`` [B, T], computed in float32, cast to ``dtype``."""
    freqs = position_ids[..., None].float() * inv_freq.float()
    emb = torch.cat((freqs, freqs), dim=-1).unsqueeze(1)
    return emb.cos().to(dtype), emb.sin().to(dtype)
