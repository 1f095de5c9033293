"""`cadence bench pipeline`: sync against periodic on the real actors and sockets, with a simulated
engine (long-tailed generation cost) and a simulated learner (cost per trained token).

Invariant: both modes run the same config and seed, so they see the same prompts and the same
simulated costs; the first period (start-up, first weight load) is left out of every mean.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cadence.bench.report import report
from cadence.config import load_config
from cadence.launch.launcher import launch
from cadence.monitor.metrics import serial_finish
from cadence.monitor.run_dir import read_jsonl

DEFAULTS = [
    "periods=7",
    "rollout.workers=4",
    "rollout.engine='simulated'",
    "trainer.learner='simulated'",
    "task.prompts_per_period=32",
    "rollout.group_size=8",
    "rollout.inflight=1",
    "simulated.gen_s_per_token=0.0004",
    "simulated.train_s_per_token=0.000025",
    "trainer.micro_batch_tokens=0",  # a micro-batch a group: the ideal below takes per-group costs
]


def ideal_period(row: dict[str, Any]) -> float:
    """A serial trainer fed by this period's measured arrivals and per-group costs, plus its step."""
    return serial_finish(0.0, row["group_arrival_s"], row["micro_batch_train_s"]) + row["step_s"]


def measure(rows: list[dict[str, Any]]) -> dict[str, float]:
    steady = rows[1:] or rows
    return {
        "period_s": sum(r["period_s"] for r in steady) / len(steady),
        "ideal_s": sum(ideal_period(r) for r in steady) / len(steady),
        "gen_s": sum(r["gen_s"] for r in steady) / len(steady),
        "train_s": sum(r["train_s"] for r in steady) / len(steady),
        "weight_sync_s": sum(r["weight_sync_s"] for r in steady) / len(steady),
    }


def bench_pipeline(overrides: Sequence[str], out: Path, as_json: bool) -> int:
    figures: dict[str, dict[str, float]] = {}
    for mode in ("sync", "periodic"):
        cfg = load_config(None, [*DEFAULTS, *overrides, f"mode='{mode}'"])
        launch(cfg, out / mode, progress=False, overwrite=True)  # the bench's own folders, rerun each time
        figures[mode] = measure(read_jsonl(out / mode / "metrics.jsonl"))
        print(f"{mode:>8}: " + "  ".join(f"{k} {v:.3f}" for k, v in figures[mode].items()), flush=True)
    sync, periodic = figures["sync"], figures["periodic"]
    result = {
        "sync_period_s": round(sync["period_s"], 4),
        "periodic_period_s": round(periodic["period_s"], 4),
        "speedup": round(sync["period_s"] / periodic["period_s"], 4),
        "ideal_period_s": round(periodic["ideal_s"], 4),
        "efficiency": round(periodic["ideal_s"] / periodic["period_s"], 4),
        "gen_s": round(periodic["gen_s"], 4),
        "train_s": round(periodic["train_s"], 4),
        "weight_sync_s": round(periodic["weight_sync_s"], 4),
        "periods_measured": cfg.periods - 1,
        "workers": cfg.rollout.workers,
        "prompts_per_period": cfg.task.prompts_per_period,
    }
    return report(result, as_json)
