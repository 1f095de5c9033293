"""Where the trainer's process writes each version for the workers on its own host: a slot of shared
memory for every worker there (transport/shared_memory.py), and a buffer on the trainer's GPU for the
workers on that device (transport/device_memory.py). Each is chosen when the configuration allows it
and the host can; where it cannot, one log line says why, and the workers take the next way
(device buffer ─► shared memory ─► a ZeroMQ pull).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import structlog

from cadence.config import RunConfig

if TYPE_CHECKING:
    from cadence.transport.device_memory import DeviceVersions
    from cadence.transport.shared_memory import SharedVersions

log = structlog.get_logger()


def shared_versions(cfg: RunConfig) -> SharedVersions | None:
    """Where the publisher writes each version for the workers on its host, when it may and can
    (else one log line says why not)."""
    if not cfg.weights.share_on_host:
        return None
    from cadence.transport.shared_memory import SharedVersions, sharing_problem

    problem = sharing_problem()
    if problem is not None:
        log.warning("shared_memory_unavailable", reason=problem, fallback="zmq")
        return None
    shared = SharedVersions(cfg.weights.keep_versions)
    log.info("weights_shared", slots=shared.prefix, host=shared.host)
    return shared


def device_versions(cfg: RunConfig) -> DeviceVersions | None:
    """Where the publisher writes each version for the workers on the trainer's GPU: when the
    trainer is on a CUDA device and may share (not LoRA's adapters, which its workers merge from
    host memory); else None (one log line where the device is CUDA and cannot share)."""
    if not cfg.weights.share_on_host or cfg.trainer.lora.rank > 0 or cfg.trainer.device != "cuda":
        return None
    import torch

    from cadence.transport.device_memory import DeviceVersions, device_sharing_problem

    cuda = torch.device("cuda", torch.cuda.current_device() if torch.cuda.is_available() else 0)
    problem = device_sharing_problem(cuda)
    if problem is not None:
        log.warning("device_sharing_unavailable", reason=problem, fallback="shm")
        return None
    versions = DeviceVersions(cuda)
    log.info("weights_shared_on_device", device=str(cuda), uuid=versions.uuid, buffers=versions.prefix)
    return versions
