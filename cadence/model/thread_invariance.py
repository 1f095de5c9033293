"""Whether the built-in engine computes the same bits with two thread counts, measured.

A worker that has its host alone for a while (the trainer waits: in sync mode while the workers
generate, in periodic mode between its micro-batches) may compute with more threads than its even
share, but only if a sample does not depend on the thread count: sync and periodic runs generate
alike, to the bit, only if the threads a worker takes there change no sum. A BLAS may split a product's sums between its threads, and a kernel may
pick another order for another count, so this is measured on this process's libraries, never assumed:

```
alike_at_threads(engine, a, b) ─► the same orientation of a decode step's products and the same
                                  least rows (invariance.least_rows) at both counts?
                               ─► every product shape of the model (invariance.product_shapes),
                                  1 to PROBE_ROWS rows, as the engine computes it (a prefill's x·Wᵀ,
                                  a step's in that orientation, at least those rows): the same bits
                                  with a and b threads?
                               ─► a call of the engine itself (two prompts of other lengths, a few
                                  samples each: prefill, attention, norms, sampler): the same tokens
                                  and log-probs with a and b threads?
```

Invariant: True only when all three agree bit for bit, so a call may also change its count between
two decode steps; on the CPU only (a GPU's kernels are not the threads' business), and only for an
engine whose products are batch-invariant (``invariant``: else a row's bits already depend on what
it is batched with). The engine's prefilled trunk is forgotten
before and after, so nothing computed at a probing thread count is used by the calls that follow.
"""

from __future__ import annotations

import torch

from cadence.model.decode_step import weights_first_here
from cadence.model.engine import SamplingParams, TorchEngine, sample_seed
from cadence.model.invariance import PROBE_ROWS, least_rows, product_shapes, rows_product

PROMPTS = (23, 14)
"""The lengths of the probe's prompts: two of them, so that a prefill attends more than one."""

SAMPLES = 4
"""The probe's samples a prompt (its decode steps compute 2 x SAMPLES rows)."""

NEW_TOKENS = 4
"""Tokens a probe sample decodes."""


def alike_at_threads(engine: TorchEngine, a: int, b: int) -> bool:
    """Whether ``engine`` computes every product and a whole call alike with ``a`` and ``b`` torch
    threads (the calling thread's; its own count is left as it was)."""
    if a == b:
        return True
    if engine.device.type != "cpu" or not engine.invariant:
        return False
    before = torch.get_num_threads()
    try:
        return _products_alike(engine, a, b) and _calls_alike(engine, a, b)
    finally:
        torch.set_num_threads(before)


def _products_alike(engine: TorchEngine, a: int, b: int) -> bool:
    """Each shape's products as the engine computes them, a prefill's as x·Wᵀ and a decode step's in
    the count's orientation, a product of m rows with at least `least_rows` (the first m kept), for
    every m up to PROBE_ROWS (more go by chunks of that many): the same orientation and least rows at
    both counts (so a call may change its count between two steps), and the same bits."""
    shapes = product_shapes(engine.model)
    plans = []
    for threads in (a, b):
        torch.set_num_threads(threads)
        # the step's rule reads the thread count; W·xᵀ in float32 only (decode_step.project)
        first = weights_first_here(engine.device) and engine.dtype == torch.float32
        plans.append((first, least_rows(shapes, engine.dtype, False), least_rows(shapes, engine.dtype, True)))
    if plans[0] != plans[1]:
        return False
    first, across, least_first = plans[0]
    generator = torch.Generator().manual_seed(0)
    for outputs, inputs in shapes:
        w = torch.randn(outputs, inputs, generator=generator).to(engine.dtype)
        x = torch.randn(PROBE_ROWS, inputs, generator=generator).to(engine.dtype)
        for oriented, least in {(False, across), (first, least_first if first else across)}:
            results = []
            for threads in (a, b):
                torch.set_num_threads(threads)
                product = rows_product(w, x, oriented)
                results.append([product(max(m, least))[:m] for m in range(1, PROBE_ROWS + 1)])
            if not all(torch.equal(p, q) for p, q in zip(*results, strict=True)):
                return False
    return True


def _calls_alike(engine: TorchEngine, a: int, b: int) -> bool:
    vocab = engine.model.cfg.vocab_size
    groups = [
        ([(7 * i + 3 * n) % vocab for i in range(n)], [sample_seed(0, 0, g, j) for j in range(SAMPLES)])
        for g, n in enumerate(PROMPTS)
    ]
    params = SamplingParams(max_new_tokens=NEW_TOKENS, temperature=1.0)
    calls = []
    for threads in (a, b):
        torch.set_num_threads(threads)
        engine.weights_changed()  # no trunk computed at another count
        out = engine.generate_many(groups, params)
        calls.append([[(c.tokens, c.logprobs) for c in group] for group in out])
    engine.weights_changed()  # the calls that follow compute their trunk at their own count
    return calls[0] == calls[1]
