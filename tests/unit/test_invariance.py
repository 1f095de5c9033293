"""A sample depends on its prompt, its seed and the weights, never on what it was batched with: the
products from `least_rows` rows on, the decode step's attention at any rows and any width, and the engine's
samples bit for bit, together or alone, exact rows or buckets (a model of SmolLM2's widths, where
the CPU's kernels differ by the batch's size)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from cadence.model.config import ModelConfig
from cadence.model.decode_step import attend
from cadence.model.engine import Completion, SamplingParams, TorchEngine, sample_seed
from cadence.model.invariance import MAX_LEAST, PROBE_ROWS, by_chunks, least_rows, linear_rows, product_shapes
from cadence.model.slots import WIDTH_STEP
from cadence.model.transformer import Transformer, init_model

WIDE = ModelConfig(  # SmolLM2-135M's widths and heads, two layers, a small vocabulary
    vocab_size=512, hidden_size=576, num_layers=2, num_heads=9, num_kv_heads=3, intermediate_size=1536
)
EOS = 2


@pytest.fixture(autouse=True)
def _threads() -> None:
    torch.set_num_threads(2)


TINY = ModelConfig(  # the episode tests' model: other shapes, whose kernels change at other row counts
    vocab_size=100, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64
)


@pytest.mark.parametrize("cfg", [WIDE, TINY], ids=["smollm2-widths", "tiny"])
@pytest.mark.parametrize("weights_first", [False, True])
def test_from_the_least_rows_on_every_row_of_every_product_is_as_in_any_larger_batch(
    weights_first: bool, cfg: ModelConfig
) -> None:
    """Every product of the model's shapes (and the whole head), by chunks as the engine computes it:
    from `least` rows to three times the probe's, each row the same bit for bit."""
    model = init_model(cfg, seed=0)
    least = least_rows(product_shapes(model), torch.float32, weights_first)
    assert 1 <= least <= MAX_LEAST
    g = torch.Generator().manual_seed(7)  # other matrices than the probe's
    most = 3 * PROBE_ROWS
    for outputs, inputs in [*product_shapes(model), (cfg.vocab_size, cfg.hidden_size)]:
        w = torch.randn(outputs, inputs, generator=g)
        x = torch.randn(most, inputs, generator=g)
        reference = by_chunks(_mm(w, weights_first), x, least)
        for m in range(least, most):
            assert torch.equal(by_chunks(_mm(w, weights_first), x[:m], least), reference[:m]), (
                outputs,
                inputs,
                m,
            )
        linear = torch.nn.Linear(inputs, outputs, bias=False)  # and as the model's modules compute it
        linear.weight.data = w
        across = least_rows(product_shapes(model), torch.float32, weights_first=False)
        whole = linear_rows(x, w, None, across)
        for m in (across, PROBE_ROWS + 1, 2 * PROBE_ROWS + across - 1, most - 1):
            assert torch.equal(linear_rows(x[:m], w, None, across), whole[:m]), (outputs, inputs, m)


def _mm(w: torch.Tensor, weights_first: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    if weights_first:
        return lambda x: torch.mm(w, x.t()).t()
    return lambda x: torch.mm(x, w.t())


def test_the_decode_steps_attention_gives_each_row_alike_at_any_rows() -> None:
    g = torch.Generator().manual_seed(1)
    rows, heads, kv, dim, width = 48, 9, 3, 64, 128
    q = torch.randn(rows, heads, 1, dim, generator=g)
    k, v = torch.randn(rows, kv, width, dim, generator=g), torch.randn(rows, kv, width, dim, generator=g)
    seen = (torch.arange(width) <= torch.randint(0, width, (rows,), generator=g).unsqueeze(1)).view(
        rows, 1, 1, width
    )
    whole = attend(q, k, v, seen, grouped=True)
    for b in (1, 2, 5, 12, 17, 47):
        assert torch.equal(attend(q[:b], k[:b], v[:b], seen[:b], grouped=True), whole[:b]), b
    sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=seen, enable_gqa=True)
    assert torch.allclose(whole, sdpa, atol=1e-6)


