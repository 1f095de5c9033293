"""Which device kind each collective backend drives, and which backend each device kind uses."""

from __future__ import annotations

DEVICES = {"gloo": "cpu", "nccl": "cuda", "hccl": "npu"}  # each backend's device kind, one a backend
BACKENDS = {device: backend for backend, device in DEVICES.items()}  # a device kind -> its backend
