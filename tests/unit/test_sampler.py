"""The device sampler as pure functions: the inverse CDF against a reference that counts, the edges of
the uniform's range, probabilities of zero never drawn, and the nucleus."""

from __future__ import annotations

import torch

from cadence.model.sampler import inverse_cdf, pick, sample


def reference(probs: torch.Tensor, uniforms: torch.Tensor) -> list[int]:
    """The first index whose float64 running sum exceeds the uniform times the total, looked for one by
    one; past the end (a uniform of 1), the last index of a probability above 0."""
    out = []
    for row, u in zip(probs.tolist(), uniforms.tolist(), strict=True):
        cdf = torch.tensor(row, dtype=torch.float64).cumsum(0).tolist()
        target = u * cdf[-1]
        past = [i for i, c in enumerate(cdf) if c > target]
        chosen = past[0] if past else max(i for i, p in enumerate(row) if p > 0)
        out.append(chosen)
    return out


def test_the_inverse_cdf_is_the_first_index_past_the_uniform_and_never_a_zero() -> None:
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(64, 300, generator=g) * 4, dim=-1)
    probs[:, ::3] = 0.0  # every third token impossible, the first and last ones among them
    probs[:, -2:] = 0.0
    uniforms = torch.rand(64, generator=g)
    uniforms[0], uniforms[1] = 0.0, torch.nextafter(torch.tensor(1.0), torch.tensor(0.0))
    index = inverse_cdf(probs, uniforms)
    assert index.tolist() == reference(probs, uniforms)
    assert bool((probs.gather(1, index.unsqueeze(1)) > 0).all())


def test_a_uniform_of_one_draws_the_last_possible_token_not_one_past_the_end() -> None:
    probs = torch.tensor([[0.2, 0.0, 0.5, 0.3, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    assert inverse_cdf(probs, torch.ones(2)).tolist() == [3, 0]


def test_drawn_tokens_follow_their_probabilities() -> None:
    """Many uniforms on one row: each token's share within a few standard errors of its probability
    (fixed seed: the same draws every run)."""
    probs = torch.tensor([0.5, 0.0, 0.25, 0.125, 0.0625, 0.0625])
    n = 40_000
    uniforms = torch.rand(n, generator=torch.Generator().manual_seed(1))
    counts = torch.bincount(inverse_cdf(probs.expand(n, -1), uniforms), minlength=6).double() / n
    se = (probs.double() * (1 - probs.double()) / n).sqrt()
    assert counts[1] == 0 and counts[4] > 0
    assert bool(((counts - probs.double()).abs() <= 5 * se + 1e-12).all()), counts


def test_the_nucleus_keeps_the_top_tokens_and_greedy_takes_the_argmax() -> None:
    logits = torch.log(torch.tensor([[0.1, 0.6, 0.05, 0.25]]))
    uniforms = torch.linspace(0, 0.999, 200)
    drawn = {int(pick(logits.expand(200, -1), uniforms, 1.0, 0.8)[i]) for i in range(200)}
    assert drawn == {1, 3}  # 0.6 + 0.25 reach 0.8: the 0.1 and the 0.05 are out
    token, logprob = sample(logits, torch.tensor([0.3]), 0.0, 1.0)
    assert token.tolist() == [1] and abs(logprob.item() - torch.log(torch.tensor(0.6)).item()) < 1e-6
