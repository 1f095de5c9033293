"""The [vllm] section and what a vLLM worker says where vLLM is not installed."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from cadence.config import ConfigError, load_config
from cadence.launch.build import make_engine, make_tokenizer
from cadence.model.rollout_engine import TorchRolloutEngine
from tests.conftest import tiny_config


def test_vllm_section_is_read_and_checked() -> None:
    cfg = load_config(None, ["rollout.engine='vllm'", "vllm.dtype='bfloat16'", "vllm.kv_cache_mib=64"])
    assert cfg.rollout.engine == "vllm" and cfg.vllm.dtype == "bfloat16" and cfg.vllm.kv_cache_mib == 64
    with pytest.raises(ConfigError, match="vllm.gpu_memory_utilization"):
        load_config(None, ["vllm.gpu_memory_utilization=1.5"])
    with pytest.raises(ConfigError, match="vllm.dtype"):
        load_config(None, ["vllm.dtype='int8'"])


def test_the_built_in_engines_dtype_is_checked_and_not_taken_for_vllms() -> None:
    assert load_config(None, ["rollout.dtype='bfloat16'"]).rollout.dtype == "bfloat16"
    with pytest.raises(ConfigError, match="rollout.dtype"):
        load_config(None, ["rollout.dtype='float16'"])
    with pytest.raises(ConfigError, match=r"rollout.dtype = 'bfloat16' is the built-in engine's.*vllm.dtype"):
        load_config(None, ["rollout.engine='vllm'", "rollout.dtype='bfloat16'"])


def test_a_bfloat16_worker_generates_in_bfloat16() -> None:
    cfg = tiny_config("rollout.dtype='bfloat16'")
    engine = make_engine(cfg, make_tokenizer(cfg))
    assert isinstance(engine, TorchRolloutEngine)
    assert {p.dtype for p in engine.engine.model.parameters()} == {torch.bfloat16}


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_a_vllm_worker_without_vllm_names_the_fix() -> None:
    cfg = tiny_config("rollout.engine='vllm'")
    with pytest.raises(ConfigError, match=r"rollout.engine = 'vllm' needs vLLM.*make vllm"):
        make_engine(cfg, make_tokenizer(cfg))
