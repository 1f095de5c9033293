"""`trainer.sharding = "fsdp2"`: the policy, its gradients and AdamW's state split over the trainer's ranks.

```
 every rank, each micro-batch (in rank 0's order, parallel.py)
   forward:  per block all-gather its parameters ─► compute ─► free them again
   backward: per block all-gather ─► gradients ─► reduce-scatter (SUM) ─► added to this rank's shard
 every rank, at the step:  / normaliser ─► clip (the norm over all shards) ─► AdamW on its own shard
 weights, checkpoints:     every rank sends its shards ─► the full HF-named tensors on rank 0 (CPU)
 resume:                   rank 0 reads the files ─► every rank takes its shards (broadcast)
```

FSDP2's `fully_shard` wraps every transformer block, then the root (embeddings, final norm, head). Its
gradient reduction is set to a plain sum (divide factor 1), so the sharded gradient is the sum over
ranks of their summed losses' gradients: the one-rank gradient up to summation order, which the
period's normaliser then divides once, as on one rank. The frozen reference stays whole on every rank.

Invariant: every rank runs the same collectives in the same order, so each takes part in every
micro-batch with exactly one forward and one backward (a rank without a completion: a zero loss on a
one-token input), and in every gather and load that rank 0 does (`sharded` tells parallel.py so).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard

from cadence.model.hf_state import EMBED_KEY, TIED_HEAD_KEY
from cadence.training.collectives import Collectives
from cadence.training.learner import TorchLearner, TrainGroup

GATHER = StateDictOptions(full_state_dict=True, cpu_offload=True)  # whole tensors, on rank 0 only
SCATTER = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)


class ShardedLearner(TorchLearner):
    """A `TorchLearner` whose policy is sharded over `comm`'s ranks. Training, `tensors`,
    `optimizer_state` and `load` are collectives: every rank calls them together."""

    sharded = True

    def __init__(self, comm: Collectives, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.packing != "shared_prompt":
            raise ValueError(
                f"trainer.sharding = 'fsdp2' needs trainer.packing = 'shared_prompt', got {self.packing!r}"
            )
        whole = list(self.model.parameters())  # rank 0's start on every rank, before it is split
        if self.reference is not None:
            whole += list(self.reference.parameters())
        comm.broadcast_tensors(whole, "copying rank 0's weights")
        group = dist.group.WORLD
        assert group is not None  # joined by Collectives
        mesh = DeviceMesh.from_group(group, comm.device.type)
        for block in self.model.model.layers:
            fully_shard(block, mesh=mesh)
        fully_shard(self.model, mesh=mesh)
        for module in self.model.modules():
            if isinstance(module, FSDPModule):
                module.set_gradient_divide_factor(1.0)  # a sum, not FSDP's mean over ranks
                module.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
        defaults = self.optimizer.defaults
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=defaults["lr"], weight_decay=defaults["weight_decay"]
        )
        self._names = [name for name, _ in self.model.named_parameters()]  # AdamW's index -> name

    def train_groups(self, groups: Sequence[TrainGroup]) -> dict[str, float]:
        """This rank's share of a micro-batch; an empty share still runs the forward and backward
        (the all-gathers and reduce-scatters of every rank), adding zero to the gradients."""
        if groups:
            return super().train_groups(groups)
        self._train_nothing()
        return {}

    def _train_nothing(self) -> None:
        """A share with nothing to compute (none given, or every sample of advantage 0) still takes part
        in the ranks' collectives: a forward and backward that add zero to the gradients."""
        logits = self.model(torch.zeros(1, 1, dtype=torch.long, device=self.device))
        (logits.sum() * 0.0).backward()

    def _normalise_and_clip(self, normaliser: float) -> Tensor:
        """Divided, then `clip_grad_norm_`, which sums the norm over the ranks' shards."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        for p in params:
            p.grad.div_(normaliser)  # type: ignore[union-attr]
        return torch.nn.utils.clip_grad_norm_(
            params, self.max_grad_norm if self.max_grad_norm > 0 else float("inf")
        )

    def tensors(self) -> dict[str, Tensor]:
        """The full HF-named weights on rank 0 (CPU copies), {} on the others."""
        state = get_model_state_dict(self.model, options=GATHER)
        tied = self.model_cfg.tie_embeddings
        return {k: v for k, v in state.items() if isinstance(v, Tensor) and not (tied and k == TIED_HEAD_KEY)}

    def optimizer_state(self) -> dict[str, Any]:
        """On rank 0 AdamW's whole state in the one-rank layout (by parameter index, so a checkpoint
        resumes with or without sharding); {} on the others."""
        state: dict[str, Any] = dict(get_optimizer_state_dict(self.model, self.optimizer, options=GATHER))
        if not state:
            return {}
        index = {name: i for i, name in enumerate(self._names)}
        return {
            "state": {index[name]: entry for name, entry in state["state"].items()},
            "param_groups": [g | {"params": [index[n] for n in g["params"]]} for g in state["param_groups"]],
        }

    def load(self, weights: Mapping[str, Tensor] | None, optimizer: dict[str, Any] | None) -> None:
        """Rank 0's `weights` and `optimizer` state (one-rank layouts) split onto every rank; the
        others pass None."""
        full: dict[str, Any] = {}
        named: dict[str, Any] = {}
        if weights is not None and optimizer is not None:
            full = dict(weights)
            if self.model_cfg.tie_embeddings:
                full[TIED_HEAD_KEY] = full[EMBED_KEY]
            named = {
                "state": {self._names[i]: dict(entry) for i, entry in optimizer["state"].items()},
                "param_groups": [
                    g | {"params": [self._names[i] for i in g["params"]]} for g in optimizer["param_groups"]
                ],
            }
        set_model_state_dict(self.model, full, options=SCATTER)
        set_optimizer_state_dict(self.model, self.optimizer, named, options=SCATTER)
        self.optimizer.zero_grad(set_to_none=True)
        self._sums = {}
