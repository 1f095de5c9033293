"""The trainer's model side: policy, frozen reference, optimizer, and the policy loss on a micro-batch.

A micro-batch is one or more whole groups. Every log-prob, the policy's and the reference's, is of the
distribution the engine samples from: the logits divided by `rollout.temperature` (ops/logprobs.py);
the loss is `trainer.objective`'s (ops/losses.py). With `packing = "shared_prompt"` the groups share
one row, each prompt computed once and every group attending only within itself (ops/packing.py):
one forward of the policy (with gradient; detached, it is also the old policy) and one of the
reference. With
`"prefix_cache"` the prompt runs once into the KV cache and the responses as a batch on top of it
(model/prefix.py); with `"padded"` each sample is its own right-padded row. All give the same log-probs.

Invariant: `train_groups` only adds to the gradients (a summed loss, never a mean); `step` divides
them by the step's normaliser once, clips, steps (at the schedule's rate) and clears them. Between
two steps the weights do not change, so the old-policy log-probs are the detached policy log-probs
(ratio 1).
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor

from cadence.model.checkpoint import save_checkpoint, state_dict_from_bytes, tensors_to_bytes
from cadence.model.config import ModelConfig
from cadence.model.prefix import prefix_logprobs
from cadence.model.tokenizer import TextTokenizer
from cadence.model.transformer import Transformer, hf_state_dict, load_hf_state_dict
from cadence.ops.advantages import group_advantages
from cadence.ops.logprobs import token_logprobs
from cadence.ops.losses import OBJECTIVES, objective_loss_sum
from cadence.ops.packing import PackedBatch, pack_groups, to_padded
from cadence.wire.digest import checksum


@dataclass(frozen=True)
class TrainGroup:
    """One GRPO group as the learner needs it; `old_logprobs` are the sampler's, one list a completion,
    or None to take the detached policy's; `advantages`, one a completion, when these completions are a
    share of a larger group (whose rewards they come from), or None to compute them from `rewards`."""

    prompt: list[int]
    completions: list[list[int]]
    rewards: list[float]
    old_logprobs: list[list[float]] | None = None
    advantages: list[float] | None = None


class Learner(Protocol):
    def train_groups(self, groups: Sequence[TrainGroup]) -> dict[str, float]: ...

    def step(self, normaliser: float, lr: float | None = None) -> dict[str, float]:
        """Divide the summed gradients by `normaliser`, clip, step at `lr` (None: the rate as it is)."""
        ...

    def weights(self, alloc: Callable[[int], bytearray] = bytearray) -> bytes | bytearray:
        """The weights as safetensors bytes, serialised into `alloc(nbytes)` where they are built."""
        ...

    def tensors(self) -> Mapping[str, Tensor]:
        """The weights `weights()` serialises, as HF-named tensors (live: read before the next step)."""
        ...

    def save(self, directory: Path) -> str: ...

    def save_state(self, directory: Path) -> None:
        """Write everything needed to continue training exactly (weights, optimizer, RNG) into `directory`."""
        ...

    def load_state(self, directory: Path) -> None:
        """Restore what `save_state` wrote; the next step equals the one the saver would have taken."""
        ...


def _widen(values: Tensor, width: int) -> Tensor:
    """Right-pad [S, R] with zeros (False) to [S, width]."""
    return torch.nn.functional.pad(values, (0, width - values.shape[1]))


def pad_group(prompt: list[int], completions: list[list[int]], pad_id: int) -> tuple[torch.Tensor, ...]:
    """Inputs, targets and response mask for one group, right-padded: [G, P + R_max - 1]."""
    longest = max(len(c) for c in completions)
    rows = [prompt + c + [pad_id] * (longest - len(c)) for c in completions]
    ids = torch.tensor(rows, dtype=torch.long)
    inputs, targets = ids[:, :-1], ids[:, 1:]
    mask = torch.zeros_like(targets, dtype=torch.bool)
    for i, c in enumerate(completions):
        mask[i, len(prompt) - 1 : len(prompt) - 1 + len(c)] = True
    return inputs, targets, mask


def loss_logprobs(
    model: Transformer, batch: PackedBatch, temperature: float = 1.0, entropy: list[Tensor] | None = None
) -> Tensor:
    """`packed_logprobs` of the model's forward at `temperature`, with the head applied only at the
    loss positions (their entropies appended to `entropy` when given)."""
    args = (batch.input_ids, batch.position_ids, batch.attn_mask)
    logits = model(*args, logits_at=batch.loss_mask)  # [N, V]
    return token_logprobs(logits, batch.targets[batch.loss_mask], temperature, entropy)


def masked_logprobs(
    model: Transformer,
    inputs: Tensor,
    targets: Tensor,
    mask: Tensor,
    temperature: float = 1.0,
    entropy: list[Tensor] | None = None,
) -> Tensor:
    """Log-probs [B, T] of `targets` where `mask`, 0 elsewhere; the head runs only where `mask`."""
    picked = token_logprobs(model(inputs, logits_at=mask), targets[mask], temperature, entropy)
    return torch.zeros(targets.shape, dtype=picked.dtype, device=picked.device).masked_scatter(mask, picked)


class TorchLearner:
    sharded = False  # True: every rank takes part in each forward, backward and state read (sharding.py)

    def __init__(
        self,
        model: Transformer,
        model_cfg: ModelConfig,
        tokenizer: TextTokenizer,
        lr: float,
        weight_decay: float,
        clip_low: float,
        clip_high: float,
        kl_beta: float,
        max_grad_norm: float,
        packing: str = "shared_prompt",
        device: torch.device | str = "cpu",
        objective: str = "dapo",
        temperature: float = 1.0,
    ) -> None:
        packings = ("shared_prompt", "prefix_cache", "padded")
        if packing not in packings:
            raise ValueError(f"trainer.packing must be one of {list(packings)}, got {packing!r}")
        if objective not in OBJECTIVES:
            raise ValueError(f"trainer.objective must be one of {list(OBJECTIVES)}, got {objective!r}")
        self.packing = packing
        self.objective = objective
        self.temperature = temperature
        self.device = torch.device(device)
        self.model = model.to(self.device)
        self.model_cfg = model_cfg
        self.tokenizer = tokenizer
        self.reference = copy.deepcopy(model).requires_grad_(False).eval() if kl_beta > 0 else None
        # the fused kernel: one pass over each parameter, not a chain of whole-model temporaries
        fused = self.device.type in ("cpu", "cuda")
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, fused=fused)
        self.clip_low, self.clip_high = clip_low, clip_high
        self.kl_beta = kl_beta
        self.max_grad_norm = max_grad_norm
        self._sums: dict[str, float] = {}

    def train_group(
        self,
        prompt: list[int],
        completions: list[list[int]],
        rewards: list[float],
        old_logprobs: list[list[float]] | None = None,
    ) -> dict[str, float]:
        """`train_groups` of this one group."""
        return self.train_groups([TrainGroup(prompt, completions, rewards, old_logprobs)])

    def train_groups(self, groups: Sequence[TrainGroup]) -> dict[str, float]:
        """Add the micro-batch's summed loss to the gradients. Old-policy log-probs: the detached
        policy's (ratio exactly 1) unless a group carries the sampler's."""
        if not groups:
            raise ValueError("an empty micro-batch")
        scale = self.objective != "dr_grpo"  # Dr. GRPO: advantages without the std scaling
        advantages = torch.cat(
            [
                torch.tensor(g.advantages, dtype=torch.float32)
                if g.advantages is not None
                else group_advantages(torch.tensor(g.rewards, dtype=torch.float32), scale=scale)
                for g in groups
            ]
        ).to(self.device)
        entropy: list[Tensor] = []
        logp, mask, ref_logp = self._logprobs(groups, entropy)
        old = logp.detach().clone()
        row = 0
        for g in groups:
            for given in g.old_logprobs or []:
                old[row, : len(given)] = torch.tensor(given, dtype=old.dtype, device=old.device)
                row += 1
            row += 0 if g.old_logprobs else len(g.completions)
        loss, stats = objective_loss_sum(
            self.objective, logp, old, advantages, mask, self.clip_low, self.clip_high, ref_logp, self.kl_beta
        )
        loss.backward()
        stats["loss_sum"] = float(loss.detach())
        stats["tokens"] = float(mask.sum())
        stats["entropy_sum"] = float(sum(float(e.sum()) for e in entropy))
        for key, value in stats.items():
            self._sums[key] = self._sums.get(key, 0.0) + value
        return stats

    def _logprobs(
        self, groups: Sequence[TrainGroup], entropy: list[Tensor] | None = None
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """Policy log-probs [S, R_max] over every sample of the micro-batch (groups in order) with
        gradient, their mask, and the reference's (or None); the policy's entropy at every trained
        token is appended to `entropy` when given."""
        t = self.temperature
        if self.packing == "shared_prompt":
            batch = pack_groups([(g.prompt, g.completions) for g in groups], self.tokenizer.pad_id)
            batch = batch.to(self.device)
            logp, mask = to_padded(loss_logprobs(self.model, batch, t, entropy), batch)
            if self.reference is None:
                return logp, mask, None
            with torch.no_grad():
                ref_logp, _ = to_padded(loss_logprobs(self.reference, batch, t), batch)
            return logp, mask, ref_logp
        parts = [self._group_logprobs(g.prompt, g.completions, entropy) for g in groups]
        width = max(p[0].shape[1] for p in parts)
        logp = torch.cat([_widen(p[0], width) for p in parts])
        mask = torch.cat([_widen(p[1], width) for p in parts])
        refs = [_widen(p[2], width) for p in parts if p[2] is not None]
        return logp, mask, torch.cat(refs) if refs else None

    def _group_logprobs(
        self, prompt: list[int], completions: list[list[int]], entropy: list[Tensor] | None
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """One group's policy log-probs [G, R] aligned to the responses, mask, reference (or None)."""
        t, pad = self.temperature, self.tokenizer.pad_id
        if self.packing == "prefix_cache":
            logp, mask = prefix_logprobs(self.model, prompt, completions, pad, t, entropy)
            if self.reference is None:
                return logp, mask, None
            with torch.no_grad():
                ref_logp, _ = prefix_logprobs(self.reference, prompt, completions, pad, t)
            return logp, mask, ref_logp
        inputs, targets, mask = (x.to(self.device) for x in pad_group(prompt, completions, pad))
        start = len(prompt) - 1
        logp = masked_logprobs(self.model, inputs, targets, mask, t, entropy)[:, start:]
        if self.reference is None:
            return logp, mask[:, start:], None
        with torch.no_grad():
            return logp, mask[:, start:], masked_logprobs(self.reference, inputs, targets, mask, t)[:, start:]

    def step(self, normaliser: float, lr: float | None = None) -> dict[str, float]:
        """Divide the gradients by `normaliser`, clip, step (at learning rate `lr` when given: the
        schedule's, ops/schedule.py) and clear them; the step's statistics (`summarise`)."""
        if lr is not None:
            for group in self.optimizer.param_groups:
                group["lr"] = lr
        for p in self.model.parameters():
            if p.grad is not None:
                p.grad.div_(normaliser)
        params = [p for p in self.model.parameters() if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(
            params, self.max_grad_norm if self.max_grad_norm > 0 else float("inf")
        )
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        info = summarise(self._sums, normaliser)
        info["grad_norm"] = round(float(norm), 6)
        info["lr"] = float(self.optimizer.param_groups[0]["lr"])
        self._sums = {}
        return info

    def weights(self, alloc: Callable[[int], bytearray] = bytearray) -> bytes | bytearray:
        return tensors_to_bytes(self.tensors(), alloc)

    def tensors(self) -> dict[str, Tensor]:
        return hf_state_dict(self.model)

    def optimizer_state(self) -> dict[str, Any]:
        """AdamW's `state_dict()`: moments and step counts keyed by parameter index."""
        return self.optimizer.state_dict()

    def load(self, weights: Mapping[str, Tensor] | None, optimizer: dict[str, Any] | None) -> None:
        """Replace the policy's weights (HF-named) and AdamW's state; clear gradients and statistics."""
        if weights is None or optimizer is None:
            raise ValueError("one rank's learner loads the whole state")
        with torch.no_grad():
            load_hf_state_dict(self.model, weights)
        self.optimizer.load_state_dict(optimizer)
        self.optimizer.zero_grad(set_to_none=True)
        self._sums = {}

    def save(self, directory: Path) -> str:
        return write_checkpoint(self.tensors(), self.model_cfg, self.tokenizer, directory)

    def save_state(self, directory: Path) -> None:
        write_state(directory, self.weights(), self.optimizer_state())

    def load_state(self, directory: Path) -> None:
        self.load(*read_state(directory))


def summarise(sums: Mapping[str, float], normaliser: float) -> dict[str, float]:
    """A step's statistics from its micro-batches' sums: the loss and the other sums divided by the
    normaliser (as the gradient was), and means over the trained tokens: `entropy` (of the tempered
    policy), `clip_fraction` (tokens whose clip is active) and, with a reference, `kl` (k3)."""
    per_token = ("tokens", "entropy_sum")
    info = {k: round(v / normaliser, 6) for k, v in sums.items() if k not in per_token}
    tokens = sums.get("tokens", 0.0)
    if tokens > 0 and "clipped_tokens" in sums:
        info["entropy"] = round(sums.get("entropy_sum", 0.0) / tokens, 6)
        info["clip_fraction"] = round(sums["clipped_tokens"] / tokens, 6)
        if "kl_sum" in sums:
            info["kl"] = round(sums["kl_sum"] / tokens, 6)
    return info


def write_checkpoint(
    weights: Mapping[str, Tensor], model_cfg: ModelConfig, tokenizer: TextTokenizer, directory: Path
) -> str:
    """A Hugging Face checkpoint folder of `weights` (HF-named); the checksum of their safetensors bytes."""
    save_checkpoint(weights, model_cfg, directory, tokenizer.files())
    return checksum(tensors_to_bytes(weights))


def write_state(directory: Path, weights: bytes | bytearray, optimizer: dict[str, Any]) -> None:
    """A resumable state: `model.safetensors` (the policy), `optimizer.pt` (AdamW's state_dict: moments
    and step counts by parameter index), `rng.pt` (torch's and Python's generators). The frozen
    reference is rebuilt from the config."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "model.safetensors").write_bytes(weights)
    torch.save(optimizer, directory / "optimizer.pt")
    version, internal, gauss = random.getstate()
    rng = {"torch": torch.get_rng_state(), "python": [version, list(internal), gauss]}
    torch.save(rng, directory / "rng.pt")


def read_state(directory: Path) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """What `write_state` wrote: the weights and the optimizer state; the generators are restored."""
    weights = state_dict_from_bytes((directory / "model.safetensors").read_bytes())
    optimizer = torch.load(directory / "optimizer.pt", weights_only=True)
    rng = torch.load(directory / "rng.pt", weights_only=True)
    torch.set_rng_state(rng["torch"])
    version, internal, gauss = rng["python"]
    random.setstate((version, tuple(internal), gauss))
    return weights, optimizer
