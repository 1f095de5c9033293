"""Low-rank adapters: the adapted forward against the merged model's, the learner training adapters
alone, versions of adapters loaded by the built-in engine, the PEFT folder read back."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from cadence.config import ConfigError, load_config
from cadence.launch.build import make_tokenizer, make_torch_learner, version_figures
from cadence.launch.evaluate import merged_model
from cadence.model.checkpoint import tensors_to_bytes
from cadence.model.config import ModelConfig
from cadence.model.engine import SamplingParams, TorchEngine
from cadence.model.hf_state import hf_state_dict, load_hf_state_dict
from cadence.model.lora import (
    LoraLinear,
    LoraSpec,
    adapter_tensors,
    apply_lora,
    base_tensors,
    merge_adapters,
    trainable_count,
)
from cadence.model.lora_engine import LoraRolloutEngine
from cadence.model.lora_files import adapter_bytes, read_adapter_bytes, read_peft, write_peft
from cadence.model.lora_flat import FlatAdapters
from cadence.model.rollout_engine import TorchRolloutEngine
from cadence.model.tokenizer import CharTokenizer
from cadence.model.transformer import Transformer, init_model
from cadence.training.learner import TorchLearner, TrainGroup
from cadence.training.lora_learner import LoraLearner
from tests.unit.test_prefix import CONFIGS, make_groups

SPEC = LoraSpec(rank=4, alpha=8.0)
REWARDS = [[1.0, 0.0, 0.5, 0.0], [0.0, 0.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.2, 0.4, 0.6, 0.8]]
SETTINGS = dict(lr=1e-2, weight_decay=0.0, clip_low=0.2, clip_high=0.28, kl_beta=0.0, max_grad_norm=1.0)


@pytest.fixture(autouse=True)
def _threads() -> None:
    torch.set_num_threads(2)


def adapted(cfg: ModelConfig, spec: LoraSpec = SPEC) -> Transformer:
    """A model with adapters whose B is random (not the zero start), so the adapters matter."""
    model = init_model(cfg, seed=3)
    apply_lora(model, spec, seed=7)
    generator = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for name, p in adapter_tensors(model).items():
            if name.endswith("lora_B.weight"):
                p.copy_(torch.randn(p.shape, generator=generator) * 0.05)
    return model


def merged_copy(model: Transformer, spec: LoraSpec = SPEC) -> Transformer:
    plain = Transformer(model.cfg)
    load_hf_state_dict(plain, merge_adapters(base_tensors(model), adapter_tensors(model), spec.scale))
    return plain


def batch() -> list[TrainGroup]:
    return [TrainGroup(p, c, r) for (p, c), r in zip(make_groups(3), REWARDS, strict=True)]


def lora_learner(packing: str = "shared_prompt", **kw: object) -> LoraLearner:
    cfg = CONFIGS["qwen3"]
    settings: dict[str, Any] = dict(SETTINGS, packing=packing) | kw
    return LoraLearner(init_model(cfg, 5), cfg, CharTokenizer(), lora=SPEC, seed=1, base="b0", **settings)


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_the_adapted_forward_equals_the_merged_models(family: str) -> None:
    model = adapted(CONFIGS[family])
    ids = torch.randint(1, 20, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        lora, merged = model(ids), merged_copy(model)(ids)
        base = init_model(CONFIGS[family], seed=3)(ids)
    assert (lora - base).abs().max() > 1e-3  # the adapters change the logits: the check has teeth
    assert (lora - merged).abs().max() <= 1e-5


def test_adapters_keep_the_base_names_and_freeze_everything_else() -> None:
    model = init_model(CONFIGS["llama"], seed=3)
    before = hf_state_dict(model)
    apply_lora(model, LoraSpec(2, 4.0, targets=("q_proj", "down_proj")), seed=0)
    assert isinstance(model.get_submodule("model.layers.0.self_attn.q_proj"), LoraLinear)
    assert not isinstance(model.get_submodule("model.layers.0.self_attn.k_proj"), LoraLinear)
    assert set(base_tensors(model)) == set(before)
    names = set(adapter_tensors(model))
    assert "model.layers.1.mlp.down_proj.lora_B.weight" in names and len(names) == 2 * 2 * 2
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == names
    cfg = CONFIGS["llama"]
    expected = (
        cfg.num_layers
        * 2
        * ((cfg.hidden_size + cfg.num_heads * cfg.head_dim) + cfg.intermediate_size + cfg.hidden_size)
    )
    assert trainable_count(model) == expected


@pytest.mark.parametrize(
    ("packing", "precision", "kl_beta"),
    [("shared_prompt", "fp32", 0.1), ("prefix_cache", "fp32", 0.0), ("padded", "bf16", 0.0)],
)
def test_the_learner_moves_the_adapters_alone(packing: str, precision: str, kl_beta: float) -> None:
    learner = lora_learner(packing, precision=precision, kl_beta=kl_beta)
    base = {k: v.clone() for k, v in base_tensors(learner.model).items()}
    start = {k: v.clone() for k, v in learner.tensors().items()}
    stats = learner.train_groups(batch())
    assert stats["computed_tokens"] > 0
    learner.step(normaliser=10.0)
    after = base_tensors(learner.model)
    assert all(torch.equal(base[k], after[k]) for k in base)
    moved = [k for k, v in learner.tensors().items() if not torch.equal(v, start[k])]
    assert any(k.endswith("lora_B.weight") for k in moved)
    assert set(learner.optimizer.state) <= set(learner.trainable())


@pytest.mark.parametrize("kl_beta", [0.0, 0.1])
def test_a_bf16_base_trains_the_adapters_as_a_float32_one_under_bf16_autocast(kl_beta: float) -> None:
    """`trainer.lora.base_dtype = "bfloat16"`: the adapted projections' bases (the reference's too)
    take half the bytes, and two steps give the same losses and adapters bit for bit."""
    learners = [
        lora_learner(precision="bf16", kl_beta=kl_beta, base_dtype=d) for d in ("float32", "bfloat16")
    ]
    losses = []
    for learner in learners:
        for _ in range(2):
            losses.append(learner.train_groups(batch())["loss_sum"])
            learner.step(normaliser=10.0)
    assert losses[:2] == losses[2:]
    wide, narrow = (learner.tensors() for learner in learners)
    assert all(torch.equal(wide[k], narrow[k]) for k in wide)
    assert any(k.endswith("lora_B.weight") and bool(v.abs().max() > 0) for k, v in wide.items())  # moved
    bases = [
        {n: m.weight for n, m in learner.model.named_modules() if isinstance(m, LoraLinear)}
        for learner in learners
    ]
    assert {w.dtype for w in bases[1].values()} == {torch.bfloat16}
    assert all(torch.equal(bases[0][n].to(torch.bfloat16), w) for n, w in bases[1].items())
    held = [sum(w.numel() * w.element_size() for w in b.values()) for b in bases]
    assert held[1] * 2 == held[0]
    if kl_beta > 0:
        reference = learners[1].reference
        assert reference is not None
        assert {m.weight.dtype for m in reference.modules() if isinstance(m, LoraLinear)} == {torch.bfloat16}


def test_a_bf16_base_needs_bf16_autocast_naming_both_keys() -> None:
    with pytest.raises(
        ValueError, match="trainer.lora.base_dtype = 'bfloat16' needs trainer.precision = 'bf16'"
    ):
        lora_learner(base_dtype="bfloat16")
    with pytest.raises(ConfigError, match="trainer.lora.base_dtype = 'bfloat16' needs trainer.precision"):
        load_config(None, ["trainer.lora.rank=4", "trainer.lora.base_dtype='bfloat16'"])
    cfg = load_config(
        None, ["trainer.lora.rank=4", "trainer.lora.base_dtype='bfloat16'", "trainer.precision='bf16'"]
    )
    assert cfg.trainer.lora.base_dtype == "bfloat16"


def test_a_learner_without_adapters_steps_every_weight_as_before() -> None:
    cfg = CONFIGS["qwen3"]
    full = TorchLearner(init_model(cfg, 5), cfg, CharTokenizer(), **SETTINGS)  # type: ignore[arg-type]
    assert len(full.trainable()) == len(list(full.model.parameters()))


def test_a_version_is_the_adapters_with_the_spec_and_the_base_in_its_header() -> None:
    learner = lora_learner()
    data = learner.weights(dtype="bfloat16")
    adapters, scale, base = read_adapter_bytes(bytes(data))
    assert base == "b0" and scale == SPEC.scale
    assert set(adapters) == set(learner.tensors()) and all(
        t.dtype == torch.bfloat16 for t in adapters.values()
    )
    body = sum(t.numel() for t in adapters.values()) * 2
    assert body == trainable_count(learner.model) * 2 and len(data) < body + 4096  # the header is small
    assert body < sum(t.numel() for t in hf_state_dict(learner.model).values()) * 2 / 2
    other = adapter_bytes(learner.tensors(), SPEC, "b1")
    assert other != learner.weights()  # the base's identity is part of the bytes, so of the digest
    with pytest.raises(ValueError, match="without adapters"):
        read_adapter_bytes(bytes(tensors_to_bytes(base_tensors(learner.model))))


def test_each_version_is_the_adapters_as_they_are_after_the_step_and_a_resume() -> None:
    """The learner keeps a version's layout: what it writes after a step, a load and in another dtype
    is byte for byte what a fresh serialisation of its adapters then gives."""
    learner = lora_learner()
    first = bytes(learner.weights())
    learner.train_groups(batch())
    learner.step(normaliser=10.0)
    second = bytes(learner.weights())
    assert second != first and second == bytes(adapter_bytes(learner.tensors(), SPEC, "b0"))
    moved = {k: v.clone() + 1.0 for k, v in learner.tensors().items()}
    learner.load(moved, learner.optimizer.state_dict())
    assert bytes(learner.weights()) == bytes(adapter_bytes(moved, SPEC, "b0"))
    assert bytes(learner.weights(dtype="bfloat16")) == bytes(
        adapter_bytes(moved, SPEC, "b0", dtype="bfloat16")
    )


def engines(base: str = "b0", apply: str = "merge") -> tuple[LoraRolloutEngine, TorchEngine]:
    cfg = CONFIGS["qwen3"]
    params = SamplingParams(max_new_tokens=8, temperature=1.0)
    inner = TorchRolloutEngine(TorchEngine(init_model(cfg, 5), eos_id=2), params)
    return LoraRolloutEngine(inner, SPEC, base, apply), TorchEngine(init_model(cfg, 5), eos_id=2)


@pytest.mark.parametrize("apply", ["merge", "step"])
def test_zero_adapters_leave_the_first_versions_samples_unchanged(apply: str) -> None:
    learner = lora_learner()
    lora, plain = engines(apply=apply)
    lora.load(learner.weights())
    params = SamplingParams(max_new_tokens=8, temperature=1.0)
    prompt, seeds = [1, 5, 9, 4], [3, 4, 5]
    assert lora.generate(prompt, seeds) == plain.generate(prompt, seeds, params)


@pytest.mark.parametrize("apply", ["merge", "step"])
def test_a_compiled_step_samples_what_the_eager_one_does_version_after_version(apply: str) -> None:
    """Adapters merged into the base or applied in the step: the compiled engine draws the eager
    one's samples bit for bit, for a version and for the next one loaded into the same tensors."""
    learner = lora_learner()
    params = SamplingParams(max_new_tokens=8, temperature=1.0)

    def make(compiled: bool) -> LoraRolloutEngine:
        inner = TorchEngine(init_model(CONFIGS["qwen3"], 5), eos_id=2, compiled=compiled)
        return LoraRolloutEngine(TorchRolloutEngine(inner, params), SPEC, "b0", apply)

    eager, compiled = make(False), make(True)
    for _ in range(2):
        learner.train_groups(batch())
        learner.step(normaliser=10.0)
        for engine in (eager, compiled):
            engine.load(bytearray(learner.weights()))
        assert compiled.generate([1, 5, 9, 4], [3, 4, 5]) == eager.generate([1, 5, 9, 4], [3, 4, 5])
    assert compiled.inner.engine.runner.compiled  # no fallback was taken


