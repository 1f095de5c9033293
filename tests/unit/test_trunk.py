"""The prompt beginning a step's micro-batches share, computed once a step: the same gradients and
steps as computing it in every micro-batch."""

from __future__ import annotations

import random

import pytest
import torch
from torch import Tensor

from cadence.model.tokenizer import CharTokenizer
from cadence.model.transformer import init_model
from cadence.ops.packing import packed_length
from cadence.training.learner import TorchLearner, TrainGroup
from cadence.training.trunk import StepTrunk
from tests.unit.test_prefix import CONFIGS


@pytest.fixture(autouse=True)
def _threads() -> None:
    torch.set_num_threads(2)


def learner(packing: str, kl_beta: float = 0.0) -> TorchLearner:
    cfg = CONFIGS["qwen3"]
    return TorchLearner(
        init_model(cfg, seed=5), cfg, CharTokenizer(), 1e-3, 0.1, 0.2, 0.28, kl_beta, 1.0, packing=packing
    )


def chat_groups(seed: int = 0) -> list[TrainGroup]:
    """Five groups whose prompts begin with the same 9 tokens (a system prompt), then their own."""
    rng = random.Random(seed)
    system = [rng.randrange(1, 20) for _ in range(9)]
    groups = []
    for tail in (4, 1, 6, 3, 2):
        prompt = system + [rng.randrange(1, 20) for _ in range(tail)]
        completions = [[rng.randrange(1, 20) for _ in range(rng.randint(1, 7))] for _ in range(4)]
        groups.append(TrainGroup(prompt, completions, [rng.random() for _ in range(4)]))
    return groups


def grads(own: TorchLearner) -> Tensor:
    own.complete_gradients()
    return torch.cat([p.grad.flatten() for p in own.model.parameters() if p.grad is not None])


def test_the_trunk_is_what_every_prompt_begins_with_less_each_last_token() -> None:
    trunk = StepTrunk([5, 6, 7, 8], [], [])
    assert trunk.shared([[5, 6, 7, 8, 9], [5, 6, 7, 1]]) == 3
    assert trunk.shared([[5, 6, 7, 8, 9]]) == 4
    assert trunk.shared([[5, 6]]) == 1  # the prompt keeps its last token
    assert trunk.shared([[4, 6, 7, 8, 9], [5, 6, 7, 8, 9]]) == 0


@pytest.mark.parametrize("kl_beta", [0.0, 0.1])
def test_micro_batches_on_one_trunk_train_as_if_each_computed_it(kl_beta: float) -> None:
    groups = chat_groups()
    split = [groups[:1], groups[1:3], groups[3:]]
    own, plain = learner("shared_prompt", kl_beta), learner("padded", kl_beta)
    for step in range(2):  # the second step's trunk is computed with the first step's weights
        stats = [own.train_groups(part) for part in split]
        for part in split:
            plain.train_groups(part)
        expected = grads(plain)
        assert expected.abs().max() > 0
        assert (grads(own) - expected).abs().max() <= 1e-5 * expected.abs().max()
        # the first micro-batch computes its prompt's body as the trunk, the later ones skip 9 tokens
        alone = [sum(packed_length(g.prompt, g.completions) for g in part) for part in split]
        assert stats[0]["computed_tokens"] == alone[0]
        assert stats[1]["computed_tokens"] == alone[1] - 2 * 9
        assert stats[2]["computed_tokens"] == alone[2] - 2 * 9
        own.step(40.0)
        plain.step(40.0)
        for a, b in zip(own.model.parameters(), plain.model.parameters(), strict=True):
            assert (a - b).abs().max() <= 1e-6, step


def test_loading_a_state_drops_the_trunk_of_the_weights_it_replaces() -> None:
    own, plain = learner("shared_prompt"), learner("padded")
    groups = chat_groups(seed=1)
    own.train_groups(groups)
    own.step(40.0)  # weights of its own now
    own.train_groups(groups[:2])  # a trunk of the weights about to be replaced
    own.load({k: v.clone() for k, v in plain.tensors().items()}, plain.optimizer_state())
    own.train_groups(groups[2:])
    plain.train_groups(groups[2:])
    expected = grads(plain)
    assert (grads(own) - expected).abs().max() <= 1e-5 * expected.abs().max()


def test_while_the_policy_is_the_reference_their_kl_and_its_gradient_are_exactly_zero() -> None:
    """The reference reads the same trunk tokens through its own trunk: the same computation as the
    policy's, so no rounding residue for AdamW to magnify (it would move weights by up to lr / 2)."""
    groups = [TrainGroup(g.prompt, g.completions, [0.5] * len(g.completions)) for g in chat_groups(seed=2)]
    own = learner("shared_prompt", kl_beta=0.1)
    stats = [own.train_groups(groups[:2]), own.train_groups(groups[2:])]
    assert stats[1]["computed_tokens"] < sum(packed_length(g.prompt, g.completions) for g in groups[2:])
    assert all(s["kl_sum"] == 0.0 for s in stats)
    assert grads(own).abs().max() == 0.0
