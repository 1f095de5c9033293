"""`cadence bench e2e`: sync against periodic with the real checkpoint, engine and learner, through
`cadence run`'s own launcher and processes, and where each period's time goes.

```
 config (default: SmolLM2-135M on arithmetic) ─► mode = sync ─► run folder ─► metrics.jsonl ─┐
                                              └─► mode = periodic ─► run folder ─► metrics.jsonl ─┤
 periods 0 and 1 left out (start-up, first loads) ─► means a period ─► one JSON line ◄──────────┘
```

Invariant: both modes run the same config and seed, so they generate from the same prompts; every
figure is a mean over the same measured periods, read from the rows the trainer itself wrote.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cadence.bench.report import report
from cadence.config import ConfigError, RunConfig, load_config
from cadence.launch.launcher import launch
from cadence.launch.threads import rollout_threads, trainer_threads
from cadence.monitor.run_dir import read_jsonl

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "smollm2-arithmetic.toml"
WARMUP = 2  # periods left out of every mean


def period_figures(row: dict[str, Any]) -> dict[str, float]:
    """One metrics row as the bench's figures (seconds, on the trainer's clock)."""
    arrivals = row["group_arrival_s"]
    return {
        "period_s": row["period_s"],
        "trainer_idle_s": min(arrivals, default=0.0),  # from the version's publish to the first group
        "trainer_idle_total_s": row["trainer_idle_s"],
        "train_s": row["forward_backward_s"],  # the micro-batches' forwards and backwards, no step
        "step_s": row["step_s"],
        "publish_s": row["publish_s"],
        "load_s": row["weight_load_s"],
        "gen_s": row["gen_s"],
        "micro_batches": row["micro_batches"],
        "tokens_trained": row["tokens_trained"],
        "tokens_computed": row.get("tokens_computed", 0),
    }


def measure(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Mean figures over the periods after the warm-up ones."""
    steady = rows[WARMUP:]
    if not steady:
        raise ValueError(f"{len(rows)} periods: nothing after the {WARMUP} warm-up periods to measure")
    figures = [period_figures(r) for r in steady]
    return {key: round(sum(f[key] for f in figures) / len(figures), 4) for key in figures[0]}


def bench_config(config: Path | None, overrides: Sequence[str], periods: int) -> RunConfig:
    """The config both modes run; a named checkpoint must exist (`make smollm2` converts SmolLM2's)."""
    cfg = load_config(config or DEFAULT_CONFIG, [*overrides, f"periods={periods}"])
    checkpoint = cfg.model.checkpoint
    if checkpoint and not (Path(checkpoint).expanduser() / "config.json").exists():
        raise ConfigError(
            f"model.checkpoint = {checkpoint!r} holds no checkpoint: run `make smollm2` first (it"
            " converts SmolLM2-135M-Instruct once), or pass --config with another model"
        )
    return cfg


def bench_e2e(config: Path | None, overrides: Sequence[str], periods: int, as_json: bool) -> int:
    if periods <= WARMUP:
        raise ConfigError(f"--periods must exceed the {WARMUP} warm-up periods, got {periods}")
    bench_config(config, overrides, periods)  # a bad config or a missing checkpoint, before any run
    load_start = os.getloadavg()[0]
    figures: dict[str, dict[str, float]] = {}
    last: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="cadence-bench-e2e-") as tmp:
        for mode in ("sync", "periodic"):
            run_cfg = bench_config(config, [*overrides, f"mode='{mode}'"], periods)
            launch(run_cfg, Path(tmp) / mode, progress=False)
            rows = read_jsonl(Path(tmp) / mode / "metrics.jsonl")
            figures[mode], last = measure(rows), rows[-1]
            figures[mode]["trainer_threads"] = trainer_threads(run_cfg)
            figures[mode]["rollout_threads"] = rollout_threads(run_cfg)
            print(f"{mode:>8}: " + "  ".join(f"{k} {v:g}" for k, v in figures[mode].items()), flush=True)
    sync, periodic = figures["sync"], figures["periodic"]
    result: dict[str, Any] = {
        "sync_period_s": sync["period_s"],
        "periodic_period_s": periodic["period_s"],
        "speedup": round(sync["period_s"] / periodic["period_s"], 4),
        **{k: v for k, v in periodic.items() if k != "period_s"},
        "sync": {k: v for k, v in sync.items() if k != "period_s"},
        "reward_mean_last": round(last["reward_mean"], 4),
        "rollout_dtype": bench_config(config, overrides, periods).rollout.dtype,
        "periods_measured": periods - WARMUP,
        "cores": os.cpu_count(),
        "load_avg": [round(load_start, 2), round(os.getloadavg()[0], 2)],
    }
    return report(result, as_json)
