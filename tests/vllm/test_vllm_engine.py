"""The vLLM engine on a tiny random Llama: seeding, eos, raw log-probs (with a nucleus) against
cadence's own transformer, versions loaded in place whose weights are exactly the published ones, and
groups handed back as their requests finish, a stopped group's requests aborted.
Without a nucleus the log-probs are tempered: `test_vllm_tempered.py`, with an engine of its own."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import Tensor

from cadence.config import RunConfig, load_config
from cadence.launch.build import make_model, make_tokenizer
from cadence.model.checkpoint import state_dict_to_bytes
from cadence.model.config import ModelConfig
from cadence.model.engine import Completion, SamplingParams
from cadence.model.hf_state import hf_state_dict
from cadence.model.transformer import Transformer
from cadence.model.vllm_engine import VllmEngine
from tests.vllm.helpers import VLLM_MARKS, module_engine

pytestmark = [*VLLM_MARKS, pytest.mark.timeout(600)]

# head_dim 32: a head size vLLM's CPU attention supports
SHAPE = ["model.hidden_size=128", "model.num_heads=4", "model.num_kv_heads=2", "model.intermediate_size=256"]
SAMPLING = ["rollout.max_new_tokens=12", "rollout.temperature=0.7", "rollout.top_p=0.9"]
PROMPT_TEXT = "37"
SEEDS = list(range(101, 117))


@pytest.fixture(scope="module")
def cfg() -> RunConfig:
    return load_config(None, ["rollout.engine='vllm'", "vllm.kv_cache_mib=64", *SHAPE, *SAMPLING])


@pytest.fixture(scope="module")
def engine(cfg: RunConfig) -> Iterator[VllmEngine]:
    yield from module_engine(cfg)


@pytest.fixture(scope="module")
def model_cfg(cfg: RunConfig) -> ModelConfig:
    return make_model(cfg, make_tokenizer(cfg))[1]


def random_model(cfg: ModelConfig, seed: int) -> Transformer:
    """Weights large enough that the model has preferences (the default init is nearly uniform)."""
    model = Transformer(cfg)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.endswith("norm.weight"):
                p.normal_(0.0, 0.3, generator=generator)
    return model.eval()


def prompt(cfg: RunConfig) -> list[int]:
    return make_tokenizer(cfg).encode_prompt(PROMPT_TEXT)


@torch.no_grad()
def teacher_forced(
    model: Transformer, prompt: list[int], tokens: list[int], temperature: float = 1.0
) -> list[float]:
    logits = model(torch.tensor([prompt + tokens]))[0, len(prompt) - 1 : -1] / temperature
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(tokens)[:, None]).squeeze(1).tolist()


def vllm_parameters(engine: VllmEngine) -> dict[str, Tensor]:
    """The weights the engine generates with, read in its worker. On the CPU vLLM packs each linear
    layer's weight for its GEMM kernel (and empties the parameter): those are read by applying the
    layer's kernel to the identity matrix, which gives back exactly the weight it multiplies by."""

    @torch.no_grad()
    def read(worker: Any) -> dict[str, Tensor]:
        out: dict[str, Tensor] = {}
        for module_name, module in worker.model_runner.model.named_modules():
            for name, p in module.named_parameters(recurse=False):
                key = f"{module_name}.{name}"
                if name == "weight" and hasattr(module, "cpu_linear") and "embed_tokens" not in key:
                    k = p.shape[1] if p.dim() == 2 else module.input_size_per_partition
                    p = module.cpu_linear(torch.eye(k, dtype=p.dtype), p, None).T
                out[key] = p.detach().to("cpu", copy=True)
        return out

    return dict(engine.llm.collective_rpc(read)[0])


def unfused(params: dict[str, Tensor], cfg: ModelConfig) -> dict[str, Tensor]:
    """vLLM's fused qkv and gate_up projections split back into HF names; the vocab padding cut."""
    out: dict[str, Tensor] = {}
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    for name, p in params.items():
        if name.endswith("qkv_proj.weight"):
            base = name.removesuffix("qkv_proj.weight")
            for part, t in zip(("q", "k", "v"), p.split([q, kv, kv]), strict=True):
                out[f"{base}{part}_proj.weight"] = t
        elif name.endswith("gate_up_proj.weight"):
            base = name.removesuffix("gate_up_proj.weight")
            gate, up = p.split([cfg.intermediate_size, cfg.intermediate_size])
            out[f"{base}gate_proj.weight"], out[f"{base}up_proj.weight"] = gate, up
        elif name.endswith(("embed_tokens.weight", "lm_head.weight")):
            out[name] = p[: cfg.vocab_size]
        else:
            out[name] = p
    return out