def test_the_engine_merges_each_version_from_the_base_not_the_last_one() -> None:
    learner = lora_learner()
    learner.train_groups(batch())
    learner.step(normaliser=10.0)
    lora, plain = engines()
    for _ in range(2):  # the same version twice: merged from the base each time, never accumulated
        lora.load(bytearray(learner.weights()))
    expected = merge_adapters(base_tensors(learner.model), learner.tensors(), SPEC.scale)
    load_hf_state_dict(plain.model, expected)
    params = SamplingParams(max_new_tokens=8, temperature=1.0)
    got = hf_state_dict(lora.inner.engine.model)
    assert all(torch.equal(got[k], expected[k]) for k in expected)
    assert lora.generate([1, 5, 9], [1, 2]) == plain.generate([1, 5, 9], [1, 2], params)
    lora.load_state({k: torch.zeros_like(v) for k, v in learner.tensors().items()})
    assert all(torch.equal(hf_state_dict(lora.inner.engine.model)[k], v) for k, v in lora.base_state.items())


def test_a_version_for_another_base_is_refused() -> None:
    lora, _ = engines(base="other")
    with pytest.raises(ValueError, match="trained on base b0, while this engine holds base other"):
        lora.load(lora_learner().weights())


def test_resume_restores_the_adapters_and_the_optimizer_exactly(tmp_path: Path) -> None:
    first = lora_learner()
    first.train_groups(batch())
    first.step(normaliser=10.0)
    first.save_state(tmp_path / "state")
    second = lora_learner()
    second.load_state(tmp_path / "state")
    for learner in (first, second):
        learner.train_groups(batch())
        learner.step(normaliser=10.0)
    a, b = first.tensors(), second.tensors()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_the_final_folder_is_a_peft_adapter_folder(tmp_path: Path) -> None:
    learner = lora_learner()
    learner.train_groups(batch())
    learner.step(normaliser=10.0)
    sha = learner.save(tmp_path / "final")
    adapters, spec, config = read_peft(tmp_path / "final")
    assert len(sha) == 64 and spec == SPEC and config["peft_type"] == "LORA"
    assert sorted(config["target_modules"]) == sorted(SPEC.targets)
    assert all(torch.equal(adapters[k], v) for k, v in learner.tensors().items())
    keys = set(load_file(str(tmp_path / "final" / "adapter_model.safetensors")))
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in keys


