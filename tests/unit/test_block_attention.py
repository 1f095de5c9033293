"""A packed row attended by blocks: the same attention as the dense bool mask (the mask itself, the
attention's values and gradients, the model's logits and gradients), without a [T, T] tensor."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from cadence.model.config import ModelConfig
from cadence.model.transformer import KVCache, init_model
from cadence.ops.block_attention import SegmentMask, prompts_mask, segment_mask
from cadence.ops.packing import Group, pack_groups
from tests.unit.test_packing import groups_with_a_trunk, make_groups

MAKERS: list[Callable[[], list[Group]]] = [make_groups, groups_with_a_trunk, lambda: make_groups()[:1]]


def formula(groups: list[int], segments: list[int]) -> Tensor:
    """The packed row's mask as one formula over [T, T]: same group or the trunk, causal, and a
    response segment seen only from itself."""
    grp, seg = torch.tensor(groups), torch.tensor(segments)
    idx = torch.arange(len(groups))
    return (
        ((grp[:, None] == grp[None, :]) | (grp[None, :] == -1))
        & (idx[None, :] <= idx[:, None])
        & ((seg[None, :] == -1) | (seg[None, :] == seg[:, None]))
    )


def indices(groups: list[Group]) -> tuple[list[int], list[int]]:
    """Each position's group and segment, as `pack_groups` lays the row out."""
    group = pack_groups(groups, 0).group_index[0].tolist()
    trunk = group.count(-1)
    segment = [-1] * trunk  # the trunk, then each group's body, then its segments
    s = 0
    for prompt, completions in groups:
        segment += [-1] * (len(prompt) - 1 - trunk)
        for completion in completions:
            segment += [s] * len(completion)
            s += 1
    return group, segment


@pytest.mark.parametrize("make", MAKERS)
def test_the_runs_give_the_masks_formula(make: Callable[[], list[Group]]) -> None:
    group, segment = indices(make())
    mask = segment_mask(group, segment)
    assert torch.equal(mask.dense()[0, 0], formula(group, segment))
    assert torch.equal(pack_groups(make(), 0).attn_mask[0, 0], formula(group, segment))
    read = sum(r.size * (mask.seen(r) + r.size) for r in mask.runs)
    assert read < mask.length**2  # a run reads its context and itself, never the whole row


@pytest.mark.parametrize("make", MAKERS)
def test_attention_by_blocks_equals_the_dense_masks(make: Callable[[], list[Group]]) -> None:
    group, segment = indices(make())
    mask = segment_mask(group, segment)
    generator = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 3, mask.length, 8, generator=generator, requires_grad=True) for _ in range(3))
    weights = torch.randn(1, 3, mask.length, 8, generator=generator)
    dense = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.dense())
    blocks = mask.attend(q, k, v)
    torch.testing.assert_close(blocks, dense, rtol=0, atol=1e-6)
    want = torch.autograd.grad((dense * weights).sum(), (q, k, v))
    got = torch.autograd.grad((blocks * weights).sum(), (q, k, v))
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_the_models_logits_and_gradients_by_blocks_equal_the_dense_masks(family: str) -> None:
    cfg = ModelConfig(vocab_size=20, hidden_size=32, intermediate_size=64, family=family)
    batch = pack_groups(groups_with_a_trunk(), 0)
    model = init_model(cfg, seed=5)
    weights = torch.randn(batch.num_tokens, cfg.vocab_size, generator=torch.Generator().manual_seed(3))
    dense = model(batch.input_ids, batch.position_ids, batch.attn_mask)
    blocks = model(batch.input_ids, batch.position_ids, batch.segments)
    torch.testing.assert_close(blocks, dense, rtol=0, atol=1e-5)
    params = list(model.parameters())
    want = torch.autograd.grad((dense[0] * weights).sum(), params)
    got = torch.autograd.grad((blocks[0] * weights).sum(), params)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_a_segment_mask_that_does_not_fit_the_forward_falls_back_to_its_dense_mask() -> None:
    cfg = ModelConfig(vocab_size=20, hidden_size=32, intermediate_size=64)
    batch = pack_groups(make_groups(), 0)
    model = init_model(cfg, seed=5)
    rows = batch.input_ids.expand(2, -1)
    positions = batch.position_ids.expand(2, -1)
    dense = model(rows, positions, batch.attn_mask)
    torch.testing.assert_close(model(rows, positions, batch.segments), dense, rtol=0, atol=1e-6)


def test_runs_and_queries_that_do_not_line_up_are_refused() -> None:
    with pytest.raises(ValueError, match="group indices"):
        segment_mask([-1, 0], [-1])
    mask: SegmentMask = segment_mask([0, 0, 0], [-1, 0, 0])
    q = torch.zeros(1, 1, 4, 2)
    with pytest.raises(ValueError, match="3 positions after 0 given 4 queries"):
        mask.attend(q, q, q)


def test_prompts_after_a_cached_context_see_it_and_themselves_alone() -> None:
    """The engine's prefill of a row: prompts one after another after c cached positions. The mask
    is the formula (the context whole, then each prompt causally and no other), the attention by
    blocks equals the dense mask's, and so does the model's forward over a cache."""
    sizes, c = [3, 1, 4, 2], 5
    mask = prompts_mask(sizes, c)
    prompt = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    local = torch.arange(mask.length) - (torch.tensor(sizes).cumsum(0) - torch.tensor(sizes))[prompt]
    sees = (prompt[:, None] == prompt[None, :]) & (local[:, None] >= local[None, :])
    want = torch.cat([torch.ones(mask.length, c, dtype=torch.bool), sees], dim=1)
    assert torch.equal(mask.dense()[0, 0], want)
    generator = torch.Generator().manual_seed(4)
    q = torch.randn(1, 2, mask.length, 8, generator=generator)
    k, v = (torch.randn(1, 2, c + mask.length, 8, generator=generator) for _ in range(2))
    dense = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.dense())
    torch.testing.assert_close(mask.attend(q, k, v), dense, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="after 5 given 10 queries and 10 keys"):
        mask.attend(q, q, q)

    cfg = ModelConfig(vocab_size=20, hidden_size=32, intermediate_size=64, num_heads=4, num_kv_heads=2)
    model = init_model(cfg, seed=6)
    ids = torch.randint(0, 20, (1, c + mask.length), generator=generator)
    positions = (c + local).unsqueeze(0)
    logits = []
    with torch.no_grad():
        for how in (mask, mask.dense()):
            cache = KVCache()
            model(ids[:, :c], cache=cache)
            logits.append(model(ids[:, c:], positions, how, cache))
    torch.testing.assert_close(logits[0], logits[1], rtol=0, atol=1e-5)
