"""Data-parallel training: one trainer actor on rank 0, its micro-batches trained by every rank.

```
 rank 0 (the trainer actor)                        ranks 1..N-1 (followers, `follow`)
 DistributedLearner.train_groups(groups) ─ "train" ─► share of every group ─► forward/backward
   own share ─► forward/backward                        │  (summed loss into local gradients)
   ◄──────────── statistics of every rank (all-gather) ─┘
 DistributedLearner.step(normaliser) ──── "step" ───► gradients summed over ranks (all-reduce) ─►
   the same on rank 0                                    / normaliser ─► clip ─► AdamW step
 load_state(dir) ─ "sync" ─► rank 0's weights and optimizer state on every rank (broadcast)
 idle longer than a quarter of the timeout ─ "ping"      close() ─ "stop" ─► followers return
 sharded (sharding.py): weights() ─ "gather" ─► every rank's shards to rank 0 (once a version);
   save_state ─ "gather_optimizer" ─► AdamW's shards too; load_state ─ "load" ─► rank 0's files split
```

A group's completions are dealt round-robin: completion i goes to rank i mod N with the whole group's
advantage (and its own old log-probs and mask, train_group.py), so one group alone still keeps every rank busy; a rank with no completion this micro-batch
adds nothing (zero gradient). Losses are sums, so the summed gradient is the one-rank gradient up to
floating-point summation order. Sharded, every backward already sums the gradients (reduce-scatter),
and a rank with no completion still runs its forward and backward.

Invariant: every rank runs the same sequence of collectives, in rank 0's order (one lock orders rank
0's commands), and after every step the weights and optimizer state are the same on every rank: each
divides, clips and steps the same summed gradient (sharded: each its own shard of it). `weights()` and
checkpoints come from rank 0, whole and HF-named either way.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgpack
import structlog
import torch
from torch import Tensor

from cadence.model.checkpoint import tensors_to_bytes
from cadence.ops.mismatch import add_sums
from cadence.training.collectives import CollectiveError, Collectives
from cadence.training.learner import TorchLearner, TrainGroup
from cadence.training.state import read_state, write_checkpoint, write_state
from cadence.training.step_figures import summarise
from cadence.wire.buffer import Buffer

log = structlog.get_logger()


class DistributedLearner:
    """The `Learner` of rank 0: commands the followers and trains its own share."""

    def __init__(self, local: TorchLearner, comm: Collectives) -> None:
        self.local = local
        self.comm = comm
        self._lock = threading.Lock()
        self._sums: dict[str, float] = {}
        self._full: dict[str, Tensor] | None = None  # sharded: the weights gathered since the last step
        self._last = time.monotonic()
        self._failed: BaseException | None = None
        self._closed = threading.Event()
        if not local.sharded:  # a sharded learner started from rank 0's weights before it split them
            sync_state(local, comm)
        self._pinger = threading.Thread(target=self._ping, name="rank0-ping", daemon=True)
        self._pinger.start()

    def train_groups(self, groups: Sequence[TrainGroup]) -> dict[str, float]:
        if not groups:
            raise ValueError("an empty micro-batch")
        with self._lock:
            self._command({"op": "train", "groups": [dataclasses.asdict(g) for g in groups]})
            stats = train_share(self.local, groups, self.comm)
        add_sums(self._sums, stats)
        return stats

    def step(self, normaliser: float, lr: float | None = None) -> dict[str, float]:
        with self._lock:
            self._command({"op": "step", "normaliser": normaliser, "lr": lr})
            info = step_all(self.local, normaliser, self.comm, lr)
            self._full = None
        info |= summarise(self._sums, normaliser)
        self._sums = {}
        return info

    def weights(self, alloc: Callable[[int], Buffer] = bytearray, dtype: str | None = None) -> bytes | Buffer:
        if not self.local.sharded:
            return self.local.weights(alloc, dtype)
        return tensors_to_bytes(self.tensors(), alloc, dtype)

    def stage(self, alloc: Callable[[int], Buffer], dtype: str | None = None) -> str | None:
        """Rank 0's parameters into the next version's buffer (`TorchLearner.stage`); the other ranks'
        stay where they are."""
        with self._lock:
            return self.local.stage(alloc, dtype)

    def tensors(self) -> Mapping[str, Tensor]:
        """The policy's weights; sharded, gathered from every rank once a version."""
        if not self.local.sharded:
            return self.local.tensors()
        with self._lock:
            if self._full is None:
                self._command({"op": "gather"})
                self._full = self.local.tensors()
            return self._full

    def save(self, directory: Path) -> str:
        if not self.local.sharded:
            return self.local.save(directory)
        return write_checkpoint(self.tensors(), self.local.model_cfg, self.local.tokenizer, directory)

    def save_state(self, directory: Path) -> None:
        if not self.local.sharded:
            self.local.save_state(directory)
            return
        weights = tensors_to_bytes(self.tensors())
        with self._lock:
            self._command({"op": "gather_optimizer"})
            optimizer = self.local.optimizer_state()
        write_state(directory, weights, optimizer)

    def load_state(self, directory: Path) -> None:
        """Rank 0 reads the files; every other rank gets the weights and optimizer state (or, sharded,
        its shards of them) from it."""
        self._sums = {}
        if self.local.sharded:
            weights, optimizer = read_state(directory)
            with self._lock:
                self._full = None
                self._command({"op": "load"})
                self.local.load(weights, optimizer)
            return
        self.local.load_state(directory)
        with self._lock:
            self._command({"op": "sync"})
            sync_state(self.local, self.comm)

    def close(self) -> None:
        """Tell the followers to return (once an unfinished command is done), then leave the group."""
        self._closed.set()
        if self._lock.acquire(timeout=self.comm.timeout_s):
            try:
                if self._failed is None:
                    self._command({"op": "stop"})
            except CollectiveError as err:
                log.warning("followers_not_stopped", error=str(err), exc_info=True)
            finally:
                self._lock.release()
        self._pinger.join(timeout=1.0)
        self.comm.close()

    def _command(self, command: dict[str, Any]) -> None:
        """Send `command` to every follower; the caller holds the lock."""
        if self._failed is not None:
            raise CollectiveError(f"the followers are gone: {self._failed}") from self._failed
        self.comm.broadcast_bytes(msgpack.packb(command), f"sending {command['op']!r} to the followers")
        self._last = time.monotonic()

    def _ping(self) -> None:
        """Keep idle followers from timing out while rank 0 waits for rollouts."""
        every = self.comm.timeout_s / 4
        while not self._closed.wait(every / 2):
            with self._lock:
                if self._closed.is_set() or self._failed is not None or time.monotonic() - self._last < every:
                    continue
                try:
                    self._command({"op": "ping"})
                except CollectiveError as err:
                    self._failed = err
                    log.error("followers_lost", error=str(err), exc_info=True)