def test_a_peft_folder_cadence_cannot_apply_is_refused_naming_the_key(tmp_path: Path) -> None:
    write_peft(tmp_path, lora_learner().tensors(), SPEC, "b0", None)
    config = (tmp_path / "adapter_config.json").read_text().replace('"use_dora": false', '"use_dora": true')
    (tmp_path / "adapter_config.json").write_text(config)
    with pytest.raises(ValueError, match="use_dora"):
        read_peft(tmp_path)


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ("trainer.sharding='fsdp2'", "trainer.sharding = 'fsdp2'"),
        ("trainer.learner='simulated'", "trainer.learner = 'torch'"),
    ],
)
def test_adapters_refuse_what_they_cannot_go_with_naming_both_keys(setting: str, named: str) -> None:
    extra = ["trainer.ranks=2", "trainer.device='cpu'"] if "fsdp2" in setting else []
    with pytest.raises(ConfigError, match="trainer.lora.rank = 4") as err:
        load_config(None, ["trainer.lora.rank=4", setting, *extra])
    assert named in str(err.value)


def test_unknown_or_repeated_targets_are_refused() -> None:
    for targets in ("['q_proj', 'qkv']", "['q_proj', 'q_proj']", "[]"):
        with pytest.raises(ConfigError, match="trainer.lora.targets"):
            load_config(None, [f"trainer.lora.targets={targets}"])


