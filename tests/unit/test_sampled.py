"""Completions that hold an environment's tokens: the mask marks the tokens the model sampled, and an
environment's are context only (ops/sampled.py): in the forward, but no log-prob term, no loss, no
gradient, no statistic and no place in the normaliser, for every objective and every packing."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from cadence.model.tokenizer import CharTokenizer
from cadence.model.transformer import Transformer, init_model
from cadence.ops.logprobs import token_logprobs
from cadence.ops.losses import OBJECTIVES, objective_loss_sum, step_normaliser
from cadence.ops.packing import packed_row_length
from cadence.ops.sampled import check_masks, sampled_lengths, sampled_rows
from cadence.training.learner import TorchLearner
from cadence.training.train_group import TrainGroup, sampled_tokens
from tests.unit.test_objectives import CLIP, MAX_NEW_TOKENS, reference_advantages, reference_objective
from tests.unit.test_prefix import CONFIGS

PACKINGS = ["shared_prompt", "prefix_cache", "padded"]
T = 0.7


@pytest.fixture(autouse=True)
def _threads() -> None:
    torch.set_num_threads(2)


# ---------------------------------------------------------------- the masks themselves


def test_masks_give_the_sampled_lengths_and_rows() -> None:
    completions = [[5, 9, 2, 6], [7], []]
    masks = [[1, 1, 0, 1], [0], []]
    assert sampled_lengths(completions, masks) == [3, 0, 0]
    assert sampled_lengths(completions, None) == [4, 1, 0]
    assert sampled_rows(completions, masks).tolist() == [
        [True, True, False, True],
        [False, False, False, False],
        [False, False, False, False],
    ]
    assert torch.equal(sampled_rows(completions, None), sampled_rows(completions, [[1] * 4, [1], []]))
    assert sampled_rows(completions, masks, 6).shape == (3, 6)


def test_masks_that_do_not_line_up_are_refused() -> None:
    with pytest.raises(ValueError, match="1 masks for 2 completions"):
        check_masks([[1], [2]], [[1]])
    with pytest.raises(ValueError, match="mask 1 has 1 entries for a completion of 2 tokens"):
        TrainGroup([3], [[1], [2, 4]], [0.0, 1.0], masks=[[1], [1]])
    with pytest.raises(ValueError, match="mask 0 holds a value other than 0"):
        TrainGroup([3], [[1]], [0.0], masks=[[2]])


def test_the_normaliser_counts_sampled_tokens_only() -> None:
    groups = [
        TrainGroup([3], [[5, 9, 2, 6], [7, 7]], [1.0, 0.0], masks=[[1, 1, 0, 1], [0, 1]]),
        TrainGroup([4], [[1, 2, 3]], [0.5]),
    ]
    assert sampled_tokens(groups) == [3, 1, 3]
    assert step_normaliser("dapo", "tokens", sampled_tokens(groups), 9) == 7.0
    assert step_normaliser("grpo", "tokens", sampled_tokens(groups), 9) == 3.0
    assert step_normaliser("dr_grpo", "tokens", sampled_tokens(groups), 9) == 27.0  # a constant


# ---------------------------------------------------------------- the losses on [a, b, ENV, c], by hand

MASK = torch.tensor([[True, True, False, True]])  # a, b sampled, then an environment's token, then c
RATIOS = (1.1, 0.9, 1.0)  # of a, b, c: inside the clip range (0.2, 0.28)
LOGP = torch.tensor([[math.log(0.5), math.log(0.25), math.log(0.9), math.log(0.8)]])
OLD = LOGP - torch.tensor([[math.log(1.1), math.log(0.9), 0.0, 0.0]])
OLD[0, 2] = 0.0  # the sampler sends 0.0 for an environment token
REF = LOGP + torch.tensor([[math.log(2.0), 0.0, 5.0, -math.log(2.0)]])  # k3: 1 - ln 2, 0, -, ln 2 - 0.5
A = 2.0


def by_hand(objective: str, beta: float) -> tuple[float, list[float]]:
    """The loss over a, b and c, and its gradient w.r.t. the log-probs of [a, b, ENV, c]: surrogate
    -A r (no ratio is clipped), KL gradient 1 - e^(q - p): -1, 0 and 0.5; k3 sums to 1/2."""
    surrogate = [-A * r for r in RATIOS]
    kl_grad = [-beta, 0.0, 0.5 * beta]
    if objective in ("dapo", "dr_grpo"):
        loss, grad = sum(surrogate) + beta * 0.5, [s + k for s, k in zip(surrogate, kl_grad, strict=True)]
    elif objective == "grpo":
        loss, grad = (
            (sum(surrogate) + beta * 0.5) / 3,
            [(s + k) / 3 for s, k in zip(surrogate, kl_grad, strict=True)],
        )
    else:  # gspo: s = (1.1 * 0.9 * 1.0)^(1/3), d(-A s)/d logp_t = -A s / 3
        s = 0.99 ** (1 / 3)
        loss, grad = -A * s + beta * 0.5 / 3, [-A * s / 3 + k / 3 for k in kl_grad]
    return loss, [grad[0], grad[1], 0.0, grad[2]]


@pytest.mark.parametrize("objective", OBJECTIVES)
@pytest.mark.parametrize("beta", [0.0, 0.1])
def test_an_environment_token_has_no_term_by_hand(objective: str, beta: float) -> None:
    logp = LOGP.clone().requires_grad_(True)
    ref = REF if beta else None
    loss, stats = objective_loss_sum(objective, logp, OLD, torch.tensor([A]), MASK, 0.2, 0.28, ref, beta)
    loss.backward()
    want_loss, want_grad = by_hand(objective, beta)
    assert float(loss.detach()) == pytest.approx(want_loss, rel=1e-6)
    assert logp.grad is not None and logp.grad[0].tolist() == pytest.approx(want_grad, rel=1e-6, abs=1e-7)
    assert float(logp.grad[0, 2]) == 0.0 and stats["clipped_tokens"] == 0.0
    if beta:
        assert stats["kl_sum"] == pytest.approx(0.5, rel=1e-6)
    # the same as the three sampled tokens alone
    alone = LOGP[:, [0, 1, 3]].clone().requires_grad_(True)
    ref_alone = REF[:, [0, 1, 3]] if beta else None
    three = torch.ones(1, 3, dtype=torch.bool)
    same, _ = objective_loss_sum(
        objective, alone, OLD[:, [0, 1, 3]], torch.tensor([A]), three, 0.2, 0.28, ref_alone, beta
    )
    same.backward()
    assert float(same.detach()) == pytest.approx(float(loss.detach()), rel=1e-6)
    assert alone.grad is not None and torch.allclose(alone.grad, logp.grad[:, [0, 1, 3]], rtol=1e-6)


@pytest.mark.parametrize("objective", OBJECTIVES)
@pytest.mark.parametrize("old", [0.0, -50.0, math.inf, math.nan])
def test_an_environment_tokens_old_log_prob_is_never_read(objective: str, old: float) -> None:
    results = []
    for value in (0.0, old):
        given = OLD.clone()
        given[0, 2] = value
        logp = LOGP.clone().requires_grad_(True)
        loss, stats = objective_loss_sum(objective, logp, given, torch.tensor([A]), MASK, 0.2, 0.28, REF, 0.1)
        loss.backward()
        results.append((loss.detach(), logp.grad, stats))
    (loss0, grad0, stats0), (loss1, grad1, stats1) = results
    assert torch.equal(loss0, loss1) and grad0 is not None and grad1 is not None
    assert torch.equal(grad0, grad1) and stats0 == stats1


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_the_logits_at_an_environment_token_take_no_gradient(objective: str) -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 4, 20, generator=g).requires_grad_(True)
    targets = torch.tensor([[5, 9, 2, 6]])
    logp = token_logprobs(logits, targets, T)
    old = logp.detach() + 1e-4 * torch.randn(1, 4, generator=g)
    old[0, 2] = 0.0
    ref = logp.detach() + 0.3 * torch.randn(1, 4, generator=g)
    low, high = CLIP[objective]
    loss, _ = objective_loss_sum(objective, logp, old, torch.tensor([A]), MASK, low, high, ref, 0.1)
    loss.backward()
    assert logits.grad is not None
    assert torch.equal(logits.grad[0, 2], torch.zeros(20))
    assert all(float(logits.grad[0, t].abs().max()) > 0 for t in (0, 1, 3))


# ---------------------------------------------------------------- the learner, against a full forward

PROMPT = [3, 1, 4, 1]
COMPLETIONS = [[5, 9, 2, 6, 5], [8, 9, 7, 9, 3, 2], [6, 2, 6], [5, 9, 2, 6, 5]]
MASKS = [[1, 1, 0, 1, 1], [1, 0, 0, 1, 1, 0], [1, 1, 1], [1, 1, 1, 1, 1]]  # 0 and 3: one tokens, two masks
REWARDS = [1.0, 0.0, 0.5, 0.25]


def make_learner(objective: str, packing: str, kl_beta: float = 0.1) -> TorchLearner:
    cfg = CONFIGS["qwen3"]
    low, high = CLIP[objective]
    return TorchLearner(
        init_model(cfg, seed=5),
        cfg,
        CharTokenizer(),
        1e-3,
        0.0,
        low,
        high,
        kl_beta,
        1.0,
        packing=packing,
        objective=objective,
        temperature=T,
    )


def full_logprobs(model: Transformer, completion: list[int]) -> tuple[Tensor, Tensor]:
    """Log-probs [n] (with gradient) and entropies [n] of the completion's tokens at T, from one
    forward over the prompt and the whole completion, its environment tokens included."""
    entropy: list[Tensor] = []
    logits = model(torch.tensor([PROMPT + completion]))[0, len(PROMPT) - 1 : -1]
    return token_logprobs(logits, torch.tensor(completion), T, entropy), entropy[0]


def sampler_groups(
    objective: str, env_old: float = 0.0, masks: list[list[int]] | None = MASKS
) -> list[TrainGroup]:
    """The group with old log-probs the policy's shifted (by 0.3; gspo 1e-4, inside its range) at the
    sampled tokens and `env_old` at the environment's."""
    model = init_model(CONFIGS["qwen3"], seed=5)
    shift = 1e-4 if objective == "gspo" else 0.3
    old = []
    for i, (c, m) in enumerate(zip(COMPLETIONS, MASKS, strict=True)):
        with torch.no_grad():
            lp, _ = full_logprobs(model, c)
        old.append(
            [
                float(v) + shift * (-1) ** (i + t) if keep else env_old
                for t, (v, keep) in enumerate(zip(lp, m, strict=True))
            ]
        )
    return [TrainGroup(PROMPT, COMPLETIONS, REWARDS, old, None, masks)]


