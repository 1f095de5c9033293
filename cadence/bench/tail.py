"""`cadence bench tail`: one config in several `[sampling]` variants (none, over-sampled, filtered, kept
in prompt order), each a real run through `cadence run`'s own launcher, and what each costs and keeps.

```
 config + --set ─► variants (base, over25, over50, over50+zv, over50+zv@prompt)
 round 0: base ─► over25 ─► … ─► over50+zv@prompt        each a fresh run of --periods periods,
 round 1: over50+zv@prompt ─► … ─► over25 ─► base          seed and prompts alike, its own folder
 each run's metrics.jsonl ─► period 0 left out ─► per variant: means over its measured periods of
 every round ─► one JSON line; the @prompt twins against their arrival-order variant: the bias
```

Design: the variants are alternated, not run one after the other: a round runs each variant once, the
next round runs them in reverse order (ABC CBA ABC …), so on a shared machine a drift of its load
falls alike on every variant. Each run starts afresh (same seed, the same prompt stream), so the
first period of each (start-up, first loads) is left out of every mean.

Invariant: every variant runs the same config and `--set` overrides; a variant sets the whole of
`sampling.oversample`, `sampling.filters` and `sampling.order`, nothing else. Every figure is read
from the rows the trainer itself wrote. The kept groups' figures come from what was trained
(`tokens_kept`, `reward_kept_mean`; a run without sampling trains every group that arrived). The
arrival bias compares two variants that differ only in `sampling.order`: their prompt stream and
sample seeds are the same, and period 0 generates with the same weights, so period 0's kept groups
differ only by which were kept.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cadence.bench.e2e import bench_config
from cadence.bench.report import report
from cadence.config import ConfigError
from cadence.launch.launcher import launch
from cadence.monitor.run_dir import read_jsonl

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "smollm2-math.toml"
DEFAULT_VARIANTS = ("base", "over25", "over50", "over50+zv", "over50+zv@prompt")
WARMUP = 1  # periods of each run left out of the means
ORDERS = ("arrival", "prompt")
FILTERS = {"zv": "zero_variance", "rr": "reward_range"}
# the figures a period, meaned over the measured ones
MEANS = (
    "period_s",
    "trainer_idle_s",
    "tail_s",
    "gen_s",
    "groups",
    "prompts_issued",
    "groups_filtered",
    "groups_stopped",
    "reward_mean",
    "reward_kept_mean",
    "response_len_kept",
    "response_len_mean",
    "tokens_generated",
)


def variant_overrides(name: str) -> list[str]:
    """The `--set` overrides of variant `name`: `base` (no sampling), or parts joined by `+`: `overNN`
    (`sampling.oversample = NN/100`), `zv` (the zero_variance filter), `rr` (reward_range); then
    optionally `@arrival` or `@prompt` (`sampling.order`, arrival unless named)."""
    body, _, order = name.partition("@")
    if order and order not in ORDERS:
        raise ConfigError(f"variant {name!r}: order {order!r} is neither of {', '.join(ORDERS)}")
    oversample, filters = 0.0, []
    for part in [] if body == "base" else body.split("+"):
        over = re.fullmatch(r"over(\d+)", part)
        if over:
            oversample = int(over[1]) / 100
        elif part in FILTERS:
            filters.append(FILTERS[part])
        else:
            raise ConfigError(
                f"variant {name!r}: unknown part {part!r}; a variant is base, or parts joined by +:"
                " overNN (sampling.oversample = NN/100), zv (zero_variance), rr (reward_range),"
                " then @arrival or @prompt (sampling.order)"
            )
    return [
        f"sampling.oversample={oversample}",
        f"sampling.filters={filters!r}",
        f"sampling.order='{order or 'arrival'}'",
    ]


def parse_variants(text: str | None) -> list[str]:
    """`--variants a,b,c` as names (each checked); none given: the default list."""
    names = [n.strip() for n in text.split(",") if n.strip()] if text else list(DEFAULT_VARIANTS)
    if len(set(names)) < len(names) or not names:
        raise ConfigError(f"--variants {text!r}: name each variant once")
    for name in names:
        variant_overrides(name)
    return names


def schedule(variants: Sequence[str], rounds: int) -> list[tuple[int, str]]:
    """(round, variant) in the order they run: each round every variant once, odd rounds reversed."""
    return [(r, v) for r in range(rounds) for v in (variants if r % 2 == 0 else variants[::-1])]


def period_figures(row: dict[str, Any], group_size: int) -> dict[str, float]:
    """One metrics row as the bench's figures. A run without sampling trains every group that arrived:
    its issued prompts are its groups, and its kept reward is its reward."""
    kept_samples = row["groups"] * group_size
    kept_reward = row.get("reward_kept_mean", row["reward_mean"])
    return {
        "period_s": row["period_s"],
        "trainer_idle_s": row["trainer_idle_s"],
        "tail_s": row["tail_s"],
        "gen_s": row["gen_s"],
        "groups": row["groups"],
        "prompts_issued": row.get("prompts_issued", row["groups"]),
        "groups_filtered": row.get("groups_filtered", 0),
        "groups_stopped": row.get("groups_stopped", 0),
        "reward_mean": row["reward_mean"],
        "reward_kept_mean": kept_reward,
        "response_len_kept": row["tokens_kept"] / kept_samples if kept_samples else 0.0,
        "response_len_mean": row["response_len_mean"],
        "tokens_generated": row["tokens_generated"],
        "kept_samples": kept_samples,
        "reward_trained": kept_reward * kept_samples,
    }


def measure(runs: Sequence[Sequence[dict[str, Any]]], group_size: int) -> dict[str, Any]:
    """Means a period over every run's periods after the warm-up; `reward_per_s`: the trained samples'
    rewards summed over those periods, over their summed `period_s`; `period_s_runs`: each run's own
    mean period (the spread between rounds)."""
    figures = [period_figures(row, group_size) for rows in runs for row in rows[WARMUP:]]
    if not figures:
        raise ValueError(f"nothing after the {WARMUP} warm-up period of each run to measure")
    means: dict[str, Any] = {key: round(sum(f[key] for f in figures) / len(figures), 4) for key in MEANS}
    seconds = sum(f["period_s"] for f in figures)
    means["reward_per_s"] = round(sum(f["reward_trained"] for f in figures) / seconds, 4)
    means["periods_measured"] = len(figures)
    runs_s = [[r["period_s"] for r in rows[WARMUP:]] for rows in runs]
    return means | {"period_s_runs": [round(sum(s) / len(s), 4) for s in runs_s if s]}


def kept(rows: Sequence[dict[str, Any]], group_size: int) -> dict[str, float]:
    """The kept groups of `rows` pooled: their samples' mean response length and reward."""
    figures = [period_figures(row, group_size) for row in rows]
    samples = sum(f["kept_samples"] for f in figures)
    tokens = sum(row["tokens_kept"] for row in rows)
    reward = sum(f["reward_trained"] for f in figures)
    return {
        "response_len": round(tokens / samples, 3) if samples else 0.0,
        "reward": round(reward / samples, 4) if samples else 0.0,
    }