def test_the_run_counts_the_adapters_and_their_bytes_a_version() -> None:
    full = load_config(None, ["rollout.dtype='bfloat16'"])
    lora = load_config(
        None, ["rollout.dtype='bfloat16'", "trainer.lora.rank=2", "trainer.lora.targets=['q_proj']"]
    )
    params, nbytes = version_figures(full)
    m = full.model
    assert nbytes == 2 * params  # every weight, bfloat16 (the quickstart's head is not tied)
    head_dim = m.hidden_size // m.num_heads
    adapters = m.num_layers * 2 * (m.hidden_size + m.num_heads * head_dim)
    assert version_figures(lora) == (adapters, 2 * adapters)


def test_cadence_eval_reads_a_final_adapter_folder_as_the_merged_model(tmp_path: Path) -> None:
    cfg = load_config(None, ["trainer.lora.rank=4", "trainer.lora.alpha=8.0", "trainer.lr=0.05"])
    tokenizer = make_tokenizer(cfg)
    learner = make_torch_learner(cfg, tokenizer, torch.device("cpu"))
    assert isinstance(learner, LoraLearner)
    with torch.no_grad():
        for name, p in learner.tensors().items():
            if name.endswith("lora_B.weight"):
                p.normal_(0.0, 0.1, generator=torch.Generator().manual_seed(1))
    learner.save(tmp_path / "final")
    merged = merged_model(cfg, tokenizer, tmp_path / "final")
    ids = torch.tensor([tokenizer.encode_prompt("37")])
    with torch.no_grad():
        assert (merged(ids) - learner.model(ids)).abs().max() <= 1e-5


