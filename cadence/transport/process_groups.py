"""torch.distributed groups made for one weight broadcast generation, and the buckets sent through them.

```
 root (rank 0, the trainer)                        member r (a rollout worker)
 plans sent over ZeroMQ ───────────────────────►   BroadcastPlan(generation g, rank r, world n)
 new generation: wait for ready/1..n-1 ◄────────── set ready/r, wait for go (or abort)
   all there: set go ─ form the group ───────────► form the group
   some missing (deadline): set abort, name them   abort: fail
 every bucket: broadcast(root 0) ────────────────► receive into the bucket buffer
 wait for done/v/1..n-1 (deadline) ◄────────────── set done/v/r
```

The groups are built directly on a `PrefixStore` (no `init_process_group`), so a process may hold a
broadcast group beside its own default group (a multi-rank trainer), and a new generation never
touches the old one's keys.

Invariant: no step waits longer than the group's `timeout_s`; a step that runs out raises
`BroadcastError` naming the ranks that did not arrive.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from cadence.transport.buckets import BucketPlan, fill_bucket, read_bucket
from cadence.transport.weights import WeightError

POLL_S = 0.01


class BroadcastError(WeightError):
    """A broadcast step did not finish in time; `missing` holds the ranks that did not arrive."""

    def __init__(self, message: str, missing: Sequence[int] = ()) -> None:
        super().__init__(message)
        self.missing = list(missing)


def connect_store(host: str, port: int, timeout_s: float) -> dist.Store:
    """A client of the root's `TCPStore`."""
    return dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=timeout_s))


def host_store(host: str, port: int, timeout_s: float) -> dist.TCPStore:
    """The root's store, bound on `host` (`port` 0: any free one; `.port` says which)."""
    return dist.TCPStore(
        host, port, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=timeout_s)
    )


def wait_keys(store: dist.Store, keys: Mapping[int, str], timeout_s: float) -> list[int]:
    """Wait until every key exists; the ranks whose key is still missing at the deadline."""
    deadline = time.monotonic() + timeout_s
    missing = dict(keys)
    while missing:
        missing = {r: k for r, k in missing.items() if not store.check([k])}
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(POLL_S)
    return sorted(missing)


def root_rendezvous(store: dist.Store, world: int, timeout_s: float) -> None:
    """Rank 0: wait for every member's `ready` key, then let them form the group (or abort)."""
    missing = wait_keys(store, {r: f"ready/{r}" for r in range(1, world)}, timeout_s)
    if missing:
        store.set("abort", ",".join(map(str, missing)))
        raise BroadcastError(f"ranks {missing} did not join within {timeout_s:.1f}s", missing)
    store.set("go", "1")


def member_rendezvous(store: dist.Store, rank: int, timeout_s: float) -> None:
    store.set(f"ready/{rank}", "1")
    deadline = time.monotonic() + timeout_s
    while not store.check(["go"]):
        if store.check(["abort"]) or time.monotonic() > deadline:
            raise BroadcastError(f"rank {rank}: the group did not form within {timeout_s:.1f}s", [0])
        time.sleep(POLL_S)


def new_group(backend: str, store: dist.Store, rank: int, world: int, timeout_s: float, host: str) -> Any:
    """A process group of `world` ranks on `store` with its own timeout; gloo binds to `host`."""
    timeout = datetime.timedelta(seconds=timeout_s)
    if backend == "gloo":
        opts = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
        opts._timeout = timeout
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
        return dist.ProcessGroupGloo(store, rank, world, opts)
    if backend == "nccl":
        nccl_opts = dist.ProcessGroupNCCL.Options()
        nccl_opts._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, world, nccl_opts)
    if backend == "hccl":
        try:
            import torch_npu  # noqa: F401
            from torch_npu._C._distributed_c10d import ProcessGroupHCCL  # type: ignore[import-not-found]
        except ImportError as err:
            raise WeightError("weights.transport = 'hccl' needs torch_npu (pip install torch-npu)") from err
        hccl_opts = ProcessGroupHCCL.Options()
        hccl_opts._timeout = timeout
        return ProcessGroupHCCL(store, rank, world, hccl_opts)
    raise WeightError(f"no broadcast backend {backend!r}; choose gloo, nccl or hccl")


def _broadcast(group: Any, buffer: Tensor, timeout_s: float) -> None:
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    opts.timeout = datetime.timedelta(seconds=timeout_s)
    group.broadcast([buffer], opts).wait()


def send_buckets(
    group: Any,
    plan: BucketPlan,
    state: Mapping[str, Tensor],
    device: str,
    timeout_s: float,
    digest: Callable[[Tensor], None] | None,
) -> None:
    """Rank 0: every bucket of `state`, in order; `digest` sees each buffer."""
    for index, size in enumerate(plan.sizes):
        buffer = torch.zeros(size, dtype=torch.uint8, device=device)
        fill_bucket(plan, state, index, buffer)
        if digest is not None:
            digest(buffer)
        _broadcast(group, buffer, timeout_s)


def receive_buckets(
    group: Any, plan: BucketPlan, device: str, timeout_s: float, digest: Callable[[Tensor], None] | None
) -> dict[str, Tensor]:
    """A member: every bucket, as tensors viewing the received buffers; `digest` sees each buffer."""
    state: dict[str, Tensor] = {}
    for index, size in enumerate(plan.sizes):
        buffer = torch.empty(size, dtype=torch.uint8, device=device)
        _broadcast(group, buffer, timeout_s)
        if digest is not None:
            digest(buffer)
        state.update(read_bucket(plan, index, buffer))
    return state
