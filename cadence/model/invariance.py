"""How many rows a matrix product needs before each row comes out alike whatever the others are.

A BLAS picks its kernel by the product's shape: on the CPU, MKL computes a row of a float32 product
of 1, 2-3 or 4-11 rows in another order than the same row among 12 or more (AMD EPYC, AVX2, two
threads; x·Wᵀ and W·xᵀ alike, 4 with one thread for x·Wᵀ), so a sample decoded beside 3 others and
the same sample beside 31 differ in the last bits of their logits, and a sampled token can flip
(SmolLM2, 32 rows x 48 tokens: 4 rows of 32 apart). From `least_rows` rows on, every row of every
product is bit for bit what it is in a batch of `PROBE_ROWS`: the engine computes at least that
many (padding rows that write nowhere), so a sample depends only on its prompt, its seed and the
weights, never on what it was batched with.

```
least_rows(width, height, dtype, weights_first) ─► random W [height, width], x [PROBE_ROWS, width]
   ─► the fewest m from which every product of m rows equals the first m rows of PROBE_ROWS's
      (both of the model's shapes; once a process, its thread count and layout)
```

Invariant: measured on this process's BLAS with its thread count, never assumed; a machine where no
count up to `MAX_LEAST` does it gets 1 and one log line (`batch_variant_products`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import structlog
import torch
from torch import Tensor

log = structlog.get_logger()

PROBE_ROWS = 48
"""The batch every smaller one is compared with."""

MAX_LEAST = 32
"""Past this many rows padding would cost more than it is worth: the products are left batch-variant."""


def least_rows(width: int, height: int, dtype: torch.dtype, weights_first: bool) -> int:
    """The fewest rows from which products of `width` inputs (to `width` and to `height` outputs) give
    each row exactly as among `PROBE_ROWS` rows, on the CPU with this thread's thread count (1: any)."""
    return _probe(width, height, dtype, weights_first, torch.get_num_threads())


@functools.cache
def _probe(width: int, height: int, dtype: torch.dtype, weights_first: bool, threads: int) -> int:
    generator = torch.Generator().manual_seed(0)
    least = 1
    for outputs in (width, height):
        w = torch.randn(outputs, width, generator=generator).to(dtype)
        x = torch.randn(PROBE_ROWS, width, generator=generator).to(dtype)
        least = max(least, _least(_product(w, x, weights_first)))
    if least > MAX_LEAST:
        log.warning("batch_variant_products", least=least, threads=threads, dtype=str(dtype))
        return 1
    return least


def _product(w: Tensor, x: Tensor, weights_first: bool) -> Callable[[int], Tensor]:
    if weights_first:
        return lambda m: torch.mm(w, x[:m].t()).t()
    return lambda m: torch.mm(x[:m], w.t())


def _least(product: Callable[[int], Tensor]) -> int:
    reference = product(PROBE_ROWS)
    for m in range(PROBE_ROWS - 1, 0, -1):
        if not torch.equal(product(m), reference[:m]):
            return m + 1
    return 1
