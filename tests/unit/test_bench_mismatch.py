"""`cadence bench mismatch` on a tiny random model: the built-in engine in float32 agrees with the
float32 learner to rounding, bfloat16 sampling leaves a gap orders of magnitude larger, and every
figure is the trainer's own (ops/mismatch.py) over the very tokens sampled."""

from __future__ import annotations

import pytest
import torch

from cadence.bench.mismatch import measure, sample
from cadence.launch.build import make_tokenizer
from tests.conftest import tiny_config


@pytest.fixture(autouse=True)
def _threads() -> None:
    torch.set_num_threads(2)


def test_float32_sampling_is_at_rounding_and_bfloat16_sampling_is_not() -> None:
    cfg = tiny_config("rollout.max_new_tokens=12", "rollout.temperature=0.8")
    tokenizer = make_tokenizer(cfg)
    same, _ = sample(cfg, tokenizer, "float32", prompts=2)
    assert len(same) == 2 and all(g.engine_logprobs for g in same)
    exact = measure(cfg, tokenizer, same, "fp32")
    assert exact["mismatch_tokens"] == sum(len(c) for g in same for c in g.completions)
    assert exact["mismatch_samples"] == 2 * cfg.rollout.group_size
    assert exact["mismatch_kl"] < 1e-9 and abs(exact["mismatch_ratio_max"] - 1) < 1e-4
    assert exact["mismatch_beyond_token_share"] == 0.0
    rounded, _ = sample(cfg, tokenizer, "bfloat16", prompts=2)
    gap = measure(cfg, tokenizer, rounded, "fp32")
    assert gap["mismatch_kl"] > 100 * max(exact["mismatch_kl"], 1e-12)
