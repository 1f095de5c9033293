"""Prefix-cache log-probs: a GRPO group's prompt run once through a KV cache, its responses as a batch.

The prompt P runs once as [1, |P|] into a ``KVCache``; its last position's logits (the only ones the
head computes for P) give every response's first token. The cache is repeated to G rows and the responses' tokens but their last, ``Ri[:-1]``, run as
[G, R_max - 1] right-padded after it, at positions |P|, |P| + 1, ... with the causal mask offset by
the cache length, so a response attends all of P and its own earlier tokens, never another response
and never a pad (pads only follow the real tokens); the head runs only where a response token is read. Nothing is detached: gradients reach the weights
through the response tokens and through the prompt's cached keys and values.

Invariant: ``prefix_logprobs(model, P, R, pad_id)`` is ``(logp, mask)`` [G, R_max] with
``logp[i, j]`` = log p(Ri[j] | P, Ri[:j]) where ``mask[i, j]`` (j < |Ri|), 0 elsewhere; ``logp[mask]``
equals ``token_logprobs(model(inputs), targets)[mask]`` of ``pad_group`` up to float summation
order. A group costs |P| + G (R_max - 1) tokens; attention is dense only over [R_max - 1, |P| + R_max - 1].
"""

from __future__ import annotations

import torch
from torch import Tensor

from cadence.model.transformer import KVCache, Transformer
from cadence.ops.logprobs import logprob_reader, token_logprobs


def prefix_logprobs(
    model: Transformer,
    prompt: list[int],
    completions: list[list[int]],
    pad_id: int,
    temperature: float = 1.0,
    entropy: list[Tensor] | None = None,
) -> tuple[Tensor, Tensor]:
    """Log-probs [G, R_max] of each response's tokens (right-padded with 0) at ``temperature`` and the
    bool mask [G, R_max]; with ``entropy``, the tempered distribution's entropy at every response
    token is appended to it as one [G, R_max] tensor aligned with the log-probs (detached, 0 off the
    mask).

    Differentiable w.r.t. the model's parameters unless called under ``torch.no_grad``.
    """
    if not prompt:
        raise ValueError("prefix_logprobs needs a non-empty prompt: a response's first token is read from it")
    if not completions:
        raise ValueError("prefix_logprobs needs at least one completion")
    device = model.inv_freq.device
    g = len(completions)
    lengths = torch.tensor([len(c) for c in completions], device=device)
    width = int(lengths.max())
    mask = torch.arange(width, device=device).unsqueeze(0) < lengths.unsqueeze(1)  # [G, R_max]
    cache = KVCache()
    prompt_ids = torch.tensor([prompt], dtype=torch.long, device=device)
    last_only = torch.arange(len(prompt), device=device).unsqueeze(0) == len(prompt) - 1  # [1, |P|]
    last = model(prompt_ids, cache=cache, logits_at=last_only)  # [1, V]: no head over the prompt body
    if width == 0:
        if entropy is not None:
            entropy.append(last.new_zeros((g, 0)))
        return last.new_zeros((g, 0)), mask
    firsts = torch.tensor([c[0] if c else pad_id for c in completions], device=device)  # [G]
    spread: list[Tensor] | None = [] if entropy is not None else None
    logp = token_logprobs(last.expand(g, -1), firsts, temperature, spread).unsqueeze(1)  # [G, 1]
    if width > 1:
        cache.repeat_batch(g)  # Tensor.repeat: differentiable, gradients of all rows sum into P's k/v
        inputs = _right_pad([c[:-1] for c in completions], width - 1, pad_id, device)  # [G, R_max - 1]
        targets = _right_pad([c[1:] for c in completions], width - 1, pad_id, device)
        read = mask[:, 1:]  # the head only where a response token is read, never on a pad
        reader = logprob_reader(targets[read], temperature, spread)  # the head a chunk at a time
        picked = model(inputs, cache=cache, logits_at=read, head=reader)  # positions continue from |P|
        rest = logp.new_zeros((g, width - 1)).masked_scatter(read, picked)
        logp = torch.cat([logp, rest], dim=1)
    if entropy is not None and spread is not None:
        aligned = spread[0].unsqueeze(1)  # [G, 1]: every response's first token
        if width > 1:
            aligned = torch.cat(
                [aligned, aligned.new_zeros((g, width - 1)).masked_scatter(read, spread[1])], dim=1
            )
        entropy.append(torch.where(mask, aligned, torch.zeros_like(aligned)))
    return torch.where(mask, logp, torch.zeros_like(logp)), mask


def _right_pad(rows: list[list[int]], width: int, pad_id: int, device: torch.device) -> Tensor:
    return torch.tensor([r + [pad_id] * (width - len(r)) for r in rows], dtype=torch.long, device=device)
