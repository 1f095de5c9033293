"""Shared-prompt packing: packed log-probs and gradients equal the unpacked ones; mask; micro-batches."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
import torch
from torch import Tensor

from cadence.model.config import ModelConfig
from cadence.model.transformer import Transformer, init_model
from cadence.ops.logprobs import token_logprobs
from cadence.ops.losses import grpo_loss_sum
from cadence.ops.packing import (
    Group,
    fill_in_order,
    micro_batches,
    pack_groups,
    packed_length,
    packed_logprobs,
    packed_row_length,
    per_sample,
    shared_trunk,
    to_padded,
)
from cadence.ops.sampled import sampled_rows
from cadence.training.policy_pass import pad_group

PAD = 0
CFG = ModelConfig(
    vocab_size=20,
    hidden_size=32,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    intermediate_size=64,
    max_position=256,
)


def make_groups(seed: int = 0) -> list[Group]:
    """3 groups, prompts of different lengths, G=4, responses of lengths 1..9."""
    rng = random.Random(seed)
    groups: list[Group] = []
    for prompt_len in (5, 11, 2):
        prompt = [rng.randrange(1, 20) for _ in range(prompt_len)]
        completions = [[rng.randrange(1, 20) for _ in range(rng.randint(1, 9))] for _ in range(4)]
        groups.append((prompt, completions))
    groups[0][1][0] = [7]  # at least one one-token response
    groups[1][1][1] = [rng.randrange(1, 20) for _ in range(9)]
    return groups


def groups_with_a_trunk(seed: int = 0) -> list[Group]:
    """3 groups whose prompts begin with the same 6 tokens (as a chat template's system prompt does),
    one of them only one token longer than that."""
    rng = random.Random(seed)
    common = [rng.randrange(1, 20) for _ in range(6)]
    tails = [[3, 9, 4], [5], [7, 7, 2, 11]]
    return [
        (common + tail, [[rng.randrange(1, 20) for _ in range(rng.randint(1, 6))] for _ in range(3)])
        for tail in tails
    ]


def unpacked_logprobs(model: Transformer, groups: list[Group]) -> Tensor:
    flat = []
    for prompt, completions in groups:
        inputs, targets, mask = pad_group(prompt, completions, PAD)
        flat.append(token_logprobs(model(inputs), targets)[mask])
    return torch.cat(flat)


def packed_flat(model: Transformer, groups: list[Group]) -> Tensor:
    batch = pack_groups(groups, PAD)
    return packed_logprobs(model(batch.input_ids, batch.position_ids, batch.attn_mask), batch)


@pytest.mark.parametrize("make", [make_groups, groups_with_a_trunk])
def test_packed_logprobs_and_gradients_equal_unpacked(make: Callable[[], list[Group]]) -> None:
    groups = make()
    model = init_model(CFG, seed=3)
    num_samples = sum(len(c) for _, c in groups)
    advantages = torch.randn(num_samples, generator=torch.Generator().manual_seed(1))
    lengths = [len(c) for _, cs in groups for c in cs]
    per_token_adv = torch.repeat_interleave(advantages, torch.tensor(lengths))

    grads = []
    flats = []
    for compute in (unpacked_logprobs, packed_flat):
        model.zero_grad(set_to_none=True)
        flat = compute(model, groups)
        (flat * per_token_adv).sum().backward()
        flats.append(flat.detach())
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    unpacked, packed = flats
    assert packed.shape == unpacked.shape == (sum(lengths),)
    assert (packed - unpacked).abs().max() <= 1e-5
    relative = (grads[1] - grads[0]).abs().max() / grads[0].abs().max()
    assert relative <= 1e-5


def test_per_sample_and_padded_follow_pad_group_order() -> None:
    groups = make_groups(seed=2)
    batch = pack_groups(groups, PAD)
    values = torch.arange(int(batch.loss_mask.sum()), dtype=torch.float32)
    pieces = per_sample(values, batch)
    assert [len(p) for p in pieces] == [len(c) for _, cs in groups for c in cs]
    padded, mask = to_padded(values, batch)
    assert padded.shape == (len(batch.lengths), max(batch.lengths))
    assert torch.equal(padded[mask], values)
    for i, piece in enumerate(pieces):
        assert torch.equal(padded[i, : len(piece)], piece)
    # each sample's targets are its completion, in order
    completions = [c for _, cs in groups for c in cs]
    for s, completion in enumerate(completions):
        assert batch.targets[batch.sample_index == s].tolist() == completion


def test_mask_isolates_responses_and_groups_and_positions_continue() -> None:
    groups = make_groups(seed=4)
    batch = pack_groups(groups, PAD)
    mask, sample, group = batch.attn_mask[0, 0], batch.sample_index[0], batch.group_index[0]
    query, key = torch.nonzero(mask, as_tuple=True)
    assert torch.all(key <= query)  # causal in row order
    assert torch.all(group[query] == group[key])  # never another group
    crossing = (sample[query] >= 0) & (sample[key] >= 0) & (sample[query] != sample[key])
    assert not crossing.any()  # a response never attends another
    start = 0
    for g, (prompt, completions) in enumerate(groups):
        size = packed_length(prompt, completions)
        body = len(prompt) - 1
        assert batch.position_ids[0, start : start + body].tolist() == list(range(body))
        at = start + body
        for completion in completions:
            n = len(completion)
            assert batch.input_ids[0, at] == prompt[-1]  # the segment's copy of the last prompt token
            assert batch.position_ids[0, at : at + n].tolist() == list(range(body, body + n))
            # a segment's token sees the whole prompt body, its own earlier tokens, nothing else
            for q in range(at, at + n):
                assert mask[q].nonzero().flatten().tolist() == [
                    *range(start, start + body),
                    *range(at, q + 1),
                ]
            at += n
        assert at == start + size and bool((group[start:at] == g).all())
        start = at
    assert start == batch.num_tokens


def test_the_shared_trunk_is_computed_once_and_seen_by_every_group() -> None:
    groups = groups_with_a_trunk(seed=3)
    batch = pack_groups(groups, PAD)
    trunk = 6
    assert shared_trunk([p for p, _ in groups]) == trunk
    assert (
        batch.num_tokens
        == packed_row_length(groups)
        == sum(packed_length(p, c) for p, c in groups) - 2 * trunk
    )
    mask, group = batch.attn_mask[0, 0], batch.group_index[0]
    assert batch.input_ids[0, :trunk].tolist() == groups[0][0][:trunk]
    assert batch.position_ids[0, :trunk].tolist() == list(range(trunk))
    for q in range(trunk):  # the trunk attends only itself, causally
        assert mask[q].nonzero().flatten().tolist() == list(range(q + 1))
    query, key = torch.nonzero(mask, as_tuple=True)
    assert torch.all((group[query] == group[key]) | (group[key] == -1))  # another group never
    for q in range(trunk, batch.num_tokens):  # every other position attends the whole trunk
        assert bool(mask[q, :trunk].all())
    start = trunk
    for g, (prompt, completions) in enumerate(groups):  # each body goes on from the trunk's positions
        body = len(prompt) - 1 - trunk
        assert batch.position_ids[0, start : start + body].tolist() == list(range(trunk, len(prompt) - 1))
        assert batch.input_ids[0, start : start + body].tolist() == prompt[trunk:-1]
        start += body + sum(len(c) for c in completions)
        assert bool((group[start - 1] == g).all())
    assert start == batch.num_tokens


def test_the_trunk_leaves_every_group_its_last_prompt_token() -> None:
    assert shared_trunk([[1, 2, 3]]) == 0  # one group: its body is its trunk
    assert shared_trunk([[1, 2, 3], [1, 2, 3, 4, 5]]) == 2  # the shorter prompt keeps its last token
    assert shared_trunk([[1, 2, 3], [1, 2, 3]]) == 2
    assert shared_trunk([[4, 2, 3], [1, 2, 3]]) == 0
    assert shared_trunk([[1], [1, 2]]) == 0
    groups = [([1, 2, 3], [[4], [5, 6]]), ([1, 2, 3], [[7]])]
    batch = pack_groups(groups, PAD)
    assert batch.num_tokens == packed_row_length(groups) == 2 + 3 + 1
    assert batch.input_ids[0].tolist() == [1, 2, 3, 3, 5, 3]  # trunk 1 2; each segment starts with its 3


def test_token_count_of_a_packed_group() -> None:
    prompt, completions = [1, 2, 3, 4, 5], [[6], [7, 8, 9], [], [10, 11]]
    batch = pack_groups([(prompt, completions)], PAD)
    assert batch.num_tokens == packed_length(prompt, completions) == len(prompt) - 1 + 6
    assert int(batch.loss_mask.sum()) == 6
    groups = make_groups()
    assert pack_groups(groups, PAD).num_tokens == sum(packed_length(p, c) for p, c in groups)


def test_micro_batches_respect_budget_keep_order_and_whole_groups() -> None:
    sizes = [10, 30, 25, 100, 5, 5, 60, 40]
    groups: list[Group] = [([1] * (s - 3), [[2], [3], [4]]) for s in sizes]  # packed_length = s - 1
    budget = 64
    batches = micro_batches(groups, budget)
    assert [i for b in batches for i in b] == list(range(len(groups)))
    for b in batches:
        total = sum(packed_length(*groups[i]) for i in b)
        assert total <= budget or len(b) == 1
    assert [3] in batches  # larger than the budget: alone
    assert any(len(b) > 1 for b in batches)  # several groups when they fit
    assert batches == [[0, 1, 2], [3], [4, 5], [6], [7]]
    with pytest.raises(ValueError, match="token_budget"):
        micro_batches(groups, 0)


def test_empty_prompt_is_refused() -> None:
    with pytest.raises(ValueError, match="empty prompt"):
        pack_groups([([], [[1, 2]])], PAD)


def test_grpo_loss_on_padded_packed_logprobs_equals_per_group_loss() -> None:
    groups = make_groups(seed=5)
    model = init_model(CFG, seed=6)
    advantages = torch.randn(sum(len(c) for _, c in groups), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        logp, mask = to_padded(packed_flat(model, groups), pack_groups(groups, PAD))
        packed_loss, _ = grpo_loss_sum(logp, logp - 0.1, advantages, mask, 0.2, 0.28)
        expected, start = 0.0, 0
        for prompt, completions in groups:
            inputs, targets, group_mask = pad_group(prompt, completions, PAD)
            group_logp = token_logprobs(model(inputs), targets)
            adv = advantages[start : start + len(completions)]
            loss, _ = grpo_loss_sum(group_logp, group_logp - 0.1, adv, group_mask, 0.2, 0.28)
            expected, start = expected + float(loss), start + len(completions)
    assert abs(float(packed_loss) - expected) <= 1e-5 * max(1.0, abs(expected))


def test_runs_keep_the_order_and_the_budget() -> None:
    assert fill_in_order([2, 3, 1, 5, 4], 4) == [[0], [1, 2], [3], [4]]
    assert fill_in_order([1, 1, 1], 8) == [[0, 1, 2]]
    assert fill_in_order([], 8) == []


def masks_for(groups: list[Group], seed: int) -> list[list[list[int]] | None]:
    """Random masks (about a third of the tokens an environment's) for every group but the second."""
    rng = random.Random(seed)
    return [
        None if g == 1 else [[int(rng.random() > 0.35) for _ in c] for c in completions]
        for g, (_, completions) in enumerate(groups)
    ]


@pytest.mark.parametrize("make", [make_groups, groups_with_a_trunk])
def test_environment_tokens_are_packed_and_attended_but_never_read(make: Callable[[], list[Group]]) -> None:
    """The row, its positions and its attention are those without masks; only the sampled tokens are
    read, and their log-probs are the unpacked ones (the environment's tokens in the forward)."""
    groups = make()
    masks = masks_for(groups, seed=8)
    plain, masked = pack_groups(groups, PAD), pack_groups(groups, PAD, masks)
    for name in ("input_ids", "position_ids", "attn_mask", "group_index"):
        assert torch.equal(getattr(plain, name), getattr(masked, name)), name
    assert masked.lengths == plain.lengths and masked.num_tokens == packed_row_length(groups)
    completions = [c for _, cs in groups for c in cs]
    flat = [m for (_, cs), ms in zip(groups, masks, strict=True) for m in (ms or [[1] * len(c) for c in cs])]
    sampled = torch.tensor([bit for m in flat for bit in m], dtype=torch.bool)
    assert 0 < int(sampled.sum()) < len(sampled)  # the check has environment tokens and sampled ones
    assert torch.equal(masked.loss_mask[plain.loss_mask], sampled)
    assert not (masked.loss_mask & ~plain.loss_mask).any()
    assert torch.equal(masked.targets[masked.loss_mask], plain.targets[plain.loss_mask][sampled])
    model = init_model(CFG, seed=3)
    with torch.no_grad():
        got = packed_logprobs(model(masked.input_ids, masked.position_ids, masked.attn_mask), masked)
        want = unpacked_logprobs(model, groups)[sampled]
        by_row = torch.cat(
            [
                token_logprobs(model(inputs), targets)[mask]
                for (prompt, cs), ms in zip(groups, masks, strict=True)
                for inputs, targets, mask in [pad_group(prompt, cs, PAD, ms)]
            ]
        )
    assert got.shape == want.shape == by_row.shape and (got - want).abs().max() <= 1e-5
    assert (by_row - want).abs().max() <= 1e-5
    assert [len(p) for p in per_sample(got, masked)] == [sum(m) for m in flat]
    padded, read = to_padded(got, masked)
    assert torch.equal(read, sampled_rows(completions, flat)) and torch.equal(padded[read], got)
    assert float(padded[~read].abs().max()) == 0.0


def test_masks_that_do_not_line_up_with_the_groups_are_refused() -> None:
    groups = make_groups()
    with pytest.raises(ValueError, match="2 group masks for 3 groups"):
        pack_groups(groups, PAD, [None, None])
    with pytest.raises(ValueError, match="mask 0 has 0 entries"):
        pack_groups(groups, PAD, [[[] for _ in groups[0][1]], None, None])