def test_the_low_rank_products_in_each_step_generate_as_the_merged_weights() -> None:
    learner = lora_learner()
    with torch.no_grad():
        for name, p in learner.tensors().items():
            if name.endswith("lora_B.weight"):
                p.normal_(0.0, 0.2, generator=torch.Generator().manual_seed(3))
    merged, _ = engines(apply="merge")
    stepped, _ = engines(apply="step")
    for engine in (merged, stepped):
        engine.load(bytearray(learner.weights()))
    ids = torch.tensor([[1, 5, 9, 4, 7, 3]])
    with torch.no_grad():
        diff = (merged.inner.engine.model(ids) - stepped.inner.engine.model(ids)).abs().max()
    assert diff <= 1e-5
    greedy = [([1, 5, 9], [0]), ([4, 4], [1])]
    ours = [g[0] for g in stepped.generate_many(greedy, temperature=0.0)]
    theirs = [g[0] for g in merged.generate_many(greedy, temperature=0.0)]
    assert [c.tokens for c in ours] == [c.tokens for c in theirs]  # the log-probs to float rounding
    pairs = zip(ours, theirs, strict=True)
    assert all(abs(x - y) <= 1e-5 for a, b in pairs for x, y in zip(a.logprobs, b.logprobs, strict=True))
    assert stepped.generate([1, 5, 9], [0, 1]) != engines(apply="step")[0].generate([1, 5, 9], [0, 1])


def test_a_step_mode_version_is_copied_into_the_engines_adapters_leaving_the_base_as_it_was() -> None:
    """Two versions one after the other into the same step-mode engine: its adapters are the second's,
    its base tensors the very ones it had (no copy of them), and what it generates is what an engine
    loaded with the second version alone generates, its trunk computed again."""
    learner = lora_learner()
    with torch.no_grad():
        for name, p in learner.tensors().items():
            if name.endswith("lora_B.weight"):
                p.normal_(0.0, 0.2, generator=torch.Generator().manual_seed(4))
    first = bytearray(learner.weights())
    with torch.no_grad():
        for name, p in learner.tensors().items():
            if name.endswith("lora_B.weight"):
                p.mul_(-1.5)
    second = bytearray(learner.weights())
    stepped, _ = engines(apply="step")
    engine = stepped.inner.engine
    engine.trunk = [1, 5, 9, 4, 7, 3, 8, 6]  # a trunk read by the prompts below, kept a version
    base = {k: t for k, t in hf_state_dict(engine.model).items() if ".lora_" not in k}
    stepped.load(first)
    before = stepped.generate(engine.trunk + [2, 11], [0, 1])
    stepped.load(second)
    after = hf_state_dict(engine.model)
    assert all(after[k].data_ptr() == t.data_ptr() and torch.equal(after[k], t) for k, t in base.items())
    adapters, _, _ = read_adapter_bytes(bytes(second))
    assert all(torch.equal(after[k], t.to(after[k].dtype)) for k, t in adapters.items())
    fresh, _ = engines(apply="step")
    fresh.inner.engine.trunk = list(engine.trunk)
    fresh.load(second)
    assert stepped.generate(engine.trunk + [2, 11], [0, 1]) == fresh.generate(engine.trunk + [2, 11], [0, 1])
    assert before != stepped.generate(engine.trunk + [2, 11], [0, 1])


