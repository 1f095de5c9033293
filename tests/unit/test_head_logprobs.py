"""Log-probs read a chunk at a time: equal to the whole head's (values, entropies, gradients), and no
[tokens x vocabulary] tensor kept for the backward."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from cadence.model.config import ModelConfig
from cadence.model.transformer import init_model
from cadence.ops.logprobs import head_logprobs, logprob_reader, token_logprobs
from cadence.ops.packing import pack_groups
from tests.unit.test_packing import groups_with_a_trunk

VOCAB = 97


def head_and_inputs(n: int, bias: bool) -> tuple[nn.Linear, Tensor, Tensor]:
    generator = torch.Generator().manual_seed(n)
    head = nn.Linear(16, VOCAB, bias=bias)
    with torch.no_grad():
        head.weight.copy_(torch.randn(VOCAB, 16, generator=generator))
        if head.bias is not None:
            head.bias.copy_(torch.randn(VOCAB, generator=generator))
    hidden = torch.randn(n, 16, generator=generator, requires_grad=True)
    targets = torch.randint(0, VOCAB, (n,), generator=generator)
    return head, hidden, targets


def grads(values: Tensor, weights: Tensor, *tensors: Tensor) -> list[Tensor]:
    return list(torch.autograd.grad((values * weights).sum(), tensors))


@pytest.mark.parametrize(("n", "chunk"), [(23, 5), (23, 23), (23, 64), (40, 8), (1, 1), (0, 4)])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_logprobs_entropies_and_gradients_equal_the_whole_head(
    n: int, chunk: int, temperature: float
) -> None:
    head, hidden, targets = head_and_inputs(n, bias=n % 2 == 1)
    weights = torch.randn(n, generator=torch.Generator().manual_seed(7))
    whole_entropy: list[Tensor] = []
    whole = token_logprobs(head(hidden).float(), targets, temperature, whole_entropy)
    entropy: list[Tensor] = []
    chunked = head_logprobs(hidden, head, targets, temperature, entropy, chunk)
    assert chunked.shape == (n,)
    torch.testing.assert_close(chunked, whole, rtol=0, atol=1e-5)
    torch.testing.assert_close(entropy[0], whole_entropy[0], rtol=1e-5, atol=1e-5)
    assert not entropy[0].requires_grad
    params = (hidden, head.weight, *([head.bias] if head.bias is not None else []))
    for got, want in zip(grads(chunked, weights, *params), grads(whole, weights, *params), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_the_backward_keeps_no_chunk_of_logits_only_the_hidden_states() -> None:
    head, hidden, targets = head_and_inputs(64, bias=False)
    saved: list[tuple[int, ...]] = []

    def pack(t: Tensor) -> Tensor:
        saved.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        chunked = head_logprobs(hidden, head, targets, chunk=16)
    assert saved  # the hidden states' chunks and the head's weight [V, H], never logits [n, V]
    assert all(shape[-1:] != (VOCAB,) for shape in saved), saved
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        token_logprobs(head(hidden).float(), targets)
    assert (64, VOCAB) in saved  # the whole head's graph keeps the logits [N, V]
    chunked.sum().backward()
    assert hidden.grad is not None and head.weight.grad is not None


def test_a_packed_row_read_through_the_models_head_argument_equals_its_logits() -> None:
    cfg = ModelConfig(vocab_size=20, hidden_size=32, intermediate_size=64)
    batch = pack_groups(groups_with_a_trunk(), 0)
    targets = batch.targets[batch.loss_mask]
    args = (batch.input_ids, batch.position_ids, batch.attn_mask)
    model = init_model(cfg, seed=3)
    whole = token_logprobs(model(*args, logits_at=batch.loss_mask), targets, 0.7)
    whole_grads = torch.autograd.grad(whole.sum(), list(model.parameters()))
    chunked = model(*args, logits_at=batch.loss_mask, head=logprob_reader(targets, 0.7, chunk=5))
    assert targets.numel() > 5  # several chunks
    torch.testing.assert_close(chunked, whole, rtol=0, atol=1e-5)
    chunked_grads = torch.autograd.grad(chunked.sum(), list(model.parameters()))
    for got, want in zip(chunked_grads, whole_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_a_chunk_must_hold_a_token() -> None:
    head, hidden, targets = head_and_inputs(4, bias=False)
    with pytest.raises(ValueError, match="chunk must be positive"):
        head_logprobs(hidden, head, targets, chunk=0)
