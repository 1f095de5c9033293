"""The composition root: turns a `RunConfig` into the tokenizer, model, engine and learner.

Invariant: every process of a run builds the same tokenizer and model shape from the same config,
so weights published by the trainer always fit every worker's engine.
"""

from __future__ import annotations

from pathlib import Path

import torch

from cadence.actors.rollout import RolloutEngine
from cadence.config import RunConfig
from cadence.learner import Learner, TorchLearner
from cadence.model.checkpoint import load_checkpoint, state_dict_from_bytes
from cadence.model.config import ModelConfig
from cadence.model.engine import Completion, SamplingParams, TorchEngine
from cadence.model.tokenizer import CharTokenizer, TextTokenizer
from cadence.model.transformer import Transformer, init_model
from cadence.simulated import SimulatedEngine, SimulatedLearner
from cadence.tasks.registry import make_task


def make_tokenizer(cfg: RunConfig) -> TextTokenizer:
    if cfg.model.checkpoint:
        from cadence.model.hf_tokenizer import HFTokenizer

        return HFTokenizer(Path(cfg.model.checkpoint).expanduser())
    return CharTokenizer(make_task(cfg.task, cfg.seed).alphabet)


def make_model(cfg: RunConfig, tokenizer: TextTokenizer) -> tuple[Transformer, ModelConfig]:
    """The checkpoint's model when the config names one, else a random one of the config's shape."""
    if cfg.model.checkpoint:
        return load_checkpoint(Path(cfg.model.checkpoint).expanduser())
    model_cfg = make_model_config(cfg, tokenizer)
    return init_model(model_cfg, cfg.model.init_seed), model_cfg


def make_model_config(cfg: RunConfig, tokenizer: TextTokenizer) -> ModelConfig:
    m = cfg.model
    return ModelConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=m.hidden_size,
        num_layers=m.num_layers,
        num_heads=m.num_heads,
        num_kv_heads=m.num_kv_heads,
        intermediate_size=m.intermediate_size,
        max_position=m.max_position,
    )


class TorchRolloutEngine:
    """The built-in engine behind the worker's `RolloutEngine` interface."""

    def __init__(self, engine: TorchEngine, params: SamplingParams) -> None:
        self.engine = engine
        self.params = params

    def load(self, weights: bytes | bytearray) -> None:
        self.engine.load_state_dict(state_dict_from_bytes(weights))

    def generate(self, prompt: list[int], seeds: list[int]) -> list[Completion]:
        return self.engine.generate(prompt, seeds, self.params)


def make_engine(cfg: RunConfig, tokenizer: TextTokenizer) -> RolloutEngine:
    if cfg.rollout.engine == "simulated":
        digits = tokenizer.encode("0123456789")
        return SimulatedEngine(cfg.simulated, tokenizer.eos_id, digits)
    torch.set_num_threads(1)
    model = make_model(cfg, tokenizer)[0].eval()
    r = cfg.rollout
    params = SamplingParams(max_new_tokens=r.max_new_tokens, temperature=r.temperature, top_p=r.top_p)
    return TorchRolloutEngine(TorchEngine(model, tokenizer.eos_id), params)


def make_learner(cfg: RunConfig, tokenizer: TextTokenizer) -> Learner:
    if cfg.trainer.learner == "simulated":
        return SimulatedLearner(cfg.simulated)
    torch.set_num_threads(1)
    model, model_cfg = make_model(cfg, tokenizer)
    t = cfg.trainer
    return TorchLearner(
        model,
        model_cfg,
        tokenizer,
        lr=t.lr,
        weight_decay=t.weight_decay,
        clip_low=t.clip_low,
        clip_high=t.clip_high,
        kl_beta=t.kl_beta,
        max_grad_norm=t.max_grad_norm,
        packing=t.packing,
    )
