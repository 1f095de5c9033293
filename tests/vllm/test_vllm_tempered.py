"""Without a nucleus, vLLM's sampling log-probs are those of the distribution sampled, softmax(z / T):
the learner's, so its old log-probs may come from the engine. An engine of its own (one vLLM engine
a module: deleting one in a process tears down the parallel groups another would still use)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cadence.config import RunConfig, load_config
from cadence.launch.build import make_model, make_tokenizer
from cadence.model.hf_state import hf_state_dict
from cadence.model.vllm_engine import VllmEngine
from tests.vllm.helpers import VLLM_MARKS, module_engine
from tests.vllm.test_vllm_engine import SEEDS, SHAPE, prompt, random_model, teacher_forced

pytestmark = [*VLLM_MARKS, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def cfg() -> RunConfig:
    return load_config(
        None, ["rollout.engine='vllm'", "vllm.kv_cache_mib=64", *SHAPE, "rollout.temperature=0.7"]
    )


@pytest.fixture(scope="module")
def engine(cfg: RunConfig) -> Iterator[VllmEngine]:
    yield from module_engine(cfg)


def test_logprobs_are_of_the_tempered_distribution_and_of_the_logits_at_a_greedy_step(
    engine: VllmEngine, cfg: RunConfig
) -> None:
    model = random_model(make_model(cfg, make_tokenizer(cfg))[1], seed=1)
    engine.load_state(hf_state_dict(model))
    ids = prompt(cfg)
    for c in engine.generate(ids, SEEDS):
        assert c.logprobs == pytest.approx(teacher_forced(model, ids, c.tokens, 0.7), abs=2e-4)
        assert c.logprobs != pytest.approx(teacher_forced(model, ids, c.tokens), abs=1e-2)
    for c in engine.generate_many([(ids, SEEDS[:2])], temperature=0.0)[0]:
        assert c.logprobs == pytest.approx(teacher_forced(model, ids, c.tokens), abs=2e-4)