def follow(local: TorchLearner, comm: Collectives) -> None:
    """A follower's life: rank 0's weights, then its commands until "stop"."""
    if not local.sharded:
        sync_state(local, comm)
    rank = comm.ranks.rank
    log.info("follower_ready", rank=rank, world=comm.ranks.world)
    while True:
        command = msgpack.unpackb(comm.broadcast_bytes(None, "waiting for rank 0's next command"))
        op = command.get("op")
        if op == "train":
            train_share(local, [TrainGroup(**g) for g in command["groups"]], comm)
        elif op == "step":
            lr = command.get("lr")
            step_all(local, float(command["normaliser"]), comm, None if lr is None else float(lr))
        elif op == "sync":
            sync_state(local, comm)
        elif op == "gather":
            local.tensors()
        elif op == "gather_optimizer":
            local.optimizer_state()
        elif op == "load":
            local.load(None, None)
        elif op == "stop":
            log.info("follower_stopped", rank=rank)
            return
        elif op != "ping":
            raise CollectiveError(f"trainer rank {rank}: unknown command {op!r} from rank 0")


def share(groups: Sequence[TrainGroup], rank: int, world: int, scale: bool = True) -> list[TrainGroup]:
    """This rank's part of the micro-batch: completions rank, rank + world, … of every group, each with
    its advantage in the whole group (`scale`: divided by the group's std, all but dr_grpo)."""
    mine = []
    for g in groups:
        picks = range(rank, len(g.completions), world)
        if picks:
            mine.append(g.pick(picks, g.advantage_list(scale)))
    return mine


def train_share(local: TorchLearner, groups: Sequence[TrainGroup], comm: Collectives) -> dict[str, float]:
    """Every rank: forward/backward of its share; the statistics summed over the ranks (extremes by
    min and max, ops/mismatch.py `add_sums`)."""
    mine = share(groups, comm.ranks.rank, comm.ranks.world, local.objective != "dr_grpo")
    stats = local.train_groups(mine) if mine or local.sharded else {}
    total: dict[str, float] = {}
    for part in comm.all_gather_bytes(msgpack.packb(stats), "gathering the micro-batch's statistics"):
        add_sums(total, msgpack.unpackb(part))
    return total


def step_all(
    local: TorchLearner, normaliser: float, comm: Collectives, lr: float | None = None
) -> dict[str, float]:
    """Every rank: sum the gradients over the ranks (sharded: summed by every backward already), then
    the one-rank step on the sum."""
    if not local.sharded:
        comm.sum_gradients([p for p in local.model.parameters() if p.requires_grad])
    return local.step(normaliser, lr)


def sync_state(local: TorchLearner, comm: Collectives) -> None:
    """Rank 0's parameters (policy and reference) and optimizer state on every rank."""
    params = list(local.model.parameters())
    if local.reference is not None:
        params += list(local.reference.parameters())
    comm.broadcast_tensors(params, "copying rank 0's weights")
    state = local.optimizer.state_dict()
    layout = [
        [index, key, str(value.dtype).removeprefix("torch."), list(value.shape), value.device.type == "cpu"]
        for index, entry in sorted(state["state"].items())
        for key, value in sorted(entry.items())
    ]
    manifest = {"param_groups": state["param_groups"], "state": layout} if comm.ranks.leader else None
    got = msgpack.unpackb(
        comm.broadcast_bytes(msgpack.packb(manifest) if manifest else None, "copying the optimizer layout"),
        strict_map_key=False,
    )
    if comm.ranks.leader:
        tensors = [state["state"][index][key] for index, key, *_ in layout]
    else:
        tensors = [
            torch.empty(shape, dtype=getattr(torch, dtype), device="cpu" if on_cpu else comm.device)
            for _, _, dtype, shape, on_cpu in got["state"]
        ]
    comm.broadcast_tensors(tensors, "copying rank 0's optimizer state")
    if not comm.ranks.leader:
        entries: dict[int, dict[str, torch.Tensor]] = {}
        for (index, key, *_), tensor in zip(got["state"], tensors, strict=True):
            entries.setdefault(index, {})[key] = tensor
        local.optimizer.load_state_dict({"state": entries, "param_groups": got["param_groups"]})
