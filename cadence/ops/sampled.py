"""Which tokens of a completion the model sampled, and which an environment wrote.

A multi-turn completion is one token sequence after the prompt: the model's turns and, between them,
what an environment wrote (a tool's answer, game feedback, the chat template's turn boundary). Its mask
has one entry a token: 1 where the policy sampled the token, 0 where it did not. A completion without a
mask (None) was sampled whole.

Invariant: an environment token is context only. It is in the forward (every later token attends it),
but it has no log-prob term, no loss, no entropy, no clip and no KL, and it is not counted by a step's
normaliser: `sampled_rows` is the loss mask every packing reads, and `sampled_lengths` the lengths the
normaliser counts. Without masks both are those of the completions as they are.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

Masks = Sequence[Sequence[int]] | None


def check_masks(completions: Sequence[Sequence[int]], masks: Masks) -> None:
    """Refuse masks that do not line up with `completions` (one a completion, one entry a token, each
    0 or 1)."""
    if masks is None:
        return
    if len(masks) != len(completions):
        raise ValueError(f"{len(masks)} masks for {len(completions)} completions")
    for i, (tokens, mask) in enumerate(zip(completions, masks, strict=True)):
        if len(mask) != len(tokens):
            raise ValueError(f"mask {i} has {len(mask)} entries for a completion of {len(tokens)} tokens")
        if not set(mask) <= {0, 1}:
            raise ValueError(f"mask {i} holds a value other than 0 (environment) or 1 (sampled)")


def sampled_lengths(completions: Sequence[Sequence[int]], masks: Masks) -> list[int]:
    """The sampled tokens of each completion: its length without a mask, the 1s of its mask with one."""
    if masks is None:
        return [len(c) for c in completions]
    return [sum(mask) for mask in masks]


def sampled_rows(completions: Sequence[Sequence[int]], masks: Masks, width: int | None = None) -> Tensor:
    """[G, width] bool (width: the longest completion by default): True at each completion's sampled
    tokens, False at its environment tokens and past its end."""
    width = max((len(c) for c in completions), default=0) if width is None else width
    rows = torch.zeros((len(completions), width), dtype=torch.bool)
    for i, tokens in enumerate(completions):
        if masks is None:
            rows[i, : len(tokens)] = True
        elif tokens:
            rows[i, : len(tokens)] = torch.tensor(masks[i], dtype=torch.bool)
    return rows
