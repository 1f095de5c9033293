"""Model shape.

Invariant: a ``ModelConfig`` that exists is buildable (every size positive, heads divide the hidden
size, kv heads divide the heads) and survives ``from_hf_dict(to_hf_dict())`` unchanged, so a
checkpoint's ``config.json`` is also a Llama config that Hugging Face transformers can read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModelConfig:
    """Sizes of a Llama-family decoder-only transformer."""

    vocab_size: int
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 128
    max_position: int = 256
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_embeddings: bool = True

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "hidden_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "intermediate_size",
            "max_position",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive integer, got {value!r}")
        for name in ("rope_theta", "rms_norm_eps"):
            if not float(getattr(self, name)) > 0:
                raise ValueError(f"ModelConfig.{name} must be positive, got {getattr(self, name)!r}")
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"ModelConfig.hidden_size ({self.hidden_size}) must be divisible by "
                f"num_heads ({self.num_heads})"
            )
        if (self.hidden_size // self.num_heads) % 2:
            raise ValueError(
                f"ModelConfig.hidden_size / num_heads ({self.hidden_size // self.num_heads}) must be even "
                "for rotary embeddings"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"ModelConfig.num_heads ({self.num_heads}) must be divisible by "
                f"num_kv_heads ({self.num_kv_heads})"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def to_hf_dict(self) -> dict[str, Any]:
        """The Hugging Face ``config.json`` of the equivalent ``LlamaForCausalLM``."""
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "max_position_embeddings": self.max_position,
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_embeddings,
            "torch_dtype": "float32",
            "hidden_act": "silu",
            "attention_bias": False,
            "mlp_bias": False,
        }

    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any]) -> ModelConfig:
        """Read a Llama/Qwen2-style ``config.json``; missing optional keys take the HF defaults."""
        if d.get("hidden_act", "silu") != "silu":
            raise ValueError(f"config hidden_act must be 'silu', got {d['hidden_act']!r}")
        num_heads = int(d["num_attention_heads"])
        return cls(
            vocab_size=int(d["vocab_size"]),
            hidden_size=int(d["hidden_size"]),
            num_layers=int(d["num_hidden_layers"]),
            num_heads=num_heads,
            num_kv_heads=int(d.get("num_key_value_heads") or num_heads),
            intermediate_size=int(d["intermediate_size"]),
            max_position=int(d.get("max_position_embeddings", 2048)),
            rope_theta=float(d.get("rope_theta", 10000.0)),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            tie_embeddings=bool(d.get("tie_word_embeddings", False)),
        )
