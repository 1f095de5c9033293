"""Only the distinct samples that carry gradient are computed: the same loss, gradients, statistics and
step as computing every sample, for every objective and packing."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from cadence.model.tokenizer import CharTokenizer
from cadence.model.transformer import init_model
from cadence.ops.advantages import group_advantages
from cadence.ops.distinct import distinct_samples
from cadence.ops.losses import OBJECTIVES
from cadence.training.learner import TorchLearner, TrainGroup
from tests.unit.test_prefix import CONFIGS, make_groups


@pytest.fixture(autouse=True)
def _threads() -> None:
    torch.set_num_threads(2)


# ---------------------------------------------------------------- the pure fold


def test_identical_samples_fold_into_their_first_with_a_count() -> None:
    completions = [[5, 2], [7], [5, 2], [5, 2], [7, 1]]
    advantages = [0.5, -1.0, 0.5, 0.5, 1.0]
    assert distinct_samples(completions, advantages, None, drop_zero=True) == [(0, 3), (1, 1), (4, 1)]


def test_advantage_zero_is_dropped_only_when_asked() -> None:
    completions = [[1], [2], [3]]
    assert distinct_samples(completions, [1.0, 0.0, -1.0], None, drop_zero=True) == [(0, 1), (2, 1)]
    assert distinct_samples(completions, [1.0, 0.0, -1.0], None, drop_zero=False) == [(0, 1), (1, 1), (2, 1)]
    assert distinct_samples([[1], [1]], [0.0, 0.0], None, drop_zero=True) == []
    assert distinct_samples([[1], [1]], [0.0, 0.0], None, drop_zero=False) == [(0, 2)]


def test_the_same_tokens_with_another_advantage_or_old_log_probs_stay_apart() -> None:
    assert distinct_samples([[4, 4], [4, 4]], [1.0, 2.0], None, drop_zero=True) == [(0, 1), (1, 1)]
    old = [[-0.5, -0.25], [-0.5, -0.75]]
    assert distinct_samples([[4, 4], [4, 4]], [1.0, 1.0], old, drop_zero=True) == [(0, 1), (1, 1)]
    same = [[-0.5, -0.25], [-0.5, -0.25]]
    assert distinct_samples([[4, 4], [4, 4]], [1.0, 1.0], same, drop_zero=True) == [(0, 2)]


def test_engine_log_probs_a_correction_reads_keep_samples_apart() -> None:
    """Where a rollout correction weighs by the engine's log-probs, samples whose engine log-probs
    differ have other terms; without them (measured only) they fold as before."""
    engine = [[-0.5, -0.25], [-0.5, -0.75]]
    args = ([[4, 4], [4, 4]], [1.0, 1.0], None)
    assert distinct_samples(*args, drop_zero=True, engine_logprobs=engine) == [(0, 1), (1, 1)]
    assert distinct_samples(*args, drop_zero=True, engine_logprobs=[engine[0], engine[0]]) == [(0, 2)]
    assert distinct_samples(*args, drop_zero=True) == [(0, 2)]


def test_the_same_tokens_with_other_masks_stay_apart() -> None:
    """A token the model sampled in one sample and an environment wrote in the other: two samples. An
    environment token's old log-prob is never read, so it tells no samples apart; a sample whose every
    token is an environment's has no term and is not computed."""
    tokens = [[4, 2, 4], [4, 2, 4], [4, 2, 4], [4, 2, 4]]
    masks = [[1, 0, 1], [1, 1, 1], [1, 0, 1], [0, 0, 0]]
    assert distinct_samples(tokens, [1.0] * 4, None, drop_zero=True, masks=masks) == [(0, 2), (1, 1)]
    old = [[-0.5, 0.0, -0.25], [-0.5, -0.1, -0.25], [-0.5, -9.0, -0.25], [-0.5, 0.0, -0.25]]
    assert distinct_samples(tokens, [1.0] * 4, old, drop_zero=False, masks=masks) == [(0, 2), (1, 1)]
    assert distinct_samples([[], []], [1.0, 1.0], None, drop_zero=True, masks=[[], []]) == [(0, 2)]
    with pytest.raises(ValueError, match="mask 1 has 2 entries for a completion of 3 tokens"):
        distinct_samples(tokens[:2], [1.0, 1.0], None, drop_zero=True, masks=[[1, 0, 1], [1, 1]])


def test_lists_of_other_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match="2 advantages for 3 completions"):
        distinct_samples([[1], [2], [3]], [1.0, -1.0], None, drop_zero=True)
    with pytest.raises(ValueError, match="1 old log-prob lists for 2 completions"):
        distinct_samples([[1], [2]], [1.0, -1.0], [[-1.0]], drop_zero=True)


# ---------------------------------------------------------------- the learner against every sample


def learner(objective: str, packing: str, kl_beta: float = 0.0, seed: int = 5) -> TorchLearner:
    cfg = CONFIGS["qwen3"]
    return TorchLearner(
        init_model(cfg, seed=seed),
        cfg,
        CharTokenizer(),
        1e-3,
        0.1,
        0.2,
        0.28,
        kl_beta,
        1.0,
        packing=packing,
        objective=objective,
        temperature=0.7,
    )


def repeating_groups() -> list[TrainGroup]:
    """Group 0 has a sample three times and one twice; group 1's rewards are all equal (advantage 0
    everywhere); group 2 has one sample of advantage exactly 0 among others; group 3 is plain."""
    (p0, c0), (p1, c1), (p2, c2), (p3, c3) = make_groups(6)
    g0 = TrainGroup(p0, [c0[0], c0[1], c0[0], c0[1], c0[0], c0[2]], [1.0, 0.0, 1.0, 0.0, 1.0, 0.5])
    g1 = TrainGroup(p1, c1, [0.2] * len(c1))
    g2 = TrainGroup(p2, c2, [0.0, 0.5, 1.0][: len(c2)])
    g3 = TrainGroup(p3, c3, [0.1, 0.9, 0.4, 0.3])
    return [g0, g1, g2, g3]


