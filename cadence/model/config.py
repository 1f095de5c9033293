"""Model shape.

Invariant: a ``ModelConfig`` that exists is buildable (every size positive, kv heads divide the
heads, the head size even; without an explicit ``head_dim`` the heads divide the hidden size) and
survives ``from_hf_dict(to_hf_dict())`` unchanged, so a checkpoint's ``config.json`` is a config of
its family (Llama, Qwen2, Qwen3) that Hugging Face transformers reads as the same model. A key of a
Hugging Face config that would change the arithmetic and is not supported is refused by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# family -> (model_type, architecture); the family decides which HF class a checkpoint opens as
FAMILIES: dict[str, tuple[str, str]] = {
    "llama": ("llama", "LlamaForCausalLM"),
    "qwen2": ("qwen2", "Qwen2ForCausalLM"),
    "qwen3": ("qwen3", "Qwen3ForCausalLM"),
}
ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class RopeScaling:
    """A ``rope_scaling`` of ``config.json``: ``linear`` (positions / factor) or ``llama3`` (Llama 3.1+)."""

    rope_type: str
    factor: float
    low_freq_factor: float = 1.0  # llama3 only
    high_freq_factor: float = 4.0  # llama3 only
    original_max_position: int = 8192  # llama3 only

    def __post_init__(self) -> None:
        if self.rope_type not in ("linear", "llama3"):
            raise ValueError(f"RopeScaling.rope_type must be 'linear' or 'llama3', got {self.rope_type!r}")
        if not float(self.factor) > 0:
            raise ValueError(f"RopeScaling.factor must be positive, got {self.factor!r}")
        if self.rope_type == "llama3" and not 0 < self.low_freq_factor < self.high_freq_factor:
            raise ValueError(
                f"RopeScaling needs 0 < low_freq_factor < high_freq_factor, got "
                f"{self.low_freq_factor!r} and {self.high_freq_factor!r}"
            )

    def to_hf_dict(self) -> dict[str, Any]:
        if self.rope_type == "linear":
            return {"rope_type": "linear", "factor": self.factor}
        return {
            "rope_type": "llama3",
            "factor": self.factor,
            "low_freq_factor": self.low_freq_factor,
            "high_freq_factor": self.high_freq_factor,
            "original_max_position_embeddings": self.original_max_position,
        }

    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any] | None, max_position: int) -> RopeScaling | None:
        """Parse ``rope_scaling`` (or transformers 5's ``rope_parameters``); None for plain rotary."""
        if not d:
            return None
        rope_type = d.get("rope_type", d.get("type", "default"))
        if rope_type not in ROPE_TYPES:
            raise ValueError(
                f"config rope_scaling type {rope_type!r} is not supported; supported: {list(ROPE_TYPES)}"
            )
        if float(d.get("partial_rotary_factor", 1.0)) != 1.0:
            raise ValueError("config rope_scaling partial_rotary_factor other than 1.0 is not supported")
        if rope_type == "default":
            return None
        if rope_type == "linear":
            return cls("linear", float(d["factor"]))
        return cls(
            "llama3",
            float(d["factor"]),
            low_freq_factor=float(d["low_freq_factor"]),
            high_freq_factor=float(d["high_freq_factor"]),
            original_max_position=int(d.get("original_max_position_embeddings") or max_position),
        )


@dataclass(frozen=True)
class ModelConfig:
    """Sizes and variant of a Llama/Qwen2/Qwen3-family decoder-only transformer.

    ``head_dim`` 0 means ``hidden_size // num_heads`` (it reads back resolved). ``attention_bias`` puts
    biases on q/k/v (and on o, except in Qwen2, which always has q/k/v biases and never an o bias).
    Qwen3 adds an RMS norm per head on queries and keys before rotary (``qk_norm``).
    """

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
    family: str = "llama"
    head_dim: int = 0
    attention_bias: bool = False
    rope_scaling: RopeScaling | None = None

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
        if self.family not in FAMILIES:
            raise ValueError(f"ModelConfig.family must be one of {sorted(FAMILIES)}, got {self.family!r}")
        if self.family == "qwen2" and not self.attention_bias:
            raise ValueError(
                "ModelConfig.attention_bias must be True for family 'qwen2' (q/k/v always have biases)"
            )
        if not isinstance(self.head_dim, int) or isinstance(self.head_dim, bool) or self.head_dim < 0:
            raise ValueError(
                f"ModelConfig.head_dim must be a positive integer or 0 (derived), got {self.head_dim!r}"
            )
        if self.head_dim == 0:
            if self.hidden_size % self.num_heads:
                raise ValueError(
                    f"ModelConfig.hidden_size ({self.hidden_size}) must be divisible by "
                    f"num_heads ({self.num_heads})"
                )
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        if self.head_dim % 2:
            raise ValueError(f"ModelConfig.head_dim ({self.head_dim}) must be even for rotary embeddings")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"ModelConfig.num_heads ({self.num_heads}) must be divisible by "
                f"num_kv_heads ({self.num_kv_heads})"
            )

    @property
    def qk_norm(self) -> bool:
        return self.family == "qwen3"

    @property
    def o_proj_bias(self) -> bool:
        return self.attention_bias and self.family != "qwen2"

    def to_hf_dict(self) -> dict[str, Any]:
        """The Hugging Face ``config.json`` of the equivalent ``LlamaForCausalLM``/``Qwen2…``/``Qwen3…``."""
        model_type, architecture = FAMILIES[self.family]
        d: dict[str, Any] = {
            "architectures": [architecture],
            "model_type": model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "max_position_embeddings": self.max_position,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling.to_hf_dict() if self.rope_scaling else None,
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_embeddings,
            "torch_dtype": "float32",
            "hidden_act": "silu",
        }
        if self.family == "llama":
            d.update(attention_bias=self.attention_bias, mlp_bias=False)
        else:
            d.update(use_sliding_window=False, sliding_window=None)
            if self.family == "qwen3":
                d["attention_bias"] = self.attention_bias
        return d

    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any]) -> ModelConfig:
        """Read a Llama/Qwen2/Qwen3 ``config.json``; missing optional keys take the HF defaults."""
        family = _family(d)
        if d.get("hidden_act", "silu") != "silu":
            raise ValueError(f"config hidden_act must be 'silu', got {d['hidden_act']!r}")
        if d.get("mlp_bias"):
            raise ValueError("config mlp_bias=true is not supported")
        if d.get("use_sliding_window") or any(t != "full_attention" for t in d.get("layer_types") or ()):
            raise ValueError("config use_sliding_window / sliding layer_types are not supported")
        num_heads = int(d["num_attention_heads"])
        max_position = int(d.get("max_position_embeddings", 2048))
        rope = d.get("rope_parameters") or {}  # transformers >= 5 keeps rope_theta in here
        if rope and not isinstance(rope.get("rope_type", rope.get("type", "")), str):
            raise ValueError("config rope_parameters per layer type are not supported")
        rope_theta = float(rope.get("rope_theta", d.get("rope_theta", 10000.0)))
        return cls(
            vocab_size=int(d["vocab_size"]),
            hidden_size=int(d["hidden_size"]),
            num_layers=int(d["num_hidden_layers"]),
            num_heads=num_heads,
            num_kv_heads=int(d.get("num_key_value_heads") or num_heads),
            intermediate_size=int(d["intermediate_size"]),
            max_position=max_position,
            rope_theta=rope_theta,
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            tie_embeddings=bool(d.get("tie_word_embeddings", False)),
            family=family,
            head_dim=int(d.get("head_dim") or 0),
            attention_bias=family == "qwen2" or bool(d.get("attention_bias", False)),
            rope_scaling=RopeScaling.from_hf_dict(rope or d.get("rope_scaling"), max_position),
        )


def _family(d: Mapping[str, Any]) -> str:
    """The family named by ``model_type`` (else ``architectures``); a config naming neither is Llama."""
    by_type = {model_type: family for family, (model_type, _) in FAMILIES.items()}
    by_arch = {arch: family for family, (_, arch) in FAMILIES.items()}
    if "model_type" in d:
        if d["model_type"] not in by_type:
            raise ValueError(
                f"config model_type {d['model_type']!r} is not supported; supported: {sorted(by_type)}"
            )
        return by_type[d["model_type"]]
    for arch in d.get("architectures") or ():
        if arch in by_arch:
            return by_arch[arch]
    if d.get("architectures"):
        raise ValueError(
            f"config architectures {d['architectures']!r} are not supported; supported: {sorted(by_arch)}"
        )
    return "llama"
