"""GRPO's pure tensor functions: advantages, clipped surrogate, k3 KL, summed loss, log-probs."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from cadence.ops.advantages import group_advantages
from cadence.ops.logprobs import token_logprobs
from cadence.ops.losses import clipped_surrogate, grpo_loss_sum, k3_kl


@pytest.fixture(autouse=True)
def _threads() -> None:
    torch.set_num_threads(2)


def t(*values: float) -> Tensor:
    return torch.tensor(values, dtype=torch.float32)


# ---------------------------------------------------------------- advantages


def test_advantages_sum_to_zero_per_group() -> None:
    rewards = torch.rand(5, 8, generator=torch.Generator().manual_seed(0))
    adv = group_advantages(rewards)
    assert adv.shape == rewards.shape
    torch.testing.assert_close(adv.sum(dim=-1), torch.zeros(5), atol=1e-5, rtol=0)


def test_advantages_are_standardised_rewards() -> None:
    rewards = t(1.0, 0.0, 0.5, 0.25)
    mean = 0.4375
    std = math.sqrt(sum((r - mean) ** 2 for r in [1.0, 0.0, 0.5, 0.25]) / 4)  # population std
    expected = t(*[(r - mean) / std for r in [1.0, 0.0, 0.5, 0.25]])
    torch.testing.assert_close(group_advantages(rewards), expected)


def test_unscaled_advantages_are_centred_rewards() -> None:
    torch.testing.assert_close(group_advantages(t(1.0, 0.0, 0.5), scale=False), t(0.5, -0.5, 0.0))


def test_equal_rewards_give_zero_advantages() -> None:
    rewards = torch.tensor([[0.7, 0.7, 0.7, 0.7], [0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 1.0, 0.0]])
    adv = group_advantages(rewards)
    assert torch.isfinite(adv).all()
    assert torch.equal(adv[:2], torch.zeros(2, 4))
    torch.testing.assert_close(adv[2], t(1.0, -1.0, 1.0, -1.0))


@pytest.mark.parametrize("scale", [True, False])
def test_equal_rewards_give_exact_zeros_whatever_the_rounding_of_their_mean(scale: bool) -> None:
    """Seven rewards of 0.2 have a float32 mean that is not 0.2: r - mean would be -1.5e-8, a gradient
    from a group that carries no signal (and a group the learner could not skip)."""
    rewards = torch.full((7,), 0.2)
    assert not torch.equal(rewards - rewards.mean(), torch.zeros(7))  # the rounding this guards against
    assert torch.equal(group_advantages(rewards, scale=scale), torch.zeros(7))


def test_single_sample_group_gets_zero() -> None:
    adv = group_advantages(t(0.3))
    assert torch.equal(adv, t(0.0))


# ---------------------------------------------------------------- clipped surrogate


@pytest.mark.parametrize(
    ("ratio", "advantage", "clip_low", "clip_high", "expected"),
    [
        # inside the range: the plain surrogate -r A
        (1.1, 2.0, 0.2, 0.28, -2.2),
        (0.9, -1.0, 0.2, 0.28, 0.9),
        # above 1 + clip_high: positive advantage is capped at (1 + clip_high) A
        (1.5, 2.0, 0.2, 0.28, -1.28 * 2.0),
        # above, negative advantage: min picks the unclipped r A (pessimistic)
        (1.5, -1.0, 0.2, 0.28, 1.5),
        # below 1 - clip_low: negative advantage is capped at (1 - clip_low) A
        (0.5, -1.0, 0.2, 0.28, 0.8),
        # below, positive advantage: min picks the unclipped r A
        (0.5, 2.0, 0.2, 0.28, -1.0),
        # separate bounds: 1.25 is inside with clip_high 0.28, clipped with 0.2
        (1.25, 1.0, 0.2, 0.28, -1.25),
        (1.25, 1.0, 0.2, 0.2, -1.2),
        # and a low bound other than the high one: 0.85 clipped at clip_low 0.1, not at 0.2
        (0.85, -1.0, 0.2, 0.28, 0.85),
        (0.85, -1.0, 0.1, 0.28, 0.9),
    ],
)
def test_clipped_surrogate_by_hand(
    ratio: float, advantage: float, clip_low: float, clip_high: float, expected: float
) -> None:
    old = t(-1.3)
    logp = old + math.log(ratio)
    loss = clipped_surrogate(logp, old, t(advantage), clip_low, clip_high)
    torch.testing.assert_close(loss, t(expected), atol=1e-5, rtol=1e-5)


def test_clipped_surrogate_has_no_gradient_where_clipped() -> None:
    old = torch.zeros(3)
    logp = torch.tensor([math.log(1.5), math.log(1.0), math.log(0.5)], requires_grad=True)
    clipped_surrogate(logp, old, t(1.0, 1.0, -1.0), 0.2, 0.28).sum().backward()
    assert logp.grad is not None
    torch.testing.assert_close(logp.grad, t(0.0, -1.0, 0.0))


# ---------------------------------------------------------------- k3 KL


def test_k3_kl_is_non_negative_and_zero_at_equality() -> None:
    gen = torch.Generator().manual_seed(1)
    logp = -torch.rand(1000, generator=gen) * 5
    ref = -torch.rand(1000, generator=gen) * 5
    kl = k3_kl(logp, ref)
    assert (kl >= 0).all()
    assert (kl[(logp - ref).abs() > 1e-2] > 0).all()
    assert torch.equal(k3_kl(logp, logp), torch.zeros(1000))


def test_k3_kl_by_hand() -> None:
    # q - p = 1: e - 1 - 1
    torch.testing.assert_close(k3_kl(t(-2.0), t(-1.0)), t(math.e - 2.0))


# ---------------------------------------------------------------- summed loss


def _batch(seed: int, n: int = 4, steps: int = 6) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    logp = -torch.rand(n, steps, generator=gen) * 3
    old = logp + (torch.rand(n, steps, generator=gen) - 0.5)  # ratios on both sides of the clip range
    adv = torch.randn(n, generator=gen)
    mask = torch.rand(n, steps, generator=gen) > 0.3
    return logp, old, adv, mask


def test_loss_is_a_sum_doubling_the_data_doubles_it() -> None:
    logp, old, adv, mask = _batch(0)
    one, stats_one = grpo_loss_sum(logp, old, adv, mask, 0.2, 0.28, ref_logp=old, kl_beta=0.1)
    two, stats_two = grpo_loss_sum(
        torch.cat([logp, logp]),
        torch.cat([old, old]),
        torch.cat([adv, adv]),
        torch.cat([mask, mask]),
        0.2,
        0.28,
        ref_logp=torch.cat([old, old]),
        kl_beta=0.1,
    )
    assert one.abs() > 1e-3
    torch.testing.assert_close(two, 2 * one)
    assert stats_two["clipped_tokens"] == 2 * stats_one["clipped_tokens"]
    assert stats_two["kl_sum"] == pytest.approx(2 * stats_one["kl_sum"])


def test_loss_equals_masked_sum_of_per_token_terms() -> None:
    logp, old, adv, mask = _batch(2)
    loss, stats = grpo_loss_sum(logp, old, adv, mask, 0.2, 0.28)
    per_token = clipped_surrogate(logp, old, adv[:, None].expand_as(logp), 0.2, 0.28)
    torch.testing.assert_close(loss, per_token[mask].sum())
    ratio = torch.exp(logp - old)
    # the clip is active only where it takes the gradient away: above 1.28 with A > 0, below 0.8 with A < 0
    expected_clipped = sum(
        1
        for i in range(logp.shape[0])
        for j in range(logp.shape[1])
        if mask[i, j] and ((adv[i] > 0 and ratio[i, j] > 1.28) or (adv[i] < 0 and ratio[i, j] < 0.8))
    )
    out_of_bounds = (((ratio < 0.8) | (ratio > 1.28)) & mask).sum().item()
    assert 0 < expected_clipped < out_of_bounds  # the batch has both kinds
    assert stats["clipped_tokens"] == expected_clipped
    assert "kl_sum" not in stats


def test_mask_excludes_tokens() -> None:
    logp, old, adv, mask = _batch(3)
    base, _ = grpo_loss_sum(logp, old, adv, mask, 0.2, 0.28)
    wild_logp = torch.where(mask, logp, torch.full_like(logp, 20.0))
    wild_old = torch.where(mask, old, torch.full_like(old, -20.0))
    changed, _ = grpo_loss_sum(wild_logp, wild_old, adv, mask, 0.2, 0.28)
    torch.testing.assert_close(changed, base)
    empty, stats = grpo_loss_sum(logp, old, adv, torch.zeros_like(mask), 0.2, 0.28)
    assert empty.item() == 0.0 and stats["clipped_tokens"] == 0.0


def test_mask_excludes_tokens_whose_terms_overflow() -> None:
    logp, old, adv, mask = _batch(3)
    base, _ = grpo_loss_sum(logp, old, adv, mask, 0.2, 0.28)
    wild_logp = torch.where(mask, logp, torch.full_like(logp, 50.0))
    wild_old = torch.where(mask, old, torch.full_like(old, -50.0))
    changed, _ = grpo_loss_sum(wild_logp, wild_old, adv, mask, 0.2, 0.28)
    torch.testing.assert_close(changed, base)


def test_per_token_advantages_are_accepted() -> None:
    logp, old, adv, mask = _batch(4)
    per_sample, _ = grpo_loss_sum(logp, old, adv, mask, 0.2, 0.28)
    per_token, _ = grpo_loss_sum(logp, old, adv[:, None].expand_as(logp).clone(), mask, 0.2, 0.28)
    torch.testing.assert_close(per_token, per_sample)


def test_kl_term_is_added_with_its_weight() -> None:
    logp, old, adv, mask = _batch(5)
    ref = logp - 0.3
    plain, _ = grpo_loss_sum(logp, old, adv, mask, 0.2, 0.28)
    with_kl, stats = grpo_loss_sum(logp, old, adv, mask, 0.2, 0.28, ref_logp=ref, kl_beta=0.5)
    kl_sum = (k3_kl(logp, ref) * mask).sum()
    torch.testing.assert_close(with_kl, plain + 0.5 * kl_sum)
    assert stats["kl_sum"] == pytest.approx(kl_sum.item())
    skipped, stats = grpo_loss_sum(logp, old, adv, mask, 0.2, 0.28, ref_logp=ref, kl_beta=0.0)
    torch.testing.assert_close(skipped, plain)
    assert "kl_sum" not in stats


def _groups(count: int, vocab: int, dim: int) -> list[tuple[Tensor, Tensor, Tensor, Tensor, Tensor]]:
    """Random GRPO groups: features [G, T, D], targets [G, T], old log-prob offsets, rewards, mask."""
    gen = torch.Generator().manual_seed(11)
    groups = []
    for i in range(count):
        g, steps = 4, 3 + i % 3
        feats = torch.randn(g, steps, dim, generator=gen)
        targets = torch.randint(0, vocab, (g, steps), generator=gen)
        offsets = (torch.rand(g, steps, generator=gen) - 0.5) * 0.8
        rewards = torch.rand(g, generator=gen)
        mask = torch.rand(g, steps, generator=gen) > 0.2
        groups.append((feats, targets, offsets, rewards, mask))
    return groups


def _accumulated_grads(
    model: torch.nn.Linear, groups: list[tuple[Tensor, Tensor, Tensor, Tensor, Tensor]], normaliser: float
) -> list[Tensor]:
    model.zero_grad()
    for feats, targets, offsets, rewards, mask in groups:
        logp = token_logprobs(model(feats), targets)
        old = logp.detach() + offsets
        loss, _ = grpo_loss_sum(logp, old, group_advantages(rewards), mask, 0.2, 0.28)
        loss.backward()
    return [p.grad.detach() / normaliser for p in model.parameters() if p.grad is not None]


def test_accumulated_gradients_do_not_depend_on_group_order() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 12)
    groups = _groups(6, vocab=12, dim=8)
    normaliser = float(sum(mask.sum() for *_, mask in groups))
    forward = _accumulated_grads(model, groups, normaliser)
    order = [3, 0, 5, 1, 4, 2]
    shuffled = _accumulated_grads(model, [groups[i] for i in order], normaliser)
    assert len(forward) == 2 and all(g.abs().sum() > 0 for g in forward)
    for a, b in zip(forward, shuffled, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    # the normaliser is the only division: one group alone gives a different gradient
    alone = _accumulated_grads(model, groups[:1], normaliser)
    assert not torch.allclose(alone[0], forward[0], atol=1e-4)


# ---------------------------------------------------------------- log-probs


def test_token_logprobs_equal_log_softmax_gather() -> None:
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(3, 5, 11, generator=gen) * 4
    targets = torch.randint(0, 11, (3, 5), generator=gen)
    expected = torch.log_softmax(logits, dim=-1).gather(-1, targets[..., None]).squeeze(-1)
    got = token_logprobs(logits, targets)
    assert got.shape == (3, 5)
    torch.testing.assert_close(got, expected)


def test_token_logprobs_are_float32_for_half_logits() -> None:
    logits = torch.randn(2, 4, 9, generator=torch.Generator().manual_seed(8)).to(torch.bfloat16)
    targets = torch.tensor([[0, 1, 2, 3], [8, 7, 6, 5]])
    got = token_logprobs(logits, targets)
    assert got.dtype == torch.float32
    expected = torch.log_softmax(logits.float(), dim=-1).gather(-1, targets[..., None]).squeeze(-1)
    torch.testing.assert_close(got, expected)
