"""The trainer's model side: policy, frozen reference, optimizer, and the policy loss on a micro-batch.

A micro-batch is one or more whole groups. Every log-prob, the policy's and the reference's, is of the
distribution the engine samples from: the logits divided by `rollout.temperature` (ops/logprobs.py);
the loss is `trainer.objective`'s (ops/losses.py). The forwards are the policy pass's
(training/policy_pass.py): with `packing = "shared_prompt"` the groups share one row, each prompt
computed once and every group attending only within itself (ops/packing.py): one forward of the policy
(with gradient; detached, it is also the old policy) and one of the reference. With `"prefix_cache"`
the prompt runs once into the KV cache and the responses as a batch on top of it (model/prefix.py);
with `"padded"` each sample is its own right-padded row. All give the same log-probs.

Only the distinct samples that carry gradient are computed (ops/distinct.py), and with
`"shared_prompt"` the beginning the prompts of a micro-batch share is computed once in its row.

The same forward measures the gap between the engine's log-probs (a group's `engine_logprobs`, or its
old ones) and the learner's on the sampled tokens (ops/mismatch.py) and, with
`[trainer.rollout_correction]`, weighs each token's surrogate by the correction (ops/correction.py).

A completion's environment tokens (a group's `masks`, ops/sampled.py) are in every forward, as
context; every packing reads log-probs, entropies and the loss at its sampled tokens only, and
`tokens` (the statistics' count) counts those.

Invariant: `train_groups` only adds to the gradients (a summed loss, never a mean); `step` divides
them by the step's normaliser once, clips, steps (at the schedule's rate) and clears them. Between
two steps the weights do not change, so the old-policy log-probs are the detached policy log-probs
(ratio 1).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor

from cadence.model.checkpoint import tensors_to_bytes
from cadence.model.config import ModelConfig
from cadence.model.hf_state import hf_state_dict, load_hf_state_dict
from cadence.model.tokenizer import TextTokenizer
from cadence.model.transformer import Transformer
from cadence.ops.clipping import normalise_and_clip
from cadence.ops.correction import CorrectionRule, correction_sums
from cadence.ops.distinct import distinct_samples
from cadence.ops.losses import OBJECTIVES, objective_loss_sum
from cadence.ops.mismatch import add_sums, mismatch_sums
from cadence.training.policy_pass import PolicyPass, policy_pass
from cadence.training.staging import VersionStage, stage_problem
from cadence.training.state import read_state, write_checkpoint, write_state
from cadence.training.step_figures import summarise
from cadence.training.train_group import TrainGroup, logprob_rows, sampled_tokens
from cadence.wire.buffer import Buffer


class Learner(Protocol):
    def train_groups(self, groups: Sequence[TrainGroup]) -> dict[str, float]: ...

    def step(self, normaliser: float, lr: float | None = None) -> dict[str, float]:
        """Divide the summed gradients by `normaliser`, clip, step at `lr` (None: the rate as it is)."""
        ...

    def weights(self, alloc: Callable[[int], Buffer] = bytearray, dtype: str | None = None) -> bytes | Buffer:
        """The weights as safetensors bytes, serialised into `alloc(nbytes)` where they are built;
        with `dtype` (a torch dtype's name: the workers' precision), the floating-point ones in it."""
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


def _sample_tokens(groups: Sequence[TrainGroup], device: torch.device) -> Tensor | None:
    """[S]: each completion's sample's sampled tokens (its own where it is a sample), or None when no
    group has a sample of several completions."""
    given = [g.sample_token_list() for g in groups]
    if all(tokens is None for tokens in given):
        return None
    rows = [n for g, tokens in zip(groups, given, strict=True) for n in tokens or g.sampled_lengths()]
    return torch.tensor(rows, dtype=torch.float32, device=device)


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
        precision: str = "fp32",
        correction: CorrectionRule | None = None,
        mismatch_bound: float | None = 2.0,
        recompute: bool = False,
    ) -> None:
        packings = ("shared_prompt", "prefix_cache", "padded")
        if precision not in ("fp32", "bf16"):
            raise ValueError(f"trainer.precision must be one of ['fp32', 'bf16'], got {precision!r}")
        self.precision = precision
        if packing not in packings:
            raise ValueError(f"trainer.packing must be one of {list(packings)}, got {packing!r}")
        if objective not in OBJECTIVES:
            raise ValueError(f"trainer.objective must be one of {list(OBJECTIVES)}, got {objective!r}")
        if recompute and packing == "prefix_cache":
            raise ValueError(
                "trainer.activation_checkpointing needs trainer.packing = 'shared_prompt' or 'padded', got"
                " 'prefix_cache' (its blocks write a KV cache, which a block computed again would write twice)"
            )
        self.packing = packing
        self.objective = objective
        self.temperature = temperature
        self.device = torch.device(device)
        self.model = model.to(self.device)
        self.model.lookup_into_grad = not self.sharded  # FSDP2 takes a split weight's gradient itself
        self.model.recompute_blocks(recompute)
        self.model_cfg = model_cfg
        self.tokenizer = tokenizer
        self.reference = copy.deepcopy(model).requires_grad_(False).eval() if kl_beta > 0 else None
        # the fused kernel: one pass over each parameter, not a chain of whole-model temporaries
        fused = self.device.type in ("cpu", "cuda")
        self.optimizer = torch.optim.AdamW(self.trainable(), lr=lr, weight_decay=weight_decay, fused=fused)
        self.clip_low, self.clip_high = clip_low, clip_high
        self.kl_beta = kl_beta
        self.max_grad_norm = max_grad_norm
        self.correction = correction or CorrectionRule()
        # a token ratio beyond [1/bound, bound] counts (ops/mismatch.py); None: the gap is not measured
        self.mismatch_bound = mismatch_bound
        self._sums: dict[str, float] = {}
        self.versions = VersionStage()  # the next version's buffer, the parameters in it (staging.py)

    def trainable(self) -> list[torch.nn.Parameter]:
        """The parameters the optimizer moves (all of them, or only adapters: lora_learner.py)."""
        return [p for p in self.model.parameters() if p.requires_grad]

    def train_group(
        self,
        prompt: list[int],
        completions: list[list[int]],
        rewards: list[float],
        old_logprobs: list[list[float]] | None = None,
        masks: list[list[int]] | None = None,
    ) -> dict[str, float]:
        """`train_groups` of this one group."""
        return self.train_groups([TrainGroup(prompt, completions, rewards, old_logprobs, None, masks)])

    def train_groups(self, groups: Sequence[TrainGroup]) -> dict[str, float]:
        """Add the micro-batch's summed loss to the gradients. Old-policy log-probs: the detached
        policy's (ratio exactly 1) unless a group carries the sampler's. Only the distinct samples that
        carry gradient are computed, each weighted by its count (ops/distinct.py): a micro-batch of
        groups whose rewards are all equal computes nothing."""
        if not groups:
            raise ValueError("an empty micro-batch")
        kept, weights = self._distinct(groups)
        stats: dict[str, float] = {"loss_sum": 0.0, "clipped_tokens": 0.0, "entropy_sum": 0.0}
        stats |= {"entropy_tokens": 0.0, "computed_tokens": 0.0}
        if kept:
            stats |= self._train(kept, torch.tensor(weights, dtype=torch.float32, device=self.device))
        else:
            self._train_nothing()
        stats["tokens"] = float(sum(sampled_tokens(groups)))
        add_sums(self._sums, stats)
        return stats

    def _distinct(self, groups: Sequence[TrainGroup]) -> tuple[list[TrainGroup], list[int]]:
        """The groups reduced to their distinct samples that carry gradient (advantages made explicit),
        groups left with none dropped; the count of each kept sample, in order."""
        scale = self.objective != "dr_grpo"  # Dr. GRPO: advantages without the std scaling
        kept: list[TrainGroup] = []
        weights: list[int] = []
        for g in groups:
            advantages = g.advantage_list(scale)
            drop_zero = self.reference is None
            engine = g.engine_logprobs if self.correction.on else None  # the loss reads them
            tokens = g.sample_token_list()
            picks = distinct_samples(
                g.completions, advantages, g.old_logprobs, drop_zero, g.masks, engine, tokens
            )
            if picks:
                kept.append(g.pick([i for i, _ in picks], advantages))
                weights += [count for _, count in picks]
        return kept, weights

    def _train(self, groups: Sequence[TrainGroup], weights: Tensor) -> dict[str, float]:
        """Forward and backward of `groups` (advantages given), each sample's term times its weight."""
        advantages = torch.tensor(
            [a for g in groups for a in g.advantages or ()], dtype=torch.float32, device=self.device
        )
        logp, mask, ref_logp, entropy, computed = self._logprobs(groups)
        old, carried = logprob_rows(groups, logp, lambda g: g.old_logprobs)
        engine, measured = logprob_rows(groups, logp, TrainGroup.engine_list)
        measured = mask & measured
        correction = self.correction.weights(logp, engine, measured, carried) if self.correction.on else None
        sample_tokens = _sample_tokens(groups, self.device)
        loss, stats = objective_loss_sum(
            self.objective,
            logp,
            old,
            advantages,
            mask,
            self.clip_low,
            self.clip_high,
            ref_logp,
            self.kl_beta,
            weights,
            correction,
            sample_tokens,
        )
        loss.backward()
        if self.mismatch_bound is not None:
            stats |= mismatch_sums(logp, engine, measured, weights, self.mismatch_bound)
        if correction is not None:
            stats |= correction_sums(correction, mask, weights)
        counted = mask * weights.unsqueeze(1)
        stats["loss_sum"] = float(loss.detach())
        stats["entropy_sum"] = float((entropy * counted).sum())
        stats["entropy_tokens"] = float(counted.sum())
        stats["computed_tokens"] = float(computed)
        return stats

    def _train_nothing(self) -> None:
        """A micro-batch with nothing to compute: no forward, but every gradient exists (zero where
        none was yet), so that the step is the one a computed zero gradient gives (AdamW's moments
        and weight decay still move the weights); a step without any micro-batch still leaves every
        weight alone. A sharded learner overrides this: every rank takes part in each forward."""
        for p in self.trainable():
            if p.grad is None:
                p.grad = torch.zeros_like(p)

    def _forward_precision(self) -> contextlib.AbstractContextManager[object]:
        """Where the forwards run: bf16 autocast (the parameters stay float32, so do their gradients
        and the optimizer's state), or as they are."""
        if self.precision == "bf16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _logprobs(self, groups: Sequence[TrainGroup]) -> PolicyPass:
        """The policy's pass over the micro-batch's samples (groups in order), at `trainer.precision`;
        the log-probs come out float32 whatever the forward's precision."""
        with self._forward_precision():
            return policy_pass(
                self.model,
                self.reference,
                groups,
                self.packing,
                self.temperature,
                self.tokenizer.pad_id,
                self.device,
            )

    def step(self, normaliser: float, lr: float | None = None) -> dict[str, float]:
        """Divide the gradients by `normaliser`, clip, step (at learning rate `lr` when given: the
        schedule's, ops/schedule.py) and clear them; the step's statistics (`summarise`)."""
        if lr is not None:
            for group in self.optimizer.param_groups:
                group["lr"] = lr
        norm = self._normalise_and_clip(normaliser)
        self.versions.make_own(self.model)  # never written where the workers read a version
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        info = summarise(self._sums, normaliser)
        info["grad_norm"] = round(float(norm), 6)
        info["lr"] = float(self.optimizer.param_groups[0]["lr"])
        self._sums = {}
        return info

    def _normalise_and_clip(self, normaliser: float) -> Tensor:
        """Divide the gradients by `normaliser` and clip their norm to `max_grad_norm`, in one
        multiply of each (ops/clipping.py); the norm of the divided gradients, before clipping."""
        grads = [p.grad for p in self.trainable() if p.grad is not None]
        return normalise_and_clip(grads, normaliser, self.max_grad_norm)

    def weights(self, alloc: Callable[[int], Buffer] = bytearray, dtype: str | None = None) -> bytes | Buffer:
        """The version's bytes: the staged buffer the parameters live in (`stage`; nothing copied),
        else serialised into `alloc`'s."""
        staged = self.versions.take(dtype)
        return staged if staged is not None else tensors_to_bytes(self.tensors(), alloc, dtype)

    def stage(self, alloc: Callable[[int], Buffer], dtype: str | None = None) -> str | None:
        """Move the parameters into `alloc`'s buffer laid out as the next version in `dtype`, so that
        `weights(dtype)` after the step hands it out with no copy (training/staging.py); why it cannot
        (None: staged)."""
        problem = (
            "the weights are sharded over the ranks" if self.sharded else stage_problem(self.model, dtype)
        )
        if problem is None:
            self.versions.stage(self.model, alloc, dtype)
        return problem

    def tensors(self) -> dict[str, Tensor]:
        return hf_state_dict(self.model)

    def optimizer_state(self) -> dict[str, Any]:
        """AdamW's `state_dict()`: moments and step counts keyed by parameter index."""
        return self.optimizer.state_dict()

    def load(self, weights: Mapping[str, Tensor] | None, optimizer: dict[str, Any] | None) -> None:
        """Replace the policy's weights (HF-named) and AdamW's state; clear gradients and statistics."""
        if weights is None or optimizer is None:
            raise ValueError("one rank's learner loads the whole state")
        self.versions.forget(self.model)  # the parameters out of any buffer handed out, first
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
