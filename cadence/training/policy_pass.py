"""The policy's pass over a micro-batch: the log-probs of its sampled tokens, in each packing.

```
 groups ─► "shared_prompt": one packed row, each prompt once (ops/packing.py) ─► one forward
        ─► "prefix_cache":  a group's prompt once into the KV cache, its responses on top (model/prefix.py)
        ─► "padded":        a sample a right-padded row (`pad_group`)
        ─► PolicyPass: log-probs [S, R_max] at the sampled tokens, their mask, the reference's, entropies
```

Every log-prob is of the distribution the engine samples from: the logits divided by the sampling
temperature (ops/logprobs.py); the head runs only where a log-prob is read, a chunk of tokens at a
time, so the logits [tokens, vocabulary] never exist whole (`head_logprobs`).

Invariant: the packings give the same log-probs, mask and entropies (up to float summation order),
in the order of the groups, then their samples, then their tokens; an environment's token is in the
forward, as context, never in the mask.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from cadence.model.prefix import prefix_logprobs
from cadence.model.transformer import Transformer
from cadence.ops.logprobs import logprob_reader
from cadence.ops.packing import PackedBatch, pack_groups, to_padded
from cadence.ops.sampled import Masks, sampled_rows
from cadence.training.train_group import TrainGroup


class PolicyPass(NamedTuple):
    """The policy's forward over a micro-batch's samples: log-probs [S, R_max] with gradient, the
    bool mask of their sampled tokens (the loss's; neither padding nor an environment's token), the
    reference's log-probs (or None), the policy's entropy [S, R_max] at every trained token (detached,
    0 off the mask), and the token positions the forward took (`computed`, environment tokens too)."""

    logp: Tensor
    mask: Tensor
    ref_logp: Tensor | None
    entropy: Tensor
    computed: int


def _widen(values: Tensor, width: int) -> Tensor:
    """Right-pad [S, R] with zeros (False) to [S, width]."""
    return torch.nn.functional.pad(values, (0, width - values.shape[1]))


def pad_group(
    prompt: list[int], completions: list[list[int]], pad_id: int, masks: Masks = None
) -> tuple[torch.Tensor, ...]:
    """Inputs, targets and response mask for one group, right-padded: [G, P + R_max - 1]; the mask
    is set at the sampled tokens (`masks`' 1s, every response token without), never at an
    environment's."""
    longest = max(len(c) for c in completions)
    rows = [prompt + c + [pad_id] * (longest - len(c)) for c in completions]
    ids = torch.tensor(rows, dtype=torch.long)
    inputs, targets = ids[:, :-1], ids[:, 1:]
    mask = torch.zeros_like(targets, dtype=torch.bool)
    mask[:, len(prompt) - 1 : len(prompt) - 1 + longest] = sampled_rows(completions, masks, longest)
    return inputs, targets, mask


def loss_logprobs(
    model: Transformer, batch: PackedBatch, temperature: float = 1.0, entropy: list[Tensor] | None = None
) -> Tensor:
    """`packed_logprobs` of the model's forward at `temperature`, with the head applied only at the
    loss positions, a chunk at a time (their entropies appended to `entropy` when given)."""
    read = logprob_reader(batch.targets[batch.loss_mask], temperature, entropy)
    return model(batch.input_ids, batch.position_ids, batch.segments, logits_at=batch.loss_mask, head=read)


def masked_logprobs(
    model: Transformer,
    inputs: Tensor,
    targets: Tensor,
    mask: Tensor,
    temperature: float = 1.0,
    entropy: list[Tensor] | None = None,
) -> Tensor:
    """Log-probs [B, T] of `targets` where `mask`, 0 elsewhere; the head runs only where `mask`."""
    picked = model(inputs, logits_at=mask, head=logprob_reader(targets[mask], temperature, entropy))
    return torch.zeros(targets.shape, dtype=picked.dtype, device=picked.device).masked_scatter(mask, picked)


def policy_pass(
    model: Transformer,
    reference: Transformer | None,
    groups: Sequence[TrainGroup],
    packing: str,
    temperature: float,
    pad: int,
    device: torch.device,
) -> PolicyPass:
    """The pass of `model` (and of `reference`, without gradient, when given) over `groups`' samples,
    in order, packed as `packing` says, at `temperature`."""
    t = temperature
    if packing == "shared_prompt":
        batch = pack_groups([(g.prompt, g.completions) for g in groups], pad, [g.masks for g in groups])
        batch = batch.to(device)
        entropy: list[Tensor] = []
        logp, mask = to_padded(loss_logprobs(model, batch, t, entropy), batch)
        spread, _ = to_padded(entropy[0], batch)
        if reference is None:
            return PolicyPass(logp, mask, None, spread, batch.num_tokens)
        with torch.no_grad():
            ref_logp, _ = to_padded(loss_logprobs(reference, batch, t), batch)
        return PolicyPass(logp, mask, ref_logp, spread, batch.num_tokens)
    parts = [
        _group_pass(model, reference, g.prompt, g.completions, g.masks, packing, t, pad, device)
        for g in groups
    ]
    width = max(p.logp.shape[1] for p in parts)
    logp = torch.cat([_widen(p.logp, width) for p in parts])
    mask = torch.cat([_widen(p.mask, width) for p in parts])
    spread = torch.cat([_widen(p.entropy, width) for p in parts])
    refs = [_widen(p.ref_logp, width) for p in parts if p.ref_logp is not None]
    computed = sum(p.computed for p in parts)
    return PolicyPass(logp, mask, torch.cat(refs) if refs else None, spread, computed)


def _group_pass(
    model: Transformer,
    reference: Transformer | None,
    prompt: list[int],
    completions: list[list[int]],
    masks: Masks,
    packing: str,
    t: float,
    pad: int,
    device: torch.device,
) -> PolicyPass:
    """One group's pass, [G, R] aligned to the responses, read at their sampled tokens."""
    entropy: list[Tensor] = []
    ref_logp: Tensor | None = None
    if packing == "prefix_cache":
        logp, mask = prefix_logprobs(model, prompt, completions, pad, t, entropy)
        if reference is not None:
            with torch.no_grad():
                ref_logp, _ = prefix_logprobs(reference, prompt, completions, pad, t)
        computed = len(prompt) + len(completions) * max(logp.shape[1] - 1, 0)  # P, then [G, R - 1]
        read = sampled_rows(completions, masks, logp.shape[1]).to(mask.device)  # within `mask`
        spread = torch.where(read, entropy[0], torch.zeros_like(entropy[0]))
        return PolicyPass(torch.where(read, logp, torch.zeros_like(logp)), read, ref_logp, spread, computed)
    inputs, targets, mask = (x.to(device) for x in pad_group(prompt, completions, pad, masks))
    start = len(prompt) - 1
    logp = masked_logprobs(model, inputs, targets, mask, t, entropy)[:, start:]
    spread = torch.zeros(mask.shape, device=logp.device).masked_scatter(mask, entropy[0])[:, start:]
    if reference is not None:
        with torch.no_grad():
            ref_logp = masked_logprobs(reference, inputs, targets, mask, t)[:, start:]
    return PolicyPass(logp, mask[:, start:], ref_logp, spread, inputs.numel())
