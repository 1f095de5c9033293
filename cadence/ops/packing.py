"""Shared-prompt packing: several GRPO groups in one row, each prompt computed once, and the beginning
the prompts share (a chat template's system prompt, a common instruction) once for them all.

A group (P, [R1 .. RG]) packs as ``[P[:-1] | p R1[:-1] | p R2[:-1] | ... | p RG[:-1]]`` with
``p = P[-1]``: the prompt body once, then one segment per response that starts with its own copy of
the last prompt token. The copy sits at position |P| - 1 and attends P[:-1] and itself, so its hidden
state is the unpacked last prompt token's, and it predicts R_i[0] from its own position; response
tokens continue at positions |P|, |P| + 1, ... as if alone. A segment attends the prompt body of its
group and its own earlier tokens, never another segment or another group.

Several groups whose prompts begin with the same L tokens (L at most the shortest prompt less one:
every group keeps a body's last token) share them: the row starts with that trunk, at positions
0 .. L-1, and each group's body is P[L:-1] from position L on. Every position of the row attends the
trunk before it; the trunk attends only itself. Causal attention makes the trunk's hidden states
those each group would compute alone.

Invariant: every packed position's next-token target lies in its own sequence, so
``token_logprobs(logits, targets)[loss_mask]`` is, in order (groups, then samples, then tokens), the
log-probs that ``pad_group`` selects with its mask, equal to the unpacked computation up to float
summation order. A group alone costs ``packed_length`` = |P| - 1 + sum |Ri| tokens (an empty response
none); groups together cost that sum less L for every group but one.

The row is attended by blocks (ops/block_attention.py, `PackedBatch.segments`): each run of positions
over the keys it sees, never a [T, T] tensor; `attn_mask` builds the same attention as a dense bool
mask, the reference.

A completion's environment tokens (its mask's 0s, ops/sampled.py) are packed, attended and count in
the row as its sampled tokens do; they are only never read: no loss position, no head, no log-prob.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import torch
from torch import Tensor

from cadence.ops.block_attention import SegmentMask, segment_mask
from cadence.ops.logprobs import token_logprobs
from cadence.ops.sampled import Masks, check_masks, sampled_rows

Group = tuple[list[int], list[list[int]]]


@dataclass(frozen=True)
class PackedBatch:
    """One packed row of whole groups; samples are numbered across groups in order."""

    input_ids: Tensor  # [1, T] long
    position_ids: Tensor  # [1, T] long, restarting from 0 at each group's prompt
    segments: SegmentMask  # the runs of positions and the keys each sees: the attention by blocks
    targets: Tensor  # [1, T] long, the next token of a loss position; pad_id elsewhere
    loss_mask: Tensor  # [1, T] bool, True where a sampled response token's log-prob is read
    sample_index: Tensor  # [1, T] long, the sample read at a loss position; -1 elsewhere
    group_index: Tensor  # [1, T] long, the group each position belongs to; -1 on the shared trunk
    read: Tensor  # [S, R_max] bool, True at each sample's sampled tokens (by position in its response)
    lengths: list[int]  # response length of each sample, environment tokens included
    group_sizes: list[int]  # samples in each group

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[1])

    @property
    def attn_mask(self) -> Tensor:
        """[1, 1, T, T] bool, True = may attend: `segments` as a dense mask (the reference path)."""
        return self.segments.dense(self.input_ids.device)

    def to(self, device: torch.device) -> PackedBatch:
        """The same batch with its tensors on `device`."""
        if self.input_ids.device == device:
            return self
        moved = {
            f.name: getattr(self, f.name).to(device)
            for f in fields(self)
            if isinstance(getattr(self, f.name), Tensor)
        }
        return replace(self, **moved)


def packed_length(prompt: Sequence[int], completions: Sequence[Sequence[int]]) -> int:
    """Tokens one group occupies in a packed row: |P| - 1 + sum |Ri|."""
    return len(prompt) - 1 + sum(len(c) for c in completions)


def packed_row_length(groups: Sequence[Group]) -> int:
    """Tokens of `pack_groups`' row: every group's `packed_length`, the shared trunk counted once."""
    trunk = shared_trunk([prompt for prompt, _ in groups])
    return sum(packed_length(p, c) for p, c in groups) - trunk * max(len(groups) - 1, 0)


def shared_trunk(prompts: Sequence[Sequence[int]]) -> int:
    """L: the tokens every prompt begins with, at most the shortest prompt less one; 0 for one prompt."""
    if len(prompts) < 2:
        return 0
    limit = min(len(p) for p in prompts) - 1
    first = prompts[0]
    length = 0
    while length < limit and all(p[length] == first[length] for p in prompts):
        length += 1
    return max(length, 0)


def _checked(groups: Sequence[Group], masks: Sequence[Masks] | None) -> list[Masks]:
    """Each group's masks (None where it has none), once every prompt and mask is found sound."""
    marks: list[Masks] = list(masks) if masks is not None else [None] * len(groups)
    if len(marks) != len(groups):
        raise ValueError(f"{len(marks)} group masks for {len(groups)} groups")
    for g, (prompt, completions) in enumerate(groups):
        if not prompt:
            raise ValueError(f"group {g} has an empty prompt; a response needs a token to be read from")
        check_masks(completions, marks[g])
    return marks


