"""The embedding lookup whose backward adds its rows into the weight's gradient in place: the same
gradients as autograd's own lookup, tied head or not, over several accumulated backwards."""

from __future__ import annotations

import copy

import pytest
import torch

from cadence.model.config import ModelConfig
from cadence.model.embedding import lookup_into_grad
from cadence.model.transformer import Transformer, init_model


def model(tied: bool) -> Transformer:
    cfg = ModelConfig(
        vocab_size=97,
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=64,
        max_position=64,
        tie_embeddings=tied,
    )
    return init_model(cfg, 0)


@pytest.mark.parametrize("tied", [True, False])
def test_the_gradients_are_autograds_over_accumulated_backwards(tied: bool) -> None:
    plain = model(tied)
    fast = copy.deepcopy(plain)
    fast.lookup_into_grad = True
    ids = [torch.tensor([[3, 3, 5, 7, 3, 11]]), torch.tensor([[5, 2, 2, 9]])]  # repeated ids too
    for m in (plain, fast):
        for x in ids:
            (m(x).log_softmax(-1)[..., 1].sum() * 0.5).backward()
    assert fast.lm_head.weight is fast.model.embed_tokens.weight or not tied
    for (name, p), q in zip(plain.named_parameters(), fast.parameters(), strict=True):
        assert p.grad is not None and q.grad is not None, name
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-6, msg=name)


def test_it_starts_the_gradient_where_none_is_and_adds_in_place_where_one_is() -> None:
    weight = torch.nn.Parameter(torch.arange(12.0).view(4, 3))
    ids = torch.tensor([[1, 1, 3]])
    lookup_into_grad(ids, weight).sum().backward()
    assert weight.grad is not None
    first = weight.grad
    torch.testing.assert_close(first, torch.tensor([[0.0] * 3, [2.0] * 3, [0.0] * 3, [1.0] * 3]))
    out = lookup_into_grad(torch.tensor([[0]]), weight)
    torch.testing.assert_close(out, weight.detach()[[0]].unsqueeze(0))
    (out * 2).sum().backward()
    assert weight.grad is first  # the same tensor, added to in place
    torch.testing.assert_close(first[0], torch.full((3,), 2.0))


def test_without_grad_the_model_takes_autograds_lookup() -> None:
    m = model(True)
    m.lookup_into_grad = True
    with torch.no_grad():
        out = m(torch.tensor([[1, 2, 3]]))
    assert out.grad_fn is None and m.model.embed_tokens.weight.grad is None
