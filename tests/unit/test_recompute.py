"""Activation checkpointing (`trainer.activation_checkpointing`): the blocks computed again in the
backward give the gradients of the plain backward, bit for bit, while the forward keeps far less."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor

from cadence.config import ConfigError, load_config
from cadence.model.lora import LoraSpec
from cadence.model.tokenizer import CharTokenizer
from cadence.model.transformer import init_model
from cadence.training.learner import TorchLearner, TrainGroup
from cadence.training.lora_learner import LoraLearner
from tests.unit.test_learner import micro_batch
from tests.unit.test_lora import SETTINGS as LORA_SETTINGS
from tests.unit.test_prefix import CONFIGS

SETTINGS: dict[str, Any] = LORA_SETTINGS | {"kl_beta": 0.1}


@pytest.fixture(autouse=True)
def _threads() -> None:
    torch.set_num_threads(2)


def plain(recompute: bool, **kw: Any) -> TorchLearner:
    cfg = CONFIGS["qwen3"]
    return TorchLearner(init_model(cfg, 5), cfg, CharTokenizer(), **(SETTINGS | kw), recompute=recompute)


def adapted(recompute: bool, **kw: Any) -> TorchLearner:
    cfg = CONFIGS["qwen3"]
    spec = LoraSpec(rank=4, alpha=8.0, dropout=0.3)  # dropout: the recomputed block draws the same mask
    settings = SETTINGS | kw | {"kl_beta": 0.0}
    return LoraLearner(
        init_model(cfg, 5),
        cfg,
        CharTokenizer(),
        lora=spec,
        seed=1,
        base="b0",
        recompute=recompute,
        **settings,
    )


def grads(learner: TorchLearner) -> list[Tensor]:
    return [p.grad.clone() for p in learner.trainable() if p.grad is not None]


def saved_bytes(learner: TorchLearner, groups: list[TrainGroup]) -> tuple[int, dict[str, float]]:
    """The bytes the forward's graph keeps for the backward (outside any checkpoint), and the stats."""
    kept = 0

    def pack(t: Tensor) -> Tensor:
        nonlocal kept
        kept += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        stats = learner.train_groups(groups)
    return kept, stats


MAKERS: dict[str, Callable[..., TorchLearner]] = {"full": plain, "lora": adapted}


@pytest.mark.parametrize("packing", ["shared_prompt", "padded"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_recomputed_blocks_give_the_same_gradients_bit_for_bit(
    kind: str, precision: str, packing: str
) -> None:
    make = MAKERS[kind]
    torch.manual_seed(0)
    reference = make(False, packing=packing, precision=precision)
    kept_plain, stats_plain = saved_bytes(reference, micro_batch())
    torch.manual_seed(0)
    recomputing = make(True, packing=packing, precision=precision)
    kept_recompute, stats_recompute = saved_bytes(recomputing, micro_batch())
    assert stats_recompute == stats_plain
    expected, got = grads(reference), grads(recomputing)
    assert expected and max(float(g.abs().max()) for g in expected) > 0  # there is a gradient to compare
    assert len(got) == len(expected)
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    # what the forward keeps: each block's input and little else, against every block's activations
    assert kept_recompute < kept_plain / 2


def test_two_steps_with_recomputed_blocks_end_with_the_same_weights() -> None:
    learners = [plain(False), plain(True)]
    for learner in learners:
        for _ in range(2):
            learner.train_groups(micro_batch())
            learner.step(normaliser=10.0)
    for a, b in zip(learners[0].model.parameters(), learners[1].model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_no_block_is_recomputed_without_a_graph() -> None:
    """The engine's and the reference's forwards (no grad) run as before: nothing to recompute."""
    learner = plain(True)
    ids = torch.tensor([[3, 4, 5, 6]])
    counted = 0

    def pack(t: Tensor) -> Tensor:
        nonlocal counted
        counted += 1
        return t

    with torch.no_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits = learner.model(ids)
    assert counted == 0 and logits.shape[:2] == (1, 4)


def test_the_prefix_cache_is_refused_with_recomputed_blocks_naming_both_keys() -> None:
    with pytest.raises(ValueError, match="trainer.activation_checkpointing.*trainer.packing"):
        plain(True, packing="prefix_cache")
    with pytest.raises(ConfigError, match="trainer.activation_checkpointing = true.*'prefix_cache'"):
        load_config(None, ["trainer.activation_checkpointing=true", "trainer.packing='prefix_cache'"])
    assert load_config(None, ["trainer.activation_checkpointing=true"]).trainer.activation_checkpointing
