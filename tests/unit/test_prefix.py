"""Prefix-cache log-probs: equal to the unpacked ones (values, layout, gradients), cache stays in the graph."""

from __future__ import annotations

import random

import pytest
import torch
from torch import Tensor

from cadence.launch.build import make_learner, make_tokenizer
from cadence.model.config import ModelConfig
from cadence.model.prefix import prefix_logprobs
from cadence.model.tokenizer import CharTokenizer
from cadence.model.transformer import KVCache, Transformer, init_model
from cadence.ops.logprobs import token_logprobs
from cadence.ops.losses import grpo_loss_sum
from cadence.ops.packing import Group
from cadence.training.learner import TorchLearner
from cadence.training.policy_pass import pad_group
from tests.conftest import tiny_config

PAD = 0
SIZES = dict(
    vocab_size=20,
    hidden_size=32,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    intermediate_size=64,
    max_position=256,
)
CONFIGS = {"llama": ModelConfig(**SIZES), "qwen3": ModelConfig(**SIZES, family="qwen3")}  # type: ignore[arg-type]


def make_groups(seed: int = 0) -> list[Group]:
    """4 groups, prompts of different lengths (one of a single token), G=4, responses of lengths 1..9."""
    rng = random.Random(seed)
    groups: list[Group] = []
    for prompt_len in (5, 11, 2, 1):
        prompt = [rng.randrange(1, 20) for _ in range(prompt_len)]
        completions = [[rng.randrange(1, 20) for _ in range(rng.randint(1, 9))] for _ in range(4)]
        groups.append((prompt, completions))
    groups[0][1][0] = [7]  # at least one one-token response
    groups[1][1][1] = [rng.randrange(1, 20) for _ in range(9)]
    groups[2] = (groups[2][0], [[3], [4], [5]])  # every response one token: the prompt pass only
    return groups


def unpacked(model: Transformer, prompt: list[int], completions: list[list[int]]) -> tuple[Tensor, Tensor]:
    """``pad_group``'s masked log-probs moved to [G, R_max] (row i = sample i, column j = token j)."""
    inputs, targets, mask = pad_group(prompt, completions, PAD)
    logp = token_logprobs(model(inputs), targets)
    start, width = len(prompt) - 1, max(len(c) for c in completions)
    return logp[:, start : start + width], mask[:, start : start + width]


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_prefix_logprobs_and_gradients_equal_unpacked(family: str) -> None:
    groups = make_groups()
    model = init_model(CONFIGS[family], seed=3)
    advantages = torch.randn(sum(len(c) for _, c in groups), generator=torch.Generator().manual_seed(1))
    grads, results = [], []
    for compute in (unpacked, lambda m, p, c: prefix_logprobs(m, p, c, PAD)):
        model.zero_grad(set_to_none=True)
        total, start, pairs = torch.zeros(()), 0, []
        for prompt, completions in groups:
            logp, mask = compute(model, prompt, completions)
            adv = advantages[start : start + len(completions)].unsqueeze(1)
            total = total + torch.where(mask, logp * adv, torch.zeros_like(logp)).sum()
            start += len(completions)
            pairs.append((logp.detach(), mask))
        total.backward()
        results.append(pairs)
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    for (ref, ref_mask), (got, got_mask), (_, completions) in zip(*results, groups, strict=True):
        assert got.shape == got_mask.shape == (len(completions), max(len(c) for c in completions))
        assert torch.equal(got_mask, ref_mask)
        assert torch.equal(got_mask.sum(1), torch.tensor([len(c) for c in completions]))
        assert (got - ref)[ref_mask].abs().max() <= 1e-5
        assert torch.all(got[~got_mask] == 0)
    assert grads[0].shape == grads[1].shape
    relative = (grads[1] - grads[0]).abs().max() / grads[0].abs().max()
    assert relative <= 1e-5


