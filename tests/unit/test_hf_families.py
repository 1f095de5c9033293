"""Real Hugging Face layouts: random tiny Llama/Qwen2/Qwen3 models move between transformers and cadence.

For each family a folder written by ``save_pretrained`` (single file or sharded) loads with
``load_checkpoint`` to the same fp32 logits, a folder written by ``save_checkpoint`` opens in
``AutoModelForCausalLM.from_pretrained`` to the same logits, and greedy generation of ``TorchEngine``
equals ``generate(do_sample=False)``.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

transformers = pytest.importorskip(
    "transformers", reason="transformers is needed only to check compatibility with Hugging Face models"
)

from cadence.model.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402
from cadence.model.config import ModelConfig, RopeScaling  # noqa: E402
from cadence.model.engine import SamplingParams, TorchEngine  # noqa: E402
from cadence.model.transformer import Transformer  # noqa: E402

SIZES: dict[str, Any] = dict(
    vocab_size=101,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    max_position_embeddings=256,
)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", {"tie_word_embeddings": False}),
    "llama-rope-llama3": ("LlamaConfig", {"rope_theta": 500000.0, "rope_scaling": LLAMA3_ROPE}),
    "llama-rope-linear-bias": (
        "LlamaConfig",
        {"rope_scaling": {"rope_type": "linear", "factor": 4.0}, "attention_bias": True},
    ),
    "qwen2-tied": ("Qwen2Config", {"tie_word_embeddings": True, "rope_theta": 1000000.0}),
    "qwen2-untied": ("Qwen2Config", {"tie_word_embeddings": False}),
    "qwen3": ("Qwen3Config", {"head_dim": 32, "tie_word_embeddings": True}),
}
ATOL = 1e-4
EOS = 7


@pytest.fixture(autouse=True)
def _threads() -> None:
    torch.set_num_threads(2)


@functools.cache
def _hf_model(variant: str) -> Any:
    """A shared random model of ``variant`` (tests must not change it)."""
    return _build_hf_model(variant)


def _build_hf_model(variant: str) -> Any:
    """A random tiny transformers model whose every weight (biases, norms too) is away from its init."""
    config_cls, extra = VARIANTS[variant]
    config = getattr(transformers, config_cls)(**SIZES, **extra)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(torch.rand(p.shape, generator=generator) + 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.1)
    return model


def _ids(batch: int = 2, length: int = 40) -> torch.Tensor:
    return torch.randint(0, SIZES["vocab_size"], (batch, length), generator=torch.Generator().manual_seed(2))


@torch.no_grad()
def _max_diff(hf: Any, model: Transformer, ids: torch.Tensor) -> float:
    return float((hf(ids).logits.float() - model(ids)).abs().max())


@pytest.mark.parametrize(
    ("variant", "shard"),
    [(v, False) for v in VARIANTS] + [("qwen2-tied", True), ("qwen3", True)],
)
def test_round_trip_with_transformers(variant: str, shard: bool, tmp_path: Path) -> None:
    hf = _hf_model(variant)
    hf.save_pretrained(tmp_path / "hf", **({"max_shard_size": "60KB"} if shard else {}))
    if shard:
        assert (tmp_path / "hf" / "model.safetensors.index.json").is_file()
    model, cfg = load_checkpoint(tmp_path / "hf")
    assert cfg.family == hf.config.model_type
    assert cfg.tie_embeddings == bool(hf.config.tie_word_embeddings)
    ids = _ids()
    assert _max_diff(hf, model, ids) <= ATOL

    out = tmp_path / "cadence"
    save_checkpoint(model, cfg, out, max_shard_bytes=60_000 if shard else None)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == hf.config.architectures
    files = sorted(p.name for p in out.glob("*.safetensors"))
    if shard:
        index = json.loads((out / "model.safetensors.index.json").read_text())
        assert len(files) > 1 and set(index["weight_map"].values()) == set(files)
        stored = set(index["weight_map"])
    else:
        assert files == ["model.safetensors"]
        stored = set(load_file(str(out / "model.safetensors")))
    assert ("lm_head.weight" in stored) != cfg.tie_embeddings
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert _max_diff(reloaded, model, ids) <= ATOL


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_greedy_generation_matches_transformers(variant: str, tmp_path: Path) -> None:
    hf = _hf_model(variant)
    hf.save_pretrained(tmp_path)
    engine = TorchEngine(load_checkpoint(tmp_path)[0], eos_id=EOS)
    params = SamplingParams(max_new_tokens=12, temperature=0.0)
    for prompt in ([1, 5, 9], [3, 14, 15, 92, 65, 35, 89, 79]):
        ours = engine.generate(prompt, [0], params)[0].tokens
        with torch.no_grad():
            theirs = hf.generate(
                torch.tensor([prompt]),
                do_sample=False,
                max_new_tokens=params.max_new_tokens,
                eos_token_id=EOS,
                pad_token_id=EOS,
            )[0, len(prompt) :]
        assert ours == theirs.tolist()


def test_dtype_argument_and_auto(tmp_path: Path) -> None:
    hf = _build_hf_model("qwen3").to(torch.bfloat16)
    hf.save_pretrained(tmp_path)
    assert load_checkpoint(tmp_path)[0].lm_head.weight.dtype == torch.float32
    model, _ = load_checkpoint(tmp_path, dtype="auto")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model.inv_freq.dtype == torch.float32
    ids = _ids()
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf(ids).logits.float(), atol=0.05, rtol=0)


def test_unsupported_keys_are_named() -> None:
    base = ModelConfig(vocab_size=11).to_hf_dict()
    cases: list[tuple[dict[str, Any], str]] = [
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling"),
        ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "rope_scaling"),
        ({"model_type": "mistral"}, "model_type"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"mlp_bias": True}, "mlp_bias"),
        ({"model_type": "qwen2", "use_sliding_window": True}, "use_sliding_window"),
    ]
    for change, key in cases:
        with pytest.raises(ValueError, match=key):
            ModelConfig.from_hf_dict({**base, **change})
    cfg = ModelConfig(vocab_size=11, family="qwen3", head_dim=32, rope_scaling=RopeScaling("linear", 2.0))
    assert ModelConfig.from_hf_dict(cfg.to_hf_dict()) == cfg