def check_sample(c: Completion, eos: int, max_new_tokens: int) -> None:
    assert 1 <= len(c.tokens) <= max_new_tokens and len(c.logprobs) == len(c.tokens)
    assert eos not in c.tokens[:-1]
    assert c.finished == (c.tokens[-1] == eos)
    assert c.finished or len(c.tokens) == max_new_tokens


def test_samples_are_reproducible_and_depend_only_on_their_seed(
    engine: VllmEngine, cfg: RunConfig, model_cfg: ModelConfig
) -> None:
    engine.load_state(hf_state_dict(random_model(model_cfg, seed=1)))
    ids = prompt(cfg)
    first = engine.generate(ids, SEEDS)
    assert engine.generate(ids, SEEDS) == first
    assert engine.generate(ids, SEEDS[3:5]) == first[3:5]
    assert len({tuple(c.tokens) for c in first}) > len(SEEDS) // 2
    assert engine.generate(ids, []) == []


def test_eos_ends_a_sample_and_is_kept(engine: VllmEngine, cfg: RunConfig, model_cfg: ModelConfig) -> None:
    engine.load_state(hf_state_dict(random_model(model_cfg, seed=1)))
    eos = make_tokenizer(cfg).eos_id
    out = engine.generate(prompt(cfg), SEEDS * 4)
    for c in out:
        check_sample(c, eos, cfg.rollout.max_new_tokens)
    assert any(c.finished for c in out) and not all(c.finished for c in out)


def test_with_a_nucleus_logprobs_are_the_models_untempered_ones(
    engine: VllmEngine, cfg: RunConfig, model_cfg: ModelConfig
) -> None:
    model = random_model(model_cfg, seed=1)
    engine.load_state(hf_state_dict(model))
    ids = prompt(cfg)
    for c in engine.generate(ids, SEEDS):
        assert c.logprobs == pytest.approx(teacher_forced(model, ids, c.tokens), abs=2e-4)


def test_a_new_version_is_exactly_the_published_weights(
    engine: VllmEngine, cfg: RunConfig, model_cfg: ModelConfig
) -> None:
    v1, v2 = random_model(model_cfg, seed=1), random_model(model_cfg, seed=2)
    ids = prompt(cfg)
    engine.load(state_dict_to_bytes(v1))
    sampled_v1 = engine.generate(ids, SEEDS)
    params, engine.params = engine.params, SamplingParams(max_new_tokens=12, temperature=0.0)
    try:
        greedy_v1 = engine.generate(ids, [0])[0]
        engine.load(state_dict_to_bytes(v2))
        published = hf_state_dict(v2)
        if model_cfg.tie_embeddings:  # the head vLLM multiplies by must be the new embeddings
            published["lm_head.weight"] = published["model.embed_tokens.weight"]
        loaded = unfused(vllm_parameters(engine), model_cfg)
        assert sorted(loaded) == sorted(published)
        for name, tensor in published.items():
            assert torch.equal(loaded[name], tensor), name
        greedy_v2 = engine.generate(ids, [0])[0]
    finally:
        engine.params = params
    assert greedy_v2.logprobs == pytest.approx(teacher_forced(v2, ids, greedy_v2.tokens), abs=2e-4)
    assert greedy_v2.logprobs != pytest.approx(greedy_v1.logprobs, abs=1e-3)
    with torch.no_grad():  # greedy: each token is the argmax of version 2's logits
        logits = v2(torch.tensor([ids + greedy_v2.tokens]))[0, len(ids) - 1 : -1]
    assert greedy_v2.tokens == logits.argmax(-1).tolist()[: len(greedy_v2.tokens)]
    engine.load(state_dict_to_bytes(v1))  # and back: the same samples as before, bit for bit
    assert engine.generate(ids, SEEDS) == sampled_v1