def pack_groups(groups: Sequence[Group], pad_id: int, masks: Sequence[Masks] | None = None) -> PackedBatch:
    """Pack whole groups into one row after the trunk their prompts share; each group attends only
    the trunk and itself. `masks`, one a group (None: sampled whole), mark the tokens read."""
    marks = _checked(groups, masks)
    trunk = shared_trunk([prompt for prompt, _ in groups])
    ids: list[int] = list(groups[0][0][:trunk]) if groups else []
    pos: list[int] = list(range(trunk))
    tgt: list[int] = [pad_id] * trunk
    sample: list[int] = [-1] * trunk
    group: list[int] = [-1] * trunk  # -1 on the trunk, which every group attends
    segment: list[int] = [-1] * trunk  # -1 on the trunk and a prompt body, else the sample of the segment
    lengths: list[int] = []
    reads: list[Sequence[int]] = []  # each sample's mask
    s = 0
    for g, ((prompt, completions), group_masks) in enumerate(zip(groups, marks, strict=True)):
        body = len(prompt) - 1
        ids += prompt[trunk:-1]
        pos += range(trunk, body)
        tgt += [pad_id] * (body - trunk)
        sample += [-1] * (body - trunk)
        group += [g] * (body - trunk)
        segment += [-1] * (body - trunk)
        for i, completion in enumerate(completions):
            n = len(completion)
            read = group_masks[i] if group_masks is not None else [1] * n
            ids += [prompt[-1], *completion[:-1]][:n]
            pos += range(body, body + n)
            tgt += [t if r else pad_id for t, r in zip(completion, read, strict=True)]
            sample += [s if r else -1 for r in read]
            reads.append(read)
            group += [g] * n
            segment += [s] * n
            lengths.append(n)
            s += 1
    if not ids:
        raise ValueError("nothing to pack: every group has a one-token prompt and empty responses")
    sample_index = torch.tensor(sample).unsqueeze(0)
    return PackedBatch(
        input_ids=torch.tensor(ids).unsqueeze(0),
        position_ids=torch.tensor(pos).unsqueeze(0),
        segments=segment_mask(group, segment),
        targets=torch.tensor(tgt).unsqueeze(0),
        loss_mask=sample_index >= 0,
        sample_index=sample_index,
        group_index=torch.tensor(group).unsqueeze(0),
        read=sampled_rows([c for _, cs in groups for c in cs], reads),
        lengths=lengths,
        group_sizes=[len(c) for _, c in groups],
    )


def packed_logprobs(logits: Tensor, batch: PackedBatch) -> Tensor:
    """Flat [N] log-probs of every sampled response token: groups, samples, tokens in order
    (differentiable)."""
    return token_logprobs(logits, batch.targets)[batch.loss_mask]


def per_sample(values: Tensor, batch: PackedBatch) -> list[Tensor]:
    """Split flat [N] per-token values into one tensor per sample, of its sampled tokens."""
    return list(torch.split(values, batch.read.sum(dim=1).tolist()))


def to_padded(values: Tensor, batch: PackedBatch, fill: float = 0.0) -> tuple[Tensor, Tensor]:
    """Flat [N] values as [S, R_max] (column j: response token j) filled with ``fill`` at environment
    tokens and past each response, and the bool mask of the sampled tokens (``batch.read``).

    The pair feeds ``grpo_loss_sum(logp, old_logp, advantages [S], mask)`` as ``pad_group``'s does.
    """
    mask = batch.read.to(values.device)
    padded = values.new_full(mask.shape, fill)
    return padded.masked_scatter(mask, values), mask


def micro_batches(groups: Sequence[Group], token_budget: int) -> list[list[int]]:
    """Indices of whole groups, in order, filled into micro-batches of at most ``token_budget`` packed
    tokens (environment tokens count: the forward takes them); a group larger than the budget goes
    alone."""
    if token_budget <= 0:
        raise ValueError(f"token_budget must be positive, got {token_budget}")
    return fill_in_order([packed_length(prompt, completions) for prompt, completions in groups], token_budget)


def fill_in_order(sizes: Sequence[int], budget: int) -> list[list[int]]:
    """Indices of ``sizes``, in order, filled into runs of at most ``budget`` in total; one larger
    than the budget goes alone."""
    runs: list[list[int]] = []
    used = 0
    for i, size in enumerate(sizes):
        if runs and used + size <= budget:
            runs[-1].append(i)
            used += size
        else:
            runs.append([i])
            used = size
    return runs
