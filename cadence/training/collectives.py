"""The process group of a data-parallel trainer and the few collectives it uses.

Commands and statistics are bytes (msgpack) in uint8 tensors on a gloo group on the CPU, never
pickle; gradients and weights go over the device's backend (gloo on cpu, nccl on cuda, hccl on npu).

Invariant: every collective is bounded by `trainer.collective_timeout_s`, and a failed or timed-out
one raises `CollectiveError` naming this rank and what it was waiting for, so a dead or hung rank
ends every other rank with an error instead of a hang.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import Tensor

from cadence.config import TrainerConfig
from cadence.config.devices import BACKENDS
from cadence.model.devices import open_device
from cadence.training.ranks import Ranks

BUCKET_BYTES = 32 << 20  # gradients are summed in flat buckets of at most this size


class CollectiveError(RuntimeError):
    """A collective failed or timed out: another rank died, hung, or sent what this one did not expect."""


def local_device(cfg: TrainerConfig, ranks: Ranks) -> torch.device:
    """This rank's device: the CPU, or the LOCAL_RANK-th GPU / NPU of this host."""
    return open_device(cfg.device, ranks.local, "trainer.device", f"rank {ranks.rank}")


class Collectives:
    """The process group of `ranks` (joined on construction) and the collectives over it."""

    def __init__(self, cfg: TrainerConfig, ranks: Ranks, device: torch.device) -> None:
        self.ranks = ranks
        self.device = device
        self.timeout_s = cfg.collective_timeout_s
        timeout = timedelta(seconds=cfg.collective_timeout_s)
        backend = BACKENDS[cfg.device]
        with self._guard("joining the process group (torchrun's MASTER_ADDR and MASTER_PORT)"):
            dist.init_process_group(backend, rank=ranks.rank, world_size=ranks.world, timeout=timeout)
            # commands and statistics: small CPU tensors over gloo whatever the device backend
            self.control = None if backend == "gloo" else dist.new_group(backend="gloo", timeout=timeout)

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

    @contextlib.contextmanager
    def _guard(self, what: str) -> Iterator[None]:
        try:
            yield
        except (RuntimeError, ValueError) as err:  # torch's DistError is a RuntimeError
            if isinstance(err, CollectiveError):
                raise
            raise CollectiveError(
                f"trainer rank {self.ranks.rank} of {self.ranks.world}: {what} failed"
                f" (limit {self.timeout_s:g}s, trainer.collective_timeout_s): {type(err).__name__}: {err}"
            ) from err

    def broadcast_bytes(self, data: bytes | None, what: str) -> bytes:
        """Rank 0's `data` on every rank (others pass None): its length, then its bytes."""
        with self._guard(what):
            size = torch.tensor([len(data) if data is not None else 0], dtype=torch.int64)
            dist.broadcast(size, 0, group=self.control)
            if data is not None:
                buffer = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            else:
                buffer = torch.empty(int(size.item()), dtype=torch.uint8)
            if buffer.numel():
                dist.broadcast(buffer, 0, group=self.control)
            return data if data is not None else buffer.numpy().tobytes()

    def all_gather_bytes(self, data: bytes, what: str) -> list[bytes]:
        """Every rank's `data`, in rank order, on every rank."""
        with self._guard(what):
            size = torch.tensor([len(data)], dtype=torch.int64)
            sizes = [torch.empty_like(size) for _ in range(self.ranks.world)]
            dist.all_gather(sizes, size, group=self.control)
            longest = max(int(s.item()) for s in sizes)
            mine = torch.zeros(longest, dtype=torch.uint8)
            mine[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else 0
            parts = [torch.empty_like(mine) for _ in range(self.ranks.world)]
            dist.all_gather(parts, mine, group=self.control)
            return [p[: int(s.item())].numpy().tobytes() for p, s in zip(parts, sizes, strict=True)]

    def sum_gradients(self, params: Sequence[Tensor]) -> None:
        """Sum every parameter's gradient over the ranks, in flat buckets. A rank without a gradient
        for a parameter adds zeros; a parameter no rank has a gradient for keeps None (the optimizer
        skips it, as on one rank)."""
        if not params:
            return
        with self._guard("summing the gradients"):
            have = torch.tensor([p.grad is not None for p in params], dtype=torch.float32, device=self.device)
            dist.all_reduce(have)
            for bucket in _buckets(params):
                flat = torch.cat([_grad_or_zeros(params[i]).reshape(-1) for i in bucket])
                dist.all_reduce(flat)
                offset = 0
                for i in bucket:
                    p, n = params[i], params[i].numel()
                    p.grad = flat[offset : offset + n].view_as(p) if have[i] > 0 else None
                    offset += n

    def broadcast_tensors(self, tensors: Sequence[Tensor], what: str) -> None:
        """Overwrite every rank's `tensors` with rank 0's, in place (the same shapes on every rank)."""
        with self._guard(what), torch.no_grad():
            for t in tensors:
                group = self.control if t.device.type == "cpu" else None
                dist.broadcast(t, 0, group=group)


def _grad_or_zeros(p: Tensor) -> Tensor:
    return p.grad if p.grad is not None else torch.zeros_like(p)


def _buckets(params: Sequence[Tensor]) -> Iterator[list[int]]:
    """Indices of consecutive parameters of one dtype and device, up to `BUCKET_BYTES` a bucket (a
    larger one alone)."""
    bucket: list[int] = []
    size = 0
    for i, p in enumerate(params):
        nbytes = p.numel() * p.element_size()
        first = params[bucket[0]] if bucket else p
        if bucket and (size + nbytes > BUCKET_BYTES or (p.dtype, p.device) != (first.dtype, first.device)):
            yield bucket
            bucket, size = [], 0
        bucket.append(i)
        size += nbytes
    if bucket:
        yield bucket