def every_sample(own: TorchLearner, groups: list[TrainGroup]) -> dict[str, float]:
    """The computation of every sample, none folded or dropped: `_train` with weight 1 each."""
    scale = own.objective != "dr_grpo"
    explicit = [
        TrainGroup(
            g.prompt,
            g.completions,
            g.rewards,
            g.old_logprobs,
            group_advantages(torch.tensor(g.rewards), scale=scale).tolist(),
        )
        for g in groups
    ]
    weights = torch.ones(sum(len(g.completions) for g in groups))
    stats = own._train(explicit, weights)
    stats["tokens"] = float(sum(len(c) for g in groups for c in g.completions))
    own._sums = dict(stats)
    return stats


def grads(own: TorchLearner) -> Tensor:
    return torch.cat([p.grad.flatten() for p in own.model.parameters() if p.grad is not None])


@pytest.mark.parametrize("objective", OBJECTIVES)
@pytest.mark.parametrize("packing", ["shared_prompt", "prefix_cache", "padded"])
def test_folded_samples_train_as_every_sample_does(objective: str, packing: str) -> None:
    groups = repeating_groups()
    assert group_advantages(torch.tensor(groups[2].rewards)).tolist()[1] == 0.0  # the check has a zero
    folded, full = learner(objective, packing), learner(objective, packing)
    got = folded.train_groups(groups)
    want = every_sample(full, groups)
    expected = grads(full)
    assert expected.abs().max() > 0
    assert (grads(folded) - expected).abs().max() <= 1e-5 * expected.abs().max()
    for key in ("loss_sum", "clipped_tokens", "tokens"):
        assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-6), key
    # fewer tokens computed: group 1 entirely, two repeats of group 0, the zero of group 2
    assert 0 < got["computed_tokens"] < want["computed_tokens"]
    # the entropy is a mean over the samples computed, each counted as often as it occurs
    assert got["entropy_tokens"] < want["entropy_tokens"]
    assert got["entropy_sum"] / got["entropy_tokens"] != pytest.approx(
        want["entropy_sum"] / want["entropy_tokens"], rel=1e-4
    )
    # and the step lands on the same weights
    normaliser = want["tokens"]
    info = folded.step(normaliser)
    # the tokens that reached a loss term: not the skipped samples' (`tokens_trained` in the row)
    assert info["loss_tokens"] == got["entropy_tokens"] < want["tokens"]
    full.step(normaliser)
    for a, b in zip(folded.model.parameters(), full.model.parameters(), strict=True):
        assert (a - b).abs().max() <= 1e-6


def test_with_a_kl_term_samples_of_advantage_zero_are_computed() -> None:
    """The KL to the reference pulls every sample: only repeats are folded."""
    groups = repeating_groups()
    folded, full = (
        learner("dapo", "shared_prompt", kl_beta=0.1),
        learner("dapo", "shared_prompt", kl_beta=0.1),
    )
    for own in (folded, full):  # move the policy off the reference, so that the KL has a gradient
        own.train_groups(groups)
        own.step(10.0)
    got = folded.train_groups(groups)
    want = every_sample(full, groups)
    assert got["kl_sum"] == pytest.approx(want["kl_sum"], rel=1e-5) and want["kl_sum"] > 0
    expected = grads(full)
    assert (grads(folded) - expected).abs().max() <= 1e-5 * expected.abs().max()
    repeated = len(groups[0].completions[0]) * 2 + len(groups[0].completions[1])  # group 0's copies
    assert got["computed_tokens"] == want["computed_tokens"] - repeated
    assert got["entropy_tokens"] == want["entropy_tokens"]  # every sample counted: nothing dropped


def test_a_step_whose_every_group_is_uniform_moves_the_weights_as_a_computed_zero_gradient() -> None:
    """Nothing is computed, yet AdamW's moments (from an earlier step) and its weight decay move the
    weights exactly as after a forward and backward of zero advantages."""
    groups = repeating_groups()
    uniform = [TrainGroup(g.prompt, g.completions, [0.5] * len(g.completions)) for g in groups]
    folded, full = learner("dapo", "shared_prompt"), learner("dapo", "shared_prompt")
    for own in (folded, full):
        own.train_groups(groups)
        own.step(10.0)
    before = [p.detach().clone() for p in folded.model.parameters()]
    stats = folded.train_groups(uniform)
    assert stats["computed_tokens"] == 0 and stats["loss_sum"] == 0.0
    every_sample(full, uniform)
    assert grads(full).abs().max() == 0
    info = folded.step(10.0)
    full.step(10.0)
    assert "entropy" not in info  # no token computed to take it over
    assert info["loss_tokens"] == 0.0  # and none trained
    moved = max(
        float((p.detach() - b).abs().max()) for p, b in zip(folded.model.parameters(), before, strict=True)
    )
    assert moved > 1e-5
    for a, b in zip(folded.model.parameters(), full.model.parameters(), strict=True):
        assert (a - b).abs().max() <= 1e-7


def test_a_step_without_any_micro_batch_still_leaves_every_weight_alone() -> None:
    own = learner("dapo", "shared_prompt")
    own.train_groups(repeating_groups())
    own.step(10.0)
    before = [p.detach().clone() for p in own.model.parameters()]
    own.step(1.0)
    assert all(torch.equal(p, b) for p, b in zip(own.model.parameters(), before, strict=True))