def grads(model: torch.nn.Module) -> Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


@pytest.mark.parametrize("objective", OBJECTIVES)
@pytest.mark.parametrize("packing", PACKINGS)
def test_the_learner_trains_on_the_sampled_tokens_with_the_environments_as_context(
    objective: str, packing: str
) -> None:
    """The learner's loss, gradient, entropy and counts against the objective's formula over the
    sampled tokens, whose log-probs come from a forward over every token (test_objectives.py)."""
    group = sampler_groups(objective)[0]
    own = make_learner(objective, packing)
    stats = own.train_groups([group])
    model = init_model(CONFIGS["qwen3"], seed=5)
    leaves, old, entropy = [], [], 0.0
    for c, m, given in zip(COMPLETIONS, MASKS, group.old_logprobs or [], strict=True):
        lp, spread = full_logprobs(model, c)
        leaves.append([lp[t].double() for t in range(len(c)) if m[t]])
        old.append([given[t] for t in range(len(c)) if m[t]])
        entropy += float(spread[torch.tensor(m, dtype=torch.bool)].sum())
    ref = [[float(v.detach()) for v in sample] for sample in leaves]  # the reference is the start: k3 = 0
    advantages = reference_advantages(REWARDS, objective != "dr_grpo")
    want = reference_objective(objective, leaves, old, ref, advantages, 0.1)
    want.backward()
    normaliser = step_normaliser(objective, "tokens", group.sampled_lengths(), MAX_NEW_TOKENS)
    assert stats["loss_sum"] / normaliser == pytest.approx(float(want.detach()), rel=1e-5, abs=1e-7)
    expected = grads(model)
    assert expected.abs().max() > 0
    assert (grads(own.model) / normaliser - expected).abs().max() <= 1e-5 * expected.abs().max()
    assert stats["tokens"] == stats["entropy_tokens"] == sum(sum(m) for m in MASKS) == 15
    assert stats["entropy_sum"] == pytest.approx(entropy, rel=1e-5)
    if packing == "shared_prompt":  # the environment's tokens are in the forward
        assert stats["computed_tokens"] == packed_row_length([(PROMPT, COMPLETIONS)])


