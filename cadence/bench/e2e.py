"""`cadence bench e2e`: sync against periodic with the real checkpoint, engine and learner, through
`cadence run`'s own launcher and processes, and where each period's time goes.

```
 config (default: SmolLM2-135M on arithmetic) ─► mode = sync ─► run folder ─► metrics.jsonl ─┐
                                              └─► mode = periodic ─► run folder ─► metrics.jsonl ─┤
 periods 0 and 1 left out (start-up, first loads) ─► means a period ─► one JSON line ◄──────────┘
 with [environment]: also the workers' "environment" spans (logs/) ─► the environment's share of
 generation, and which part bounds the period
```

Invariant: both modes run the same config and seed, so they generate from the same prompts; every
figure is a mean over the same measured periods, read from the rows the trainer itself wrote (an
episode run's environment waits: from the spans its workers logged). A config without an environment
reports exactly the single-turn figures.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cadence.bench.memory import PeakMemory
from cadence.bench.report import report
from cadence.bench.where import where_run
from cadence.config import ConfigError, RunConfig, load_config
from cadence.launch.launcher import launch
from cadence.launch.threads import rollout_threads, trainer_threads
from cadence.monitor.pictures.spans import read_spans, seconds_by_period
from cadence.monitor.run_dir import read_jsonl

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "smollm2-arithmetic.toml"
WARMUP = 2  # periods left out of every mean


def period_figures(row: dict[str, Any], env_wait_s: float = 0.0) -> dict[str, float]:
    """One metrics row as the bench's figures (seconds, on the trainer's clock); a row of episodes
    (`turns_mean`) also with the environment's: `env_wait_s`, the seconds the worker that waited
    longest spent inside environment calls (its spans), of the generation `gen_s` holds, what is left
    of it to the model (`gen_model_s`), and the row's `env_s` (summed over the episodes, which wait at
    once)."""
    arrivals = row["group_arrival_s"]
    figures = {
        "period_s": row["period_s"],
        "trainer_idle_s": min(arrivals, default=0.0),  # from the version's publish to the first group
        "trainer_idle_total_s": row["trainer_idle_s"],
        "train_s": row["forward_backward_s"],  # the micro-batches' forwards and backwards, no step
        "step_s": row["step_s"],
        "publish_s": row["publish_s"],
        "load_s": row["weight_load_s"],
        "gen_s": row["gen_s"],
        "micro_batches": row["micro_batches"],
        "tokens_trained": row["tokens_trained"],  # that reached a loss term
        "tokens_kept": row.get("tokens_kept", 0),  # of the groups trained, computed or not
        "tokens_computed": row.get("tokens_computed", 0),
        "tokens_generated": row["tokens_generated"],
        "generated_per_s": row["tokens_generated"] / row["period_s"],
        "trained_per_s": row["tokens_trained"] / row["period_s"],
    }
    if "turns_mean" in row:
        figures |= {
            "env_wait_s": env_wait_s,
            "gen_model_s": max(0.0, row["gen_s"] - env_wait_s),
            "env_s": row["env_s"],
            "turns_mean": row["turns_mean"],
        }
    return figures


def measure(rows: list[dict[str, Any]], env_waits: dict[int, float] | None = None) -> dict[str, float]:
    """Mean figures over the periods after the warm-up ones; `env_waits`: period -> the environment
    wait of its longest-waiting worker (none: 0)."""
    steady = rows[WARMUP:]
    if not steady:
        raise ValueError(f"{len(rows)} periods: nothing after the {WARMUP} warm-up periods to measure")
    waits = env_waits or {}
    figures = [period_figures(r, waits.get(r["period"], 0.0)) for r in steady]
    return {key: round(sum(f[key] for f in figures) / len(figures), 4) for key in figures[0]}


def bound(figures: dict[str, float]) -> str:
    """What bounds an episode run's period: the longest of the model's generation (`gen_model_s`), the
    environment waits (`env_wait_s`) and training (`train_s` + `step_s`)."""
    parts = {
        "generation": figures["gen_model_s"],
        "environment": figures["env_wait_s"],
        "training": figures["train_s"] + figures["step_s"],
    }
    return max(parts, key=lambda part: parts[part])


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
    figures: dict[str, dict[str, Any]] = {}
    last: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="cadence-bench-e2e-") as tmp:
        for mode in ("sync", "periodic"):
            run_cfg = bench_config(config, [*overrides, f"mode='{mode}'"], periods)
            with PeakMemory(Path(tmp) / mode) as memory:
                launch(run_cfg, Path(tmp) / mode, progress=False)
            rows = read_jsonl(Path(tmp) / mode / "metrics.jsonl")
            waits = seconds_by_period(read_spans(Path(tmp) / mode), "environment")
            measured: dict[str, Any] = measure(rows, waits)
            if run_cfg.environment.played:
                measured["bound"] = bound(measured)
            figures[mode], last = measured, rows[-1]
            figures[mode]["trainer_threads"] = trainer_threads(run_cfg)
            figures[mode]["rollout_threads"] = rollout_threads(run_cfg)
            figures[mode]["peak_memory_mib"] = memory.peaks()
            shown = (f"{k} {v:g}" if isinstance(v, int | float) else f"{k} {v}" for k, v in measured.items())
            print(f"{mode:>8}: " + "  ".join(shown), flush=True)
    sync, periodic = figures["sync"], figures["periodic"]
    result: dict[str, Any] = {
        "sync_period_s": sync["period_s"],
        "periodic_period_s": periodic["period_s"],
        "speedup": round(sync["period_s"] / periodic["period_s"], 4),
        **{k: v for k, v in periodic.items() if k != "period_s"},
        "sync": {k: v for k, v in sync.items() if k != "period_s"},
        "reward_mean_last": round(last["reward_mean"], 4),
        **where_run(bench_config(config, overrides, periods)),
        "periods_measured": periods - WARMUP,
        "load_avg": [round(load_start, 2), round(os.getloadavg()[0], 2)],
    }
    return report(result, as_json)
