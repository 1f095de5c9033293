"""The prompt beginning that a step's micro-batches share, computed once a step.

A run's prompts often begin alike: the chat template's system prompt, a task's instruction. Within
one micro-batch the packed row computes that beginning once (ops/packing.py). Across the
micro-batches of one optimizer step the weights do not change, so its keys and values are the same
for every one of them: `StepTrunk` computes them once with their graph, gives each micro-batch leaf
copies to attend (`cache`), lets the micro-batches' backwards sum their gradients into those leaves,
and at the step sends the sum back through the one forward that made them (`backward`).

The frozen reference gets a trunk of the same tokens (without a graph), so that the policy's and the
reference's log-probs come from the same computation: at the start, when the policy is the reference,
their KL and its gradient are exactly 0, not a float-rounding residue that AdamW would magnify into a
step of up to half the learning rate.

Invariant: after `backward` the parameters' gradients are those of computing the trunk inside every
micro-batch (the chain rule, summed), up to float summation order; a step that never calls `cache`
gets nothing from the trunk but its forward's cost.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from cadence.model.transformer import KVCache, Transformer


class StepTrunk:
    """The keys and values of `tokens` (positions 0 .. len - 1) under the step's weights."""

    def __init__(self, tokens: Sequence[int], keys: list[Tensor], values: list[Tensor]) -> None:
        self.tokens = list(tokens)
        self._made = [*keys, *values]  # with their graph to the parameters (a frozen model's: none)
        self._leaves = [t.detach().requires_grad_(t.requires_grad) for t in self._made]

    @classmethod
    def compute(cls, model: Transformer, tokens: Sequence[int]) -> StepTrunk:
        """One forward of `tokens` that keeps every layer's keys and values (no head); under
        `torch.no_grad` (a frozen reference) the same keys and values without a graph."""
        device = model.inv_freq.device
        ids = torch.tensor([list(tokens)], dtype=torch.long, device=device)
        cache = KVCache()
        model(ids, cache=cache, logits_at=torch.zeros_like(ids, dtype=torch.bool))
        keys, values = cache.layers()
        return cls(tokens, keys, values)

    def shared(self, prompts: Sequence[Sequence[int]]) -> int:
        """How many of the trunk's tokens every prompt begins with, leaving each prompt its last token."""
        length = min([len(self.tokens), *(len(p) - 1 for p in prompts)])
        for prompt in prompts:
            same = 0
            while same < length and prompt[same] == self.tokens[same]:
                same += 1
            length = same
        return max(length, 0)

    def cache(self, length: int) -> KVCache:
        """A cache of the trunk's first `length` tokens for one micro-batch's forward on top of it."""
        half = len(self._leaves) // 2
        keys = [k[:, :, :length] for k in self._leaves[:half]]
        values = [v[:, :, :length] for v in self._leaves[half:]]
        return KVCache.of(keys, values)

    def backward(self) -> None:
        """Send the gradients the micro-batches left in the leaves through the trunk's forward."""
        pairs = [
            (made, leaf.grad)
            for made, leaf in zip(self._made, self._leaves, strict=True)
            if leaf.grad is not None
        ]
        if pairs:
            torch.autograd.backward([made for made, _ in pairs], [grad for _, grad in pairs])
        self._made, self._leaves = [], []
