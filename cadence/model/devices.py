"""Opening a device a config names: the CPU, a CUDA GPU, or an Ascend NPU through torch_npu.

Invariant: a device that cannot be had here is one `ConfigError` naming the config key that asked for
it and what this host has; nothing else in the model, engine or learner assumes the CPU.
"""

from __future__ import annotations

import torch

from cadence.config import ConfigError


def open_device(kind: str, index: int, key: str, who: str) -> torch.device:
    """Device `index` of `kind` ("cpu", "cuda" or "npu"), made current for its kind; `key`: the config
    key that asked for it and `who` the process that wants it, named in the error."""
    if kind == "cpu":
        return torch.device("cpu")
    if kind == "npu":
        try:
            import torch_npu  # noqa: F401
        except ImportError:
            raise ConfigError(
                f"{key} = 'npu' needs torch_npu (pip install torch-npu, the release matching"
                f" torch {torch.__version__})"
            ) from None
    backend = getattr(torch, kind, None)
    if backend is None or not hasattr(backend, "is_available"):
        raise ConfigError(f"{key} = {kind!r}: no such device kind in torch {torch.__version__}")
    count = backend.device_count() if backend.is_available() else 0
    if count <= index:
        raise ConfigError(f"{key} = {kind!r}: {who} wants device {index}, but torch sees {count}")
    backend.set_device(index)
    return torch.device(kind, index)
