"""The transformer, its config, tokenizer and checkpoints: pure functions on a tiny model on CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from cadence.model.checkpoint import (
    load_checkpoint,
    save_checkpoint,
    state_dict_from_bytes,
    state_dict_to_bytes,
)
from cadence.model.config import ModelConfig
from cadence.model.hf_state import load_hf_state_dict
from cadence.model.tokenizer import CharTokenizer
from cadence.model.transformer import KVCache, init_model

CFG = ModelConfig(
    vocab_size=23, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64
)


@pytest.fixture(autouse=True)
def _threads() -> None:
    torch.set_num_threads(2)


def _ids(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, CFG.vocab_size, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_config_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match="num_heads"):
        ModelConfig(vocab_size=10, hidden_size=30, num_heads=4)
    with pytest.raises(ValueError, match="num_kv_heads"):
        ModelConfig(vocab_size=10, num_heads=4, num_kv_heads=3)
    with pytest.raises(ValueError, match="vocab_size"):
        ModelConfig(vocab_size=0)
    assert ModelConfig.from_hf_dict(CFG.to_hf_dict()) == CFG
    assert CFG.to_hf_dict()["architectures"] == ["LlamaForCausalLM"]


def test_forward_shapes_and_dtype() -> None:
    logits = init_model(CFG, seed=0)(_ids(3, 7))
    assert logits.shape == (3, 7, CFG.vocab_size)
    assert logits.dtype == torch.float32


def test_hf_parameter_names() -> None:
    names = set(init_model(CFG, seed=0).state_dict())
    assert "model.embed_tokens.weight" in names and "model.norm.weight" in names
    for part in ("input_layernorm", "post_attention_layernorm"):
        assert f"model.layers.1.{part}.weight" in names
    for proj in ("q", "k", "v", "o"):
        assert f"model.layers.0.self_attn.{proj}_proj.weight" in names
    for proj in ("gate", "up", "down"):
        assert f"model.layers.0.mlp.{proj}_proj.weight" in names
    assert not any(name.endswith("bias") for name in names)


def test_causal_later_tokens_do_not_change_earlier_logits() -> None:
    model = init_model(CFG, seed=0)
    ids = _ids(2, 10)
    changed = ids.clone()
    changed[:, 6:] = (changed[:, 6:] + 1) % CFG.vocab_size
    a, b = model(ids), model(changed)
    torch.testing.assert_close(a[:, :6], b[:, :6])
    assert not torch.allclose(a[:, 6:], b[:, 6:])


def test_kv_cache_decode_matches_full_forward() -> None:
    model = init_model(CFG, seed=1)
    ids = _ids(2, 12)
    full = model(ids)
    for capacity in (None, 16):
        cache = KVCache(capacity=capacity)
        parts = [model(ids[:, :5], cache=cache), model(ids[:, 5:8], cache=cache)]
        parts += [model(ids[:, t : t + 1], cache=cache) for t in range(8, 12)]
        assert cache.length == 12
        torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=1e-5, rtol=0)


def test_cache_segments_are_the_shared_beginning_then_each_segments_own_entries() -> None:
    model = init_model(CFG, seed=1)
    cache = KVCache()
    model(_ids(1, 4 + 3 + 2), cache=cache)
    first, second = cache.segments(4, [3, 2])
    assert (first.length, second.length) == (7, 6)
    for layer, (keys, values) in enumerate(zip(cache._keys, cache._values, strict=True)):
        assert torch.equal(first._keys[layer], keys[:, :, :7])
        assert torch.equal(second._keys[layer], torch.cat([keys[:, :, :4], keys[:, :, 7:9]], 2))
        assert torch.equal(second._values[layer], torch.cat([values[:, :, :4], values[:, :, 7:9]], 2))
    with pytest.raises(ValueError, match="exceed"):
        cache.segments(4, [3, 3])


def test_explicit_causal_mask_equals_default() -> None:
    model = init_model(CFG, seed=2)
    ids = _ids(2, 9)
    causal = torch.ones(9, 9, dtype=torch.bool).tril()
    torch.testing.assert_close(model(ids, attn_mask=causal.expand(2, 9, 9)), model(ids), atol=1e-5, rtol=0)
    torch.testing.assert_close(model(ids, attn_mask=causal.expand(2, 1, 9, 9)), model(ids), atol=1e-5, rtol=0)
    # and a mask is honoured: hiding token 0 from everyone but itself changes the later logits
    blind = causal.clone()
    blind[1:, 0] = False
    assert not torch.allclose(model(ids, attn_mask=blind.expand(2, 9, 9))[:, 1:], model(ids)[:, 1:])
    with pytest.raises(ValueError, match="attn_mask"):
        model(ids, attn_mask=causal[:8].expand(2, 8, 9))


def test_gqa_equals_full_attention_with_repeated_kv_heads() -> None:
    gqa = init_model(CFG, seed=3)
    mha_cfg = ModelConfig(**{**CFG.__dict__, "num_kv_heads": CFG.num_heads})
    mha = init_model(mha_cfg, seed=4)
    state = gqa.state_dict()
    rep, dim = CFG.num_heads // CFG.num_kv_heads, CFG.head_dim
    for key in list(state):
        if key.endswith(("k_proj.weight", "v_proj.weight")):  # query head h reads kv head h // rep
            state[key] = (
                state[key]
                .view(CFG.num_kv_heads, dim, -1)
                .repeat_interleave(rep, 0)
                .reshape(-1, CFG.hidden_size)
            )
    load_hf_state_dict(mha, state)
    ids = _ids(2, 8)
    torch.testing.assert_close(mha(ids), gqa(ids), atol=1e-5, rtol=0)


def test_init_is_deterministic_and_ignores_global_rng() -> None:
    torch.manual_seed(123)
    a = init_model(CFG, seed=7).state_dict()
    torch.manual_seed(456)
    b = init_model(CFG, seed=7).state_dict()
    c = init_model(CFG, seed=8).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])
    assert torch.equal(a["model.norm.weight"], torch.ones(CFG.hidden_size))


def test_checkpoint_round_trip_without_duplicate_tied_head(tmp_path: Path) -> None:
    model = init_model(CFG, seed=5)
    save_checkpoint(model, CFG, tmp_path / "ckpt", extra_files={"tokenizer.json": "{}"})
    stored = load_file(str(tmp_path / "ckpt" / "model.safetensors"))
    assert "lm_head.weight" not in stored and "model.embed_tokens.weight" in stored
    assert json.loads((tmp_path / "ckpt" / "config.json").read_text())["tie_word_embeddings"] is True
    assert (tmp_path / "ckpt" / "tokenizer.json").read_text() == "{}"
    loaded, cfg = load_checkpoint(tmp_path / "ckpt")
    assert cfg == CFG
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    ids = _ids(2, 6)
    torch.testing.assert_close(loaded(ids), model(ids), atol=0, rtol=0)


def test_untied_checkpoint_keeps_head(tmp_path: Path) -> None:
    cfg = ModelConfig(**{**CFG.__dict__, "tie_embeddings": False})
    model = init_model(cfg, seed=6)
    state = state_dict_from_bytes(state_dict_to_bytes(model))
    assert not torch.equal(state["lm_head.weight"], state["model.embed_tokens.weight"])
    save_checkpoint(model, cfg, tmp_path)
    loaded, _ = load_checkpoint(tmp_path)
    ids = _ids(1, 5)
    torch.testing.assert_close(loaded(ids), model(ids), atol=0, rtol=0)


def test_tokenizer_round_trip_and_bad_character() -> None:
    tok = CharTokenizer()
    text = "12+34=?: 46"
    ids = tok.encode(text, bos=True)
    assert ids[0] == tok.bos_id and min(ids[1:]) >= 3
    assert tok.decode(ids) == text
    assert tok.decode([*ids, tok.eos_id], skip_special=False) == "<bos>" + text + "<eos>"
    assert tok.vocab_size == 3 + len("0123456789+-*=?: ")
    assert CharTokenizer.from_dict(tok.to_dict()).encode(text) == tok.encode(text)
    with pytest.raises(ValueError, match="'x'"):
        tok.encode("1x2")


def test_state_bytes_keep_dtype_and_values() -> None:
    model = init_model(CFG, seed=9).to(torch.bfloat16)
    state = state_dict_from_bytes(state_dict_to_bytes(model))
    assert set(state) == set(model.state_dict()) - {"lm_head.weight"}
    reference = model.state_dict()
    assert all(v.dtype == torch.bfloat16 and torch.equal(v, reference[k]) for k, v in state.items())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_state_from_a_bytearray_views_it_and_equals_the_safetensors_reading(dtype: torch.dtype) -> None:
    model = init_model(CFG, seed=4).to(dtype)
    data = state_dict_to_bytes(model)
    buffer = bytearray(data)
    views = state_dict_from_bytes(buffer)
    copies = state_dict_from_bytes(data)
    assert set(views) == set(copies)
    for name, tensor in copies.items():
        assert views[name].dtype == tensor.dtype and views[name].shape == tensor.shape
        assert torch.equal(views[name], tensor), name
    some = views["model.embed_tokens.weight"]
    before = some.flatten()[0].item()
    buffer[:] = bytes(len(buffer))  # views, not copies: a write to the buffer shows through
    assert some.flatten()[0].item() == 0 != before


def test_state_from_a_bytearray_refuses_a_layout_that_overruns_the_data() -> None:
    data = bytearray(state_dict_to_bytes(init_model(CFG, seed=4)))
    with pytest.raises(ValueError, match="overruns|not readable"):
        state_dict_from_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="no header"):
        state_dict_from_bytes(bytearray(b"\x01"))