def twin(name: str, variants: Sequence[str]) -> str | None:
    """The arrival-order variant that `name` (an `@prompt` one) differs from only in its order."""
    body, _, order = name.partition("@")
    if order != "prompt":
        return None
    return next((v for v in (body, f"{body}@arrival") if v in variants), None)


def arrival_bias(
    runs: dict[str, list[list[dict[str, Any]]]], group_size: int
) -> dict[str, dict[str, dict[str, float]]]:
    """Each `@prompt` variant against its arrival-order twin: the kept groups' response length and
    reward in period 0 (the same weights: the difference is the choice alone) and over all periods
    (the weights part after period 0), each of every round; `diff` is arrival less prompt."""
    bias: dict[str, dict[str, dict[str, float]]] = {}
    for name in runs:
        arrival = twin(name, list(runs))
        if arrival is None:
            continue
        scopes = {"period0": lambda rows: rows[:1], "all_periods": lambda rows: rows}
        bias[arrival] = {}
        for scope, take in scopes.items():
            a = kept([row for rows in runs[arrival] for row in take(rows)], group_size)
            p = kept([row for rows in runs[name] for row in take(rows)], group_size)
            bias[arrival][scope] = {
                "len_arrival": a["response_len"],
                "len_prompt": p["response_len"],
                "len_diff": round(a["response_len"] - p["response_len"], 3),
                "reward_arrival": a["reward"],
                "reward_prompt": p["reward"],
                "reward_diff": round(a["reward"] - p["reward"], 4),
            }
    return bias


