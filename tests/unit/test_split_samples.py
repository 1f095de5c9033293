"""A sample of several rows (an agent's episode whose calls formed several token sequences) trains as the
one sample it is: its reward counted once in its group's advantages, every row with that advantage,
each normaliser counting it as a sample of its rows' sampled tokens, and the loss and gradient of the
same tokens split in two rows equal to those of one row (every objective at ratio 1, where a period
takes one step; the token-summed and token-mean objectives at any ratio)."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from cadence.model.tokenizer import CharTokenizer
from cadence.model.transformer import init_model
from cadence.ops.advantages import group_advantages
from cadence.ops.distinct import distinct_samples
from cadence.ops.losses import OBJECTIVES, objective_loss_sum, step_normaliser
from cadence.training.learner import TorchLearner
from cadence.training.parallel import share
from cadence.training.train_group import TrainGroup, sampled_tokens
from tests.unit.test_prefix import CONFIGS

PROMPT = [3, 4, 5]
# episode 0 in one row: the model sampled 6 7, the environment wrote 8, the model sampled 9 10 11
WHOLE = [6, 7, 8, 9, 10, 11]
WHOLE_MASK = [1, 1, 0, 1, 1, 1]
# the same episode in two rows: the first holds 6 7 (8 as context), the second the rest, 6 7 8 as context
FIRST, FIRST_MASK = [6, 7, 8], [1, 1, 0]
SECOND, SECOND_MASK = WHOLE, [0, 0, 0, 1, 1, 1]
OTHER, OTHER_MASK = [12, 13, 14], [1, 1, 1]
REWARDS = [1.0, 0.0, 0.25]


def whole() -> TrainGroup:
    completions = [WHOLE, OTHER, [15, 16]]
    return TrainGroup(PROMPT, completions, REWARDS, masks=[WHOLE_MASK, OTHER_MASK, [1, 1]])


def split() -> TrainGroup:
    completions = [FIRST, SECOND, OTHER, [15, 16]]
    masks = [FIRST_MASK, SECOND_MASK, OTHER_MASK, [1, 1]]
    return TrainGroup(PROMPT, completions, REWARDS, masks=masks, episode_of=[0, 0, 1, 2])


def test_the_advantage_is_the_episodes_counted_once_in_its_group() -> None:
    own = group_advantages(torch.tensor(REWARDS), scale=True).tolist()
    assert split().advantage_list(True) == [own[0], own[0], own[1], own[2]]
    assert whole().advantage_list(True) == own


def test_a_normaliser_counts_an_episode_once_and_its_sampled_tokens_all() -> None:
    assert sampled_tokens([split()]) == sampled_tokens([whole()]) == [5, 3, 2]
    for objective in OBJECTIVES:
        for normaliser in ("tokens", "samples"):
            args = (objective, normaliser)
            assert step_normaliser(*args, sampled_tokens([split()]), 16) == step_normaliser(
                *args, sampled_tokens([whole()]), 16
            )
    assert split().sample_token_list() == [5, 5, 3, 2] and whole().sample_token_list() is None


def test_a_share_of_a_split_group_keeps_each_rows_advantage_and_sample_tokens() -> None:
    advantages = split().advantage_list(True)
    parts = [share([split()], rank, 2)[0] for rank in range(2)]
    assert parts[0].advantages == [advantages[0], advantages[2]] and parts[0].sample_tokens == [5, 3]
    assert parts[1].advantages == [advantages[1], advantages[3]] and parts[1].sample_tokens == [5, 2]
    assert parts[0].sample_lengths() == [2, 3]  # a share's rows are their own samples: no recount


def test_rows_alike_in_samples_of_other_lengths_are_not_merged() -> None:
    rows = [[1, 2], [1, 2]]
    assert distinct_samples(rows, [1.0, 1.0], None, True, sample_tokens=[2, 2]) == [(0, 2)]
    assert distinct_samples(rows, [1.0, 1.0], None, True, sample_tokens=[2, 5]) == [(0, 1), (1, 1)]


def rows_of(tokens: list[list[float]], masks: list[list[int]]) -> tuple[Tensor, Tensor]:
    width = max(len(t) for t in tokens)
    logp = torch.tensor([t + [0.0] * (width - len(t)) for t in tokens], requires_grad=True)
    mask = torch.tensor([m + [0] * (width - len(m)) for m in masks], dtype=torch.bool)
    return logp, mask


@pytest.mark.parametrize("objective", OBJECTIVES)
@pytest.mark.parametrize("on_policy", [True, False])
def test_a_sample_split_in_two_rows_has_the_loss_and_gradient_of_one(objective: str, on_policy: bool) -> None:
    """The pure loss: one row of six tokens (five sampled) against the same tokens in two rows, each
    sampled token in one of them; the gradient taken per token, each where its row holds it."""
    values = [-0.7, -1.1, 0.0, -0.4, -2.0, -0.9]
    old_values = values if on_policy else [-0.6, -1.5, 0.0, -0.5, -1.2, -1.0]
    logp, mask = rows_of([values], [WHOLE_MASK])
    old, _ = rows_of([old_values], [WHOLE_MASK])
    one, _ = objective_loss_sum(objective, logp, old.detach(), torch.tensor([0.8]), mask, 0.2, 0.28)
    one.backward()
    parts, part_mask = rows_of([values[:3], values], [FIRST_MASK, SECOND_MASK])
    old_parts, _ = rows_of([old_values[:3], old_values], [FIRST_MASK, SECOND_MASK])
    two, _ = objective_loss_sum(
        objective,
        parts,
        old_parts.detach(),
        torch.tensor([0.8, 0.8]),
        part_mask,
        0.2,
        0.28,
        sample_tokens=torch.tensor([5.0, 5.0]),
    )
    two.backward()
    assert logp.grad is not None and parts.grad is not None
    gathered = torch.cat([parts.grad[0, :2], parts.grad[1, 3:]])
    expected = torch.cat([logp.grad[0, :2], logp.grad[0, 3:]])
    if objective == "gspo" and not on_policy:  # each row's own sequence ratio: the rule differs here
        assert abs(float(two.detach()) - float(one.detach())) > 1e-4
        return
    assert float(two.detach()) == pytest.approx(float(one.detach()), rel=1e-6, abs=1e-7)
    assert expected.abs().max() > 0 and torch.allclose(gathered, expected, rtol=1e-6, atol=1e-7)


def learner(objective: str) -> TorchLearner:
    cfg = CONFIGS["qwen3"]
    return TorchLearner(
        init_model(cfg, seed=5), cfg, CharTokenizer(), 1e-3, 0.0, 0.2, 0.28, 0.0, 1.0, objective=objective
    )


def step_grads(group: TrainGroup, objective: str) -> Tensor:
    trained = learner(objective)
    trained.train_groups([group])
    normaliser = step_normaliser(objective, "tokens", sampled_tokens([group]), 16)
    return torch.cat(
        [p.grad.flatten() / normaliser for p in trained.model.parameters() if p.grad is not None]
    )


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_the_learners_step_of_a_split_episode_is_the_one_rows(objective: str) -> None:
    """Through the learner (one step a period: ratio 1): the group with episode 0 in two rows gives the
    normalised gradient of the group with it in one, for every objective."""
    expected = step_grads(whole(), objective)
    got = step_grads(split(), objective)
    assert expected.abs().max() > 0
    assert (got - expected).abs().max() <= 1e-5 * expected.abs().max()
