"""`cadence bench weights`'s `cuda-ipc` entry, where torch sees a GPU: a version from the trainer's
tensors on the device to each worker's own copy on the same device, through the publisher's device
buffers (transport/device_memory.py).

The clock runs from the publisher taking a buffer to every worker holding the version: the image
copied in from a tensor of the version's bytes already on the device (as the trainer's parameters
are), its digest computed on the device, the `WeightMeta` sent; each worker (a process of its own,
its `DeviceReader` kept from one repeat to the next, as a rollout worker keeps it) opens the buffer,
checks the device digest, copies the version into a buffer of its own on the device (as a compiled
engine copies into its weights) and waits for the copy. Its `seconds` is a version's publish plus
load on one GPU.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

from cadence.wire.codec import decode, encode
from cadence.wire.messages import WeightMeta

if TYPE_CHECKING:
    import torch

    from cadence.transport.device_memory import DeviceReader, DeviceVersions


def device_problem() -> str | None:
    """Why there is no `cuda-ipc` figure on this host (None: there is one)."""
    import torch

    from cadence.transport.device_memory import device_sharing_problem

    if not torch.cuda.is_available():
        return "CUDA is not available"
    return device_sharing_problem(torch.device("cuda", 0))


class DeviceBench:
    """The publisher's side, its buffers kept for the whole bench; `collect(conns, nbytes, what)`
    waits for every worker's byte count."""

    def __init__(self, collect: Callable[[list[Connection], int, str], None]) -> None:
        self.collect = collect
        self.versions: DeviceVersions | None = None
        self.source: torch.Tensor | None = None

    def send(self, data: bytes, version: int, conns: list[Connection]) -> float:
        import torch

        from cadence.transport.device_memory import DeviceVersions

        if self.versions is None or self.source is None:
            device = torch.device("cuda", 0)
            self.versions = DeviceVersions(device)
            self.source = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
        torch.cuda.synchronize()
        begin = time.perf_counter()
        buffer = self.versions.take(len(data))
        if buffer is None:
            raise RuntimeError("cuda-ipc: every device buffer is held")
        buffer.copy_(self.source)
        slot = self.versions.write(version, buffer)
        meta = WeightMeta(version, True, len(data), "", 1, 1, device=slot)
        for conn in conns:
            conn.send(("cuda-ipc", encode(meta, "bench")))
        self.collect(conns, len(data), "cuda-ipc")
        return time.perf_counter() - begin


@functools.cache
def _reader() -> DeviceReader:
    import torch

    from cadence.transport.device_memory import DeviceReader

    return DeviceReader(torch.device("cuda", 0))


_own: dict[int, torch.Tensor] = {}  # the worker's copy of the version, by size


def device_receive(reply: Callable[[int], None], frame: bytes) -> None:
    """A worker's side: the version opened, checked, copied into its own buffer on the device."""
    import torch

    msg = decode(frame).message
    assert isinstance(msg, WeightMeta)
    held = _reader().open(msg)  # raises unless the size and the device digest match
    own = _own.get(held.data.numel())
    if own is None:
        own = _own[held.data.numel()] = torch.empty_like(held.data)
    own.copy_(held.data)
    torch.cuda.synchronize()
    reply(held.data.numel())
    held.release()