def speedups(figures: dict[str, dict[str, Any]]) -> None:
    """Each variant's `speedup_vs_base` (base's period_s over its own) and `tail_vs_base`, with a base."""
    base = figures.get("base")
    if base is None:
        return
    for f in figures.values():
        f["speedup_vs_base"] = round(base["period_s"] / f["period_s"], 4) if f["period_s"] else 0.0
        f["tail_vs_base"] = round(f["tail_s"] / base["tail_s"], 4) if base["tail_s"] else 0.0


def run_variant(
    config: Path, overrides: Sequence[str], periods: int, name: str, out: Path
) -> list[dict[str, Any]]:
    """One run of variant `name` in `out`; its metrics rows."""
    cfg = bench_config(config, [*overrides, *variant_overrides(name)], periods)
    launch(cfg, out, progress=False, overwrite=True)  # the bench's own folders, rerun each time
    return read_jsonl(out / "metrics.jsonl")


def bench_tail(
    config: Path | None,
    overrides: Sequence[str],
    periods: int,
    as_json: bool,
    out: Path,
    variants: str | None = None,
    rounds: int = 2,
) -> int:
    if periods <= WARMUP or rounds < 1:
        raise ConfigError(
            f"--periods must exceed {WARMUP} and --rounds be 1 or more, got {periods}, {rounds}"
        )
    names, config = parse_variants(variants), config or DEFAULT_CONFIG
    cfg = bench_config(config, overrides, periods)  # a bad config or a missing checkpoint, before any run
    load_start = os.getloadavg()
    runs: dict[str, list[list[dict[str, Any]]]] = {name: [] for name in names}
    for r, name in schedule(names, rounds):
        load = os.getloadavg()[0]
        rows = run_variant(config, overrides, periods, name, out / f"tail-r{r}-{name}")
        runs[name].append(rows)
        steady = rows[WARMUP:]
        measured = measure([rows], cfg.rollout.group_size)
        shown = "  ".join(f"{k} {v:g}" for k, v in measured.items() if isinstance(v, int | float))
        print(f"{name:>18} r{r} (load {load:.2f}, {len(steady)} periods): {shown}", flush=True)
    figures: dict[str, dict[str, Any]] = {n: measure(rs, cfg.rollout.group_size) for n, rs in runs.items()}
    speedups(figures)
    for name, f in figures.items():
        print(f"{name:>18}: " + "  ".join(f"{k} {v}" for k, v in f.items()), flush=True)
    result: dict[str, Any] = {
        "bench": "tail",
        "config": str(config),
        "variants": figures,
        "arrival_bias": arrival_bias(runs, cfg.rollout.group_size),
        "periods": periods,
        "rounds": rounds,
        "warmup_periods": WARMUP,
        "prompts_per_period": cfg.task.prompts_per_period,
        "group_size": cfg.rollout.group_size,
        "max_new_tokens": cfg.rollout.max_new_tokens,
        "cores": os.cpu_count(),
        "load_avg": [[round(x, 2) for x in load_start], [round(x, 2) for x in os.getloadavg()]],
    }
    return report(result, as_json)