def test_grpo_loss_and_no_grad_reference_match_unpacked() -> None:
    model = init_model(CONFIGS["llama"], seed=6)
    for prompt, completions in make_groups(seed=5):
        advantages = torch.randn(len(completions), generator=torch.Generator().manual_seed(7))
        logp, mask = prefix_logprobs(model, prompt, completions, PAD)
        with torch.no_grad():
            ref_logp, ref_mask = prefix_logprobs(model, prompt, completions, PAD)
            full, full_mask = unpacked(model, prompt, completions)
        assert not ref_logp.requires_grad and logp.requires_grad
        assert torch.equal(ref_mask, mask)
        assert (ref_logp - logp.detach()).abs().max() <= 1e-6
        loss, _ = grpo_loss_sum(logp, logp.detach() - 0.1, advantages, mask, 0.2, 0.28, ref_logp, 0.1)
        expected, _ = grpo_loss_sum(full, full - 0.1, advantages, full_mask, 0.2, 0.28, full, 0.1)
        assert abs(float(loss.detach()) - float(expected)) <= 1e-5 * max(1.0, abs(float(expected)))


def test_repeat_batch_keeps_the_graph() -> None:
    k = torch.randn(1, 2, 3, 4, requires_grad=True)
    cache = KVCache()
    cache.update(0, k * 2, k * 3)
    cache.advance(3)
    cache.repeat_batch(5)
    keys, values = cache.update(0, torch.zeros(5, 2, 1, 4), torch.zeros(5, 2, 1, 4))
    assert keys.shape == (5, 2, 4, 4)
    (keys.sum() + values.sum()).backward()
    assert k.grad is not None and torch.allclose(k.grad, torch.full_like(k, 5 * (2 + 3)))


def test_empty_prompt_or_group_is_refused() -> None:
    model = init_model(CONFIGS["llama"], seed=0)
    with pytest.raises(ValueError, match="non-empty prompt"):
        prefix_logprobs(model, [], [[1, 2]], PAD)
    with pytest.raises(ValueError, match="at least one completion"):
        prefix_logprobs(model, [1, 2], [], PAD)


def test_learner_prefix_cache_matches_padded_and_refuses_unknown_packing() -> None:
    rng = random.Random(8)
    grads, losses = [], []
    for packing in ("padded", "prefix_cache", "shared_prompt"):
        cfg = tiny_config(f"trainer.packing='{packing}'", "trainer.kl_beta=0.1")
        tokenizer = make_tokenizer(cfg)
        learner = make_learner(cfg, tokenizer)
        assert isinstance(learner, TorchLearner)
        rng.seed(8)
        prompt = [rng.randrange(1, tokenizer.vocab_size) for _ in range(4)]
        completions = [[rng.randrange(1, tokenizer.vocab_size) for _ in range(n)] for n in (1, 3, 5, 2)]
        stats = learner.train_group(prompt, completions, [1.0, 0.0, 0.5, 0.0])
        losses.append(stats["loss_sum"])
        grads.append(torch.cat([p.grad.flatten() for p in learner.model.parameters() if p.grad is not None]))
        assert stats["tokens"] == 11
    for loss, grad in zip(losses[1:], grads[1:], strict=True):
        assert abs(loss - losses[0]) <= 1e-5 * max(1.0, abs(losses[0]))
        assert (grad - grads[0]).abs().max() <= 1e-5 * grads[0].abs().max()
    assert isinstance(learner, TorchLearner)
    with pytest.raises(ValueError, match="trainer.packing"):
        TorchLearner(
            learner.model, learner.model_cfg, learner.tokenizer, 1e-3, 0.0, 0.2, 0.28, 0.0, 1.0, "rows"
        )


def test_sampler_log_probs_as_old_policy_give_the_same_first_loss() -> None:
    """Before any step the engine's sampling log-probs are the policy's: same loss, same layout."""
    from cadence.model.engine import SamplingParams, TorchEngine

    model = init_model(CONFIGS["llama"], 3)
    prompt = [4, 5, 6, 7]
    completions = TorchEngine(model, eos_id=2).generate(
        prompt, [1, 2, 3, 4], SamplingParams(max_new_tokens=6)
    )
    learner = TorchLearner(
        model, CONFIGS["llama"], CharTokenizer(), 1e-3, 0.0, 0.2, 0.28, 0.0, 1.0, packing="shared_prompt"
    )
    rewards = [1.0, 0.0, 0.5, 0.0]
    tokens = [c.tokens for c in completions]
    own = learner.train_group(prompt, tokens, rewards)["loss_sum"]
    sampled = learner.train_group(prompt, tokens, rewards, [c.logprobs for c in completions])["loss_sum"]
    assert sampled == pytest.approx(own, abs=1e-5)
