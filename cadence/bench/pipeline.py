"""`cadence bench pipeline`: sync against periodic on the real actors and sockets, with a simulated
engine (long-tailed generation cost) and a simulated learner (cost per trained token).

Invariant: both modes run the same config and seed, so they see the same prompts and the same
simulated costs; the first period (start-up, first weight load) is left out of every mean. With
`[sampling]` on (`--set sampling.oversample=0.25`) the JSON also says what each period issued, kept,
filtered and stopped; the keys of a run without it stay as they are, `tail_s` and `sync_tail_s` added.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cadence.bench.report import report
from cadence.config import RunConfig, load_config
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


SAMPLED = ("groups", "prompts_issued", "groups_filtered", "groups_stopped")  # an over-sampled run's
PROMPT_ROOM = 64  # positions a digits prompt takes at most, beside its completion


def room(overrides: Sequence[str]) -> list[str]:
    """The overrides that give a simulated completion of up to `simulated.length_max` tokens its room:
    the token limit and the model's positions the trainer holds every group to."""
    cfg = load_config(None, [*DEFAULTS, *overrides])
    longest = cfg.simulated.length_max
    return [
        f"rollout.max_new_tokens={max(cfg.rollout.max_new_tokens, longest)}",
        f"model.max_position={max(cfg.model.max_position, longest + PROMPT_ROOM)}",
    ]


def ideal_period(row: dict[str, Any]) -> float:
    """A serial trainer fed by this period's measured arrivals and per-group costs, plus its step.
    A filtered group arrives and is not trained, and the row does not say which arrivals were: the
    micro-batches are then paired with the latest arrivals, which can only make the ideal later (and
    `efficiency` higher) than it was."""
    costs = row["micro_batch_train_s"]
    arrivals = row["group_arrival_s"][len(row["group_arrival_s"]) - len(costs) :]  # in arrival order
    return serial_finish(0.0, arrivals, costs) + row["step_s"]


def measure(rows: list[dict[str, Any]]) -> dict[str, float]:
    steady = rows[1:] or rows
    keys = ("period_s", "gen_s", "train_s", "weight_sync_s", "tail_s")
    means = {key: sum(r[key] for r in steady) / len(steady) for key in keys}
    means["ideal_s"] = sum(ideal_period(r) for r in steady) / len(steady)
    if "prompts_issued" in steady[0]:
        means |= {key: sum(r.get(key, 0) for r in steady) / len(steady) for key in SAMPLED}
    return means


def sampled_figures(cfg: RunConfig, periodic: dict[str, float], sync: dict[str, float]) -> dict[str, Any]:
    """An over-sampled run's figures: each mode's kept groups, issued, filtered and stopped prompts
    a period (none without `[sampling]`)."""
    if not cfg.sampling.on:
        return {}
    figures: dict[str, Any] = {"oversample": cfg.sampling.oversample, "filters": cfg.sampling.filters}
    figures |= {key: round(periodic[key], 4) for key in SAMPLED}
    figures |= {f"sync_{key}": round(sync[key], 4) for key in SAMPLED}
    return figures


def bench_pipeline(overrides: Sequence[str], out: Path, as_json: bool) -> int:
    load_start = os.getloadavg()[0]
    figures: dict[str, dict[str, float]] = {}
    for mode in ("sync", "periodic"):
        cfg = load_config(None, [*DEFAULTS, *overrides, *room(overrides), f"mode='{mode}'"])
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
        "tail_s": round(periodic["tail_s"], 4),
        "sync_tail_s": round(sync["tail_s"], 4),
        **sampled_figures(cfg, periodic, sync),
        "load_avg": [round(load_start, 2), round(os.getloadavg()[0], 2)],
    }
    return report(result, as_json)
