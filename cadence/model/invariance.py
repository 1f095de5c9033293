"""How many rows a matrix product needs before each row comes out alike whatever the others are.

A BLAS picks its kernel by the product's shape: on the CPU, MKL computes a row of a float32 product
of 1, 2-3 or 4-11 rows in another order than the same row among 12 or more (AMD EPYC, AVX2, two
threads; x·Wᵀ and W·xᵀ alike, 4 with one thread for x·Wᵀ), so a sample decoded beside 3 others and
the same sample beside 31 differ in the last bits of their logits, and a sampled token can flip
(SmolLM2, 32 rows x 48 tokens: 4 rows of 32 apart). Where the kernels change depends on the shape as
well: on an Intel Xeon with AVX-512 (two threads, x·Wᵀ) a product of 64 inputs to 64 outputs was alike
from 3 rows, of 128 inputs to 64 from 6, of SmolLM2's 576 to 1 536 from 16. From `least_rows` rows
on, every row of every product of the model's shapes is bit for bit what it is in a batch of
`PROBE_ROWS`: the engine computes at least that many (padding rows that write nowhere), so a sample
depends only on its prompt, its seed and the weights, never on what it was batched with.

```
least_rows(shapes, dtype, weights_first) ─► for each (outputs, inputs) of the model's products
   (`product_shapes`): random W, x [PROBE_ROWS, inputs] ─► the fewest m from which every product of
   m rows equals the first m rows of PROBE_ROWS's; the largest over the shapes (once a process, its
   thread count and layout)
```

Invariant: measured on this process's BLAS with its thread count, never assumed; a machine where no
count up to `MAX_LEAST` does it gets 1 and one log line (`batch_variant_products`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import structlog
import torch
import torch.nn.functional as F
from torch import Tensor, nn

log = structlog.get_logger()

PROBE_ROWS = 48
"""The batch every smaller one is compared with."""

MAX_LEAST = 32
"""Past this many rows padding would cost more than it is worth: the products are left batch-variant."""


HEAD_PROBE_OUTPUTS = 8192
"""A product is probed with at most this many outputs (the head's are the vocabulary's): the kernel a
row count picks was the same beyond it, and the whole head would cost the probe a second."""


def product_shapes(model: nn.Module) -> tuple[tuple[int, int], ...]:
    """(outputs, inputs) of every matrix product `model` computes a row at a time: each linear
    module's (its projections, an adapter's A and B, the head, capped at `HEAD_PROBE_OUTPUTS`)."""
    shapes = {
        (min(m.out_features, HEAD_PROBE_OUTPUTS), m.in_features)
        for m in model.modules()
        if isinstance(m, nn.Linear)
    }
    return tuple(sorted(shapes))


def least_rows(shapes: Sequence[tuple[int, int]], dtype: torch.dtype, weights_first: bool) -> int:
    """The fewest rows from which products of each (outputs, inputs) shape give each row exactly as
    among `PROBE_ROWS` rows, on the CPU with this thread's thread count (1: any)."""
    return _probe(tuple(sorted(set(shapes))), dtype, weights_first, torch.get_num_threads())


@functools.cache
def _probe(shapes: tuple[tuple[int, int], ...], dtype: torch.dtype, weights_first: bool, threads: int) -> int:
    generator = torch.Generator().manual_seed(0)
    least = 1
    for outputs, inputs in shapes:
        w = torch.randn(outputs, inputs, generator=generator).to(dtype)
        x = torch.randn(PROBE_ROWS, inputs, generator=generator).to(dtype)
        least = max(least, _least(rows_product(w, x, weights_first)))
    if least > MAX_LEAST:
        log.warning("batch_variant_products", least=least, threads=threads, dtype=str(dtype))
        return 1
    return least


def rows_product(w: Tensor, x: Tensor, weights_first: bool) -> Callable[[int], Tensor]:
    """The product of `x`'s first m rows with `w` (as x·Wᵀ, or W·xᵀ transposed), for any m."""
    if weights_first:
        return lambda m: torch.mm(w, x[:m].t()).t()
    return lambda m: torch.mm(x[:m], w.t())


def _least(product: Callable[[int], Tensor]) -> int:
    reference = product(PROBE_ROWS)
    for m in range(PROBE_ROWS - 1, 0, -1):
        if not torch.equal(product(m), reference[:m]):
            return m + 1
    return 1


def by_chunks(product: Callable[[Tensor], Tensor], x: Tensor, least: int) -> Tensor:
    """`product(x)` for x [M, in], with `least` > 0 and M > `PROBE_ROWS` computed by chunks of
    `PROBE_ROWS` rows, the last one taking the rows before it up to `least` (their results dropped):
    every row then comes out of a product of `least` to `PROBE_ROWS` rows, which the probe found
    alike, whatever M is (beyond it a BLAS may split a product otherwise: an Intel Xeon's MKL gave
    rows of 57 and more of SmolLM2's down projection other last bits, two threads)."""
    m = x.shape[0]
    if not least or m <= PROBE_ROWS:
        return product(x)
    parts = []
    for start in range(0, m, PROBE_ROWS):
        end = min(start + PROBE_ROWS, m)
        if end - start >= least:
            parts.append(product(x[start:end]))
        else:
            parts.append(product(x[end - least : end])[least - (end - start) :])
    return torch.cat(parts)


def linear_rows(x: Tensor, weight: Tensor, bias: Tensor | None, least: int) -> Tensor:
    """`F.linear(x, weight, bias)` for x [..., in], by `by_chunks` of its rows."""
    if not least or x.numel() <= PROBE_ROWS * x.shape[-1]:
        return F.linear(x, weight, bias)
    flat = x.reshape(-1, x.shape[-1])
    out = by_chunks(lambda rows: F.linear(rows, weight, bias), flat, least)
    return out.reshape(*x.shape[:-1], out.shape[-1])