@pytest.fixture
def steps(engine: VllmEngine, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The requests vLLM holds before each of its steps from now on (a list the test reads)."""
    core = engine.llm.llm_engine
    step = core.step
    held: list[int] = []

    def counted() -> Any:
        held.append(core.get_num_unfinished_requests())
        return step()

    monkeypatch.setattr(core, "step", counted)
    return held


def by_length(engine: VllmEngine, ids: list[int]) -> list[int]:
    """Seeds in order of their sample's length (then seed) on this backend, shortest first."""
    seeds = list(range(101, 165))
    alone = engine.generate(ids, seeds)
    return [s for _, s in sorted((len(c.tokens), s) for s, c in zip(seeds, alone, strict=True))]


def groups_of(engine: VllmEngine, cfg: RunConfig) -> list[tuple[list[int], list[int]]]:
    """Groups that end at different steps: two of the longest samples, the shortest, none, ..."""
    ids = prompt(cfg)
    seeds = by_length(engine, ids)
    return [(ids, seeds[-2:]), (ids, seeds[:3]), (ids, []), (ids, seeds[20:23]), (ids, seeds[-5:-2])]


def test_each_group_is_told_as_its_last_request_finishes(
    engine: VllmEngine, cfg: RunConfig, model_cfg: ModelConfig, steps: list[int]
) -> None:
    engine.load_state(hf_state_dict(random_model(model_cfg, seed=1)))
    groups = groups_of(engine, cfg)
    plain = engine.generate_many(groups)
    steps.clear()
    told: list[tuple[int, list[Completion], int]] = []  # (group, completions, steps so far)
    got = engine.generate_many(groups, ended=lambda i, c: told.append((i, c, len(steps))))
    assert got == plain
    assert all(completions == got[i] for i, completions, _ in told)
    # every request starts at the first step and gives a token a step: a group ends with its longest
    end = {i: max((len(c.tokens) for c in group), default=0) for i, group in enumerate(got)}
    assert [i for i, _, _ in told] == sorted(end, key=lambda i: (end[i], i))
    assert told[0] == (2, [], 0)  # no seeds: told before any step
    assert len({seen - end[i] for i, _, seen in told[1:]}) == 1  # at the step of its last token
    assert told[1][2] < len(steps)  # the short group was told while the others went on


def test_a_stopped_groups_requests_are_aborted_and_it_is_never_told(
    engine: VllmEngine, cfg: RunConfig, model_cfg: ModelConfig, steps: list[int]
) -> None:
    engine.load_state(hf_state_dict(random_model(model_cfg, seed=1)))
    groups = groups_of(engine, cfg)
    plain = engine.generate_many(groups)
    assert all(len(c.tokens) > 3 for c in plain[0])  # none of group 0's requests ends by the third step
    steps.clear()
    held_at_stop: list[int] = []

    def stopped() -> set[int]:  # group 0 from the third poll on, with groups that ended already
        if len(steps) < 3:
            return set()
        held_at_stop.append(engine.llm.llm_engine.get_num_unfinished_requests())
        return {0, 1, 2}

    told: list[int] = []
    got = engine.generate_many(groups, ended=lambda i, _: told.append(i), stopped=stopped)
    assert got[0] == [] and 0 not in told and sorted(told) == [1, 2, 3, 4]
    assert got[1:] == plain[1:]
    assert steps[3] == held_at_stop[0] - len(groups[0][1])  # its requests left vLLM at once
    assert not engine.llm.llm_engine.has_unfinished_requests()


def test_stopping_every_group_left_returns_at_once(
    engine: VllmEngine, cfg: RunConfig, model_cfg: ModelConfig, steps: list[int]
) -> None:
    engine.load_state(hf_state_dict(random_model(model_cfg, seed=1)))
    groups = groups_of(engine, cfg)
    plain = engine.generate_many(groups)
    full = len(steps)
    steps.clear()
    got = engine.generate_many(groups, stopped=lambda: set(range(5)) if len(steps) >= 2 else set())
    assert len(steps) == 2 < full
    assert got == [[], plain[1], [], [], []]  # group 1 had ended at the first step: kept
    assert not engine.llm.llm_engine.has_unfinished_requests()
    assert engine.generate_many(groups) == plain


def test_an_error_in_a_callback_leaves_no_request_in_vllm(
    engine: VllmEngine, cfg: RunConfig, model_cfg: ModelConfig
) -> None:
    engine.load_state(hf_state_dict(random_model(model_cfg, seed=1)))
    groups = groups_of(engine, cfg)

    def ended(i: int, _: list[Completion]) -> None:
        if i == 1:
            raise RuntimeError("the caller failed")

    with pytest.raises(RuntimeError, match="the caller failed"):
        engine.generate_many(groups, ended=ended)
    assert not engine.llm.llm_engine.has_unfinished_requests()


def test_torch_workers_do_not_import_vllm() -> None:
    code = (
        "import sys; from cadence.launch.build import make_engine, make_tokenizer; from cadence.config import"
        " load_config; cfg = load_config(None); make_engine(cfg, make_tokenizer(cfg));"
        " assert 'vllm' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
