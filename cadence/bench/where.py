"""Where a bench ran: the run's devices and precisions, the machine, the library versions, and the
GPU as `nvidia-smi` names it (read from outside, so the bench's own process never opens a device
context the run's actors would share)."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from typing import Any

from cadence.config import RunConfig


def nvidia_smi(query: str) -> list[list[str]]:
    """`nvidia-smi --<query> --format=csv,noheader,nounits`, a row a line and a field a column; empty
    without nvidia-smi or when it fails."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--{query}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [[part.strip() for part in line.split(",")] for line in out.splitlines() if line.strip()]


def gpus() -> list[dict[str, str]]:
    """Each GPU `nvidia-smi` lists (name, driver, memory); empty without one."""
    rows = nvidia_smi("query-gpu=name,driver_version,memory.total")
    return [
        dict(zip(("name", "driver", "memory"), (name, driver, f"{memory} MiB"), strict=True))
        for name, driver, memory in (row for row in rows if len(row) == 3)
    ]


def where_run(cfg: RunConfig) -> dict[str, Any]:
    import torch

    engine = cfg.rollout.engine
    return {
        "rollout_engine": engine,
        "rollout_device": cfg.rollout.device if engine == "torch" else "vllm",
        "rollout_dtype": cfg.rollout.dtype if engine == "torch" else cfg.vllm.dtype,
        "rollout_workers": cfg.rollout.workers,
        "trainer_device": cfg.trainer.device,
        "trainer_precision": cfg.trainer.precision,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpus": gpus(),
        "python": platform.python_version(),
        "cores": os.cpu_count(),
    }