def test_a_step_mode_engine_loads_later_versions_of_one_layout_in_one_copy() -> None:
    """After its first version a step-mode engine's adapters view one buffer; a version of the same
    header is copied into it whole and gives what parsing it gives; one of another header (another
    base, another dtype) is parsed as before: refused, or loaded adapter by adapter."""
    learner = lora_learner()
    stepped, _ = engines(apply="step")
    versions = []
    for scale in (0.2, 1.5, 0.7):
        with torch.no_grad():
            for name, p in learner.tensors().items():
                if name.endswith("lora_B.weight"):
                    p.normal_(0.0, scale, generator=torch.Generator().manual_seed(4))
        versions.append(bytearray(learner.weights()))
    stepped.load(versions[0])
    flat = stepped._flat
    assert flat is not None
    model = stepped.inner.engine.model
    start, end = flat.flat.data_ptr(), flat.flat.data_ptr() + flat.flat.numel()
    assert all(start <= p.data_ptr() < end for n, p in model.named_parameters() if ".lora_" in n)
    for version in versions[1:]:
        assert flat.load(version)  # the same header: one copy
        fresh, _ = engines(apply="step")
        fresh.load(version)
        stepped.inner.engine.weights_changed()
        assert stepped.generate([1, 5, 9], [0, 1]) == fresh.generate([1, 5, 9], [0, 1])
    other = bytearray(adapter_bytes(learner.tensors(), SPEC, "b1"))
    assert not flat.load(other)
    with pytest.raises(ValueError, match="another base|base b1"):
        stepped.load(other)
    halved = bytearray(learner.weights(dtype="bfloat16"))
    assert not flat.load(halved)
    stepped.load(halved)  # parsed and cast into the adapters, which still view the buffer
    fresh, _ = engines(apply="step")
    fresh.load(halved)
    assert stepped.generate([1, 5, 9], [0, 1]) == fresh.generate([1, 5, 9], [0, 1])
    assert all(start <= p.data_ptr() < end for n, p in model.named_parameters() if ".lora_" in n)


def test_a_version_whose_tensors_do_not_tile_its_body_is_never_laid_out() -> None:
    """Four bytes between the first adapter and the next (every later offset shifted past them): a
    layout that would leave a hole in the buffer is not made, and the engine keeps its own tensors."""
    learner = lora_learner()
    data = bytes(learner.weights())
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + size])
    first = min((e for k, e in header.items() if k != "__metadata__"), key=lambda e: e["data_offsets"][0])
    cut = first["data_offsets"][1]
    for name, entry in header.items():
        if name != "__metadata__" and entry["data_offsets"][0] >= cut:
            entry["data_offsets"] = [entry["data_offsets"][0] + 4, entry["data_offsets"][1] + 4]
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    body = data[8 + size :]
    holed = bytearray(struct.pack("<Q", len(encoded)) + encoded + body[:cut] + bytes(4) + body[cut:])
    stepped, _ = engines(apply="step")
    model = stepped.inner.engine.model
    assert FlatAdapters.lay_out(model, holed) is None
    assert FlatAdapters.lay_out(model, bytearray(data)) is not None