@pytest.mark.parametrize("objective", OBJECTIVES)
@pytest.mark.parametrize("packing", PACKINGS)
def test_an_environment_tokens_old_log_prob_changes_nothing_in_the_learner(
    objective: str, packing: str
) -> None:
    runs = []
    for env_old in (0.0, 7.0, math.nan):
        own = make_learner(objective, packing)
        stats = own.train_groups(sampler_groups(objective, env_old))
        runs.append((stats, grads(own.model), own.step(20.0)))
    for stats, g, info in runs[1:]:
        assert stats == runs[0][0] and torch.equal(g, runs[0][1]) and info == runs[0][2]


@pytest.mark.parametrize("objective", OBJECTIVES)
@pytest.mark.parametrize("packing", PACKINGS)
@pytest.mark.parametrize("kl_beta", [0.0, 0.1])
def test_an_all_ones_mask_trains_exactly_as_no_mask(objective: str, packing: str, kl_beta: float) -> None:
    """Bit for bit: loss, gradients, statistics, the step's figures and the weights after it."""
    ones = [[1] * len(c) for c in COMPLETIONS]
    runs = []
    for masks in (None, ones):
        own = make_learner(objective, packing, kl_beta)
        groups = sampler_groups(objective, masks=masks)
        plain = TrainGroup(
            [2, 7],
            [[1, 2], [1, 2], [4]],
            [1.0, 1.0, 0.0],
            masks=None if masks is None else [[1, 1], [1, 1], [1]],
        )
        stats = own.train_groups([*groups, plain])
        gradient = grads(own.model)
        info = own.step(float(sum(sampled_tokens([*groups, plain]))))
        runs.append((stats, gradient, info, [p.detach().clone() for p in own.model.parameters()]))
    (stats0, grad0, info0, weights0), (stats1, grad1, info1, weights1) = runs
    assert stats0 == stats1 and info0 == info1
    assert torch.equal(grad0, grad1) and float(grad0.abs().max()) > 0
    assert all(torch.equal(a, b) for a, b in zip(weights0, weights1, strict=True))