@pytest.mark.parametrize("threads", [1, 2])
def test_the_decode_steps_attention_gives_each_row_alike_at_any_width(threads: int) -> None:
    """A step attends the positions of its longest row (a multiple of `WIDTH_STEP`, or the cache's
    whole length): a row's result is the same bit for bit at every width past its position. As one
    product over every position, MKL summed a row at position 300 otherwise at width 448 than at 320."""
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(2)
    rows, heads, kv, dim, length = 5, 9, 3, 64, 1500  # a cache length that is not a multiple
    q = torch.randn(rows, heads, 1, dim, generator=g)
    k, v = torch.randn(rows, kv, length, dim, generator=g), torch.randn(rows, kv, length, dim, generator=g)
    for position in (3, 70, 200, 300, 450, 600, 900, 1400, 1499):
        at = torch.full((rows,), position)
        widths = [*range(-(-(position + 1) // WIDTH_STEP) * WIDTH_STEP, length, WIDTH_STEP), length]
        results = []
        for width in widths:
            seen = (torch.arange(width) <= at.unsqueeze(1)).view(rows, 1, 1, width)
            results.append(attend(q, k[:, :, :width], v[:, :, :width], seen, grouped=True))
        assert all(torch.equal(r, results[-1]) for r in results), (position, widths)
    whole = (torch.arange(length) <= torch.tensor([1400] * rows).unsqueeze(1)).view(rows, 1, 1, length)
    sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=whole, enable_gqa=True)
    assert torch.allclose(attend(q, k, v, whole, grouped=True), sdpa, atol=1e-6)


def test_a_long_sample_is_the_same_bit_for_bit_beside_a_longer_one() -> None:
    """Rows past a few hundred positions, decoded alone and beside a longer prompt's rows (whose
    positions make the step wider): the same tokens and log-probs bit for bit."""
    model = init_model(dataclasses.replace(WIDE, max_position=1024), seed=0)
    _alike_alone_and_together(model, lengths=(380, 470), samples=2, new_tokens=40, rows=8)


def test_a_sample_is_the_same_bit_for_bit_whatever_it_is_decoded_beside() -> None:
    model = init_model(WIDE, seed=0)
    prompts = [[5, 9, 4, 7, 11, 30], [8, 1], [3, 3, 6, 1, 5, 9, 12, 4, 40, 41], [6, 3, 8]]
    groups = [(p, [sample_seed(0, 0, i, j) for j in range(4)]) for i, p in enumerate(prompts)]
    params = SamplingParams(max_new_tokens=10, temperature=1.0)
    together = TorchEngine(model, eos_id=EOS, rows=16).generate_many(groups, params)
    alone = [TorchEngine(model, eos_id=EOS, rows=16).generate_many([g], params)[0] for g in groups]
    bucketed = TorchEngine(model, eos_id=EOS, rows=16, buckets=True).generate_many(groups, params)
    for other in (alone, bucketed):
        assert [[(c.tokens, c.logprobs) for c in g] for g in other] == [
            [(c.tokens, c.logprobs) for c in g] for g in together
        ]


def test_a_sample_is_the_same_whatever_it_is_decoded_beside_past_the_probes_rows() -> None:
    """64 rows decoded together (more than `PROBE_ROWS`: every product by chunks) and 140 prompt
    tokens prefilled in one row, against each prompt's 16 samples alone: the same bit for bit."""
    model = init_model(WIDE, seed=0)
    _alike_alone_and_together(model, lengths=(41, 23, 37, 39), samples=16, new_tokens=6, rows=64)


def _alike_alone_and_together(
    model: Transformer, lengths: tuple[int, ...], samples: int, new_tokens: int, rows: int
) -> None:
    """Random prompts of `lengths`, `samples` each: decoded in one call and each alone, the same
    tokens and log-probs bit for bit."""
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, WIDE.vocab_size, (n,), generator=g).tolist() for n in lengths]
    groups = [(p, [sample_seed(1, 0, i, j) for j in range(samples)]) for i, p in enumerate(prompts)]
    params = SamplingParams(max_new_tokens=new_tokens, temperature=1.0)
    together = TorchEngine(model, eos_id=EOS, rows=rows).generate_many(groups, params)
    alone = [TorchEngine(model, eos_id=EOS, rows=rows).generate_many([g], params)[0] for g in groups]
    assert [[(c.tokens, c.logprobs) for c in g] for g in alone] == [
        [(c.tokens, c.logprobs) for c in g] for g in together
    ]


def test_prompts_that_begin_alike_beyond_the_trunk_are_computed_alike_together_alone_or_joined() -> None:
    """Three prompts that share a beginning beyond the engine's trunk ("What is " after the chat
    template's): decoded in one call, each alone, or two joining the first's call, every sample is
    the same bit for bit; only a beginning the caller names (`shared`, an episode batch's opening)
    is computed once for the prompts that begin with it."""
    model = init_model(WIDE, seed=0)
    trunk = [1, 7, 7, 3, 9, 12]  # the chat template's beginning every prompt shares
    begin = trunk + [20, 21, 22, 23, 24, 25, 26, 27, 28, 29]  # "What is " and more: beyond MIN_TRUNK
    prompts = [begin + [30, 31], begin + [40, 41, 42, 43, 44], begin + [50]]
    groups = [(p, [sample_seed(0, 0, i, j) for j in range(3)]) for i, p in enumerate(prompts)]
    params = SamplingParams(max_new_tokens=12, temperature=1.0)

    def engine() -> TorchEngine:
        return TorchEngine(model, eos_id=EOS, rows=16, trunk=trunk)

    def bits(out: list[list[Completion]]) -> list[list[tuple[list[int], list[float]]]]:
        return [[(c.tokens, c.logprobs) for c in group] for group in out]

    together = engine().generate_many(groups, params)
    alone = [engine().generate_many([g], params)[0] for g in groups]
    later = list(groups[1:])
    joined = engine().generate_many(groups[:1], params, joining=lambda room: [later.pop(0)] if later else [])
    assert bits(alone) == bits(joined) == bits(together)
    named = engine().generate_many(groups, params, shared=begin)  # computed once, read by each
    assert [[c.tokens for c in g] for g in named] == [[c.tokens for c in g] for g in together]
    for ours, theirs in zip(named, together, strict=True):
        for a, b in zip(ours, theirs, strict=True):
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
