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


def gpus() -> list[dict[str, str]]:
    """Each GPU `nvidia-smi` lists (name, driver, memory); empty without one."""
    if shutil.which("nvidia-smi") is None:
        return []
    fields = ("name", "driver_version", "memory.total")
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    rows = [[part.strip() for part in line.split(",")] for line in out.splitlines() if line.strip()]
    return [dict(zip(("name", "driver", "memory"), row, strict=False)) for row in rows]


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
