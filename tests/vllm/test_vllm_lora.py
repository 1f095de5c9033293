"""vLLM with adapter versions: each version a LoRARequest on the unchanged base, generating the greedy
tokens of cadence's own engine with the same version merged in."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from cadence.config import RunConfig, load_config
from cadence.launch.build import (
    base_identity,
    make_engine,
    make_model_config,
    make_tokenizer,
    make_torch_learner,
)
from cadence.model.checkpoint import load_checkpoint, save_checkpoint
from cadence.model.engine import SamplingParams, TorchEngine
from cadence.model.lora_engine import LoraRolloutEngine
from cadence.model.rollout_engine import TorchRolloutEngine
from cadence.model.vllm_lora import VllmLoraEngine
from cadence.training.lora_learner import LoraLearner
from tests.vllm.helpers import VLLM_MARKS
from tests.vllm.test_vllm_engine import SHAPE, random_model

pytestmark = [*VLLM_MARKS, pytest.mark.timeout(600)]

GREEDY = SamplingParams(max_new_tokens=10, temperature=0.0)
LORA = ["trainer.lora.rank=8", "trainer.lora.alpha=16.0"]


@pytest.fixture(scope="module")
def cfg(tmp_path_factory: pytest.TempPathFactory) -> RunConfig:
    plain = load_config(None, SHAPE)
    tokenizer = make_tokenizer(plain)
    folder = tmp_path_factory.mktemp("base")
    shape = make_model_config(plain, tokenizer)
    save_checkpoint(random_model(shape, seed=3), shape, folder, tokenizer.files())
    settings = [
        "rollout.engine='vllm'",
        "vllm.kv_cache_mib=64",
        f"model.checkpoint='{folder}'",
        *SHAPE,
        *LORA,
    ]
    return load_config(None, [*settings, "rollout.max_new_tokens=10", "rollout.temperature=0.0001"])


@pytest.fixture(scope="module")
def engine(cfg: RunConfig) -> Iterator[VllmLoraEngine]:
    built = make_engine(cfg, make_tokenizer(cfg))
    assert isinstance(built, VllmLoraEngine)
    yield built
    del built


def trained(cfg: RunConfig, scale: float) -> LoraLearner:
    learner = make_torch_learner(cfg, make_tokenizer(cfg), torch.device("cpu"))
    assert isinstance(learner, LoraLearner)
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in learner.tensors().items():
            if name.endswith("lora_B.weight"):
                p.copy_(torch.randn(p.shape, generator=generator) * scale)
    return learner


def test_each_version_is_a_lora_request_giving_cadences_greedy_tokens(
    cfg: RunConfig, engine: VllmLoraEngine
) -> None:
    tokenizer = make_tokenizer(cfg)
    ours = LoraRolloutEngine(
        TorchRolloutEngine(
            TorchEngine(load_checkpoint(Path(cfg.model.checkpoint))[0], tokenizer.eos_id), GREEDY
        ),
        engine.spec,
        base_identity(cfg, None),
    )
    prompts = [(tokenizer.encode_prompt(text), [0]) for text in ("37", "5", "81")]
    seen: list[list[list[int]]] = []
    for scale in (0.0, 0.3, 0.6):  # the zero start, then two versions with adapters that matter
        data = trained(cfg, scale).weights()
        engine.load(data)
        ours.load(data)
        got = [g[0].tokens for g in engine.generate_many(prompts, temperature=0.0)]
        assert got == [g[0].tokens for g in ours.generate_many(prompts, temperature=0.0)]
        assert engine.lora_request is not None and engine.lora_request.lora_int_id == len(seen) + 1
        seen.append(got)
    assert seen[1] != seen[0] and seen[2] != seen[1]  # each version's adapters change what is generated


def test_a_version_for_another_base_is_refused(cfg: RunConfig, engine: VllmLoraEngine) -> None:
    data = trained(cfg, 0.1).weights()
    engine.base, base = "another", engine.base
    try:
        with pytest.raises(ValueError, match="vLLM serves base another"):
            engine.load(data)
    finally:
        engine.base = base
