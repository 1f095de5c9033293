"""`cadence bench packing`: forward + backward of one period's groups on CPU, three ways: unpacked
(one [P | Ri] row per sample, as ``pad_group`` builds them), the packed row (ops/packing.py, a bool
mask over the whole row) and the prefix cache (model/prefix.py, the prompt once, the responses batched
against its repeated KV cache).

Invariant: every variant runs the same model, groups and advantages, each in a fresh spawned process
(so each peak RSS is its own), timed as the median of ``repeats`` after one warm-up step; each
shared-prompt variant's log-probs are checked against the unpacked ones. ``speedup`` and
``peak_rss_ratio`` are those of the fastest shared-prompt variant, named by ``method``.
"""

from __future__ import annotations

import json
import multiprocessing
import random
import resource
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import torch
from torch import Tensor

from cadence.model.config import ModelConfig
from cadence.model.prefix import prefix_logprobs
from cadence.model.transformer import init_model
from cadence.ops.logprobs import token_logprobs
from cadence.ops.packing import Group, pack_groups, packed_length, packed_logprobs
from cadence.training.policy_pass import pad_group

PAD = 0
# head_dim 64 and an MLP 3x wide, as in real checkpoints: hidden 256 with head_dim 32 would make the
# (dense, masked) attention an unrealistically large share of the packed step.
MODEL = ModelConfig(
    vocab_size=512,
    hidden_size=512,
    num_layers=2,
    num_heads=8,
    num_kv_heads=2,
    intermediate_size=1536,
    max_position=2048,
)


def make_groups(prompt_len: int, response_len: int, group_size: int, groups: int) -> list[Group]:
    rng = random.Random(0)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(1, MODEL.vocab_size) for _ in range(n)]

    return [(tokens(prompt_len), [tokens(response_len) for _ in range(group_size)]) for _ in range(groups)]


def _rss_mib() -> float:
    scale = 1024 * 1024 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**20


def _run_variant(variant: str, groups: list[Group], repeats: int) -> dict[str, Any]:
    """Build the model and inputs, then time ``1 + repeats`` forward + backward steps (in a child)."""
    model = init_model(MODEL, seed=0)
    num_samples = sum(len(c) for _, c in groups)
    advantages = torch.randn(num_samples, generator=torch.Generator().manual_seed(1))
    lengths = torch.tensor([len(c) for _, cs in groups for c in cs])
    token_adv = torch.repeat_interleave(advantages, lengths)
    if variant == "packed_row":
        batch = pack_groups(groups, PAD)
        tokens = batch.num_tokens

        def flat_logprobs() -> Tensor:
            return packed_logprobs(model(batch.input_ids, batch.position_ids, batch.attn_mask), batch)

    elif variant == "prefix_cache":
        tokens = sum(len(p) + len(cs) * (max(len(c) for c in cs) - 1) for p, cs in groups)

        def flat_logprobs() -> Tensor:
            flat = []
            for prompt, completions in groups:
                logp, mask = prefix_logprobs(model, prompt, completions, PAD)
                flat.append(logp[mask])
            return torch.cat(flat)

    else:
        rows = [pad_group(prompt, completions, PAD) for prompt, completions in groups]
        width = max(r[0].shape[1] for r in rows)  # groups of unequal widths share one batch

        def cat(i: int) -> Tensor:
            return torch.cat([torch.nn.functional.pad(r[i], (0, width - r[i].shape[1])) for r in rows])

        inputs, targets, mask = cat(0), cat(1), cat(2)
        tokens = inputs.numel()

        def flat_logprobs() -> Tensor:
            return token_logprobs(model(inputs), targets)[mask]

    baseline = _rss_mib()
    times, cpu_times = [], []
    for _ in range(1 + repeats):
        model.zero_grad(set_to_none=True)
        start, cpu_start = time.perf_counter(), time.process_time()
        logp = flat_logprobs()
        (logp * token_adv).sum().backward()
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)
    return {
        "tokens": tokens,
        "time_s": statistics.median(times[1:]),
        "cpu_s": statistics.median(cpu_times[1:]),  # less sensitive to a shared machine
        "peak_rss_mib": _rss_mib(),
        "baseline_rss_mib": baseline,
        "logprobs": logp.detach(),
    }


VARIANTS = ("unpacked", "packed_row", "prefix_cache")
SHARED = VARIANTS[1:]


def bench_packing(
    as_json: bool,
    prompt_len: int = 512,
    response_len: int = 128,
    group_size: int = 8,
    groups: int = 1,
    repeats: int = 3,
) -> int:
    """Print each variant's figures, then (last line) the JSON summary; returns an exit status."""
    work = make_groups(prompt_len, response_len, group_size, groups)
    results: dict[str, dict[str, Any]] = {}
    for variant in VARIANTS:
        spawn = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
            results[variant] = pool.submit(_run_variant, variant, work, repeats).result()
        r = results[variant]
        if not as_json:
            print(
                f"{variant:>12}: tokens {r['tokens']}  time {r['time_s']:.3f}s  cpu {r['cpu_s']:.3f}s  "
                f"peak rss {r['peak_rss_mib']:.0f} MiB (baseline {r['baseline_rss_mib']:.0f})",
                flush=True,
            )
    unpacked = results["unpacked"]

    def ratio(a: float, b: float) -> float:
        return round(a / max(b, 1e-9), 4)

    per_variant: dict[str, Any] = {"unpacked_s": round(unpacked["time_s"], 4)}
    per_variant["unpacked_cpu_s"] = round(unpacked["cpu_s"], 4)
    per_variant["unpacked_peak_rss_mib"] = round(unpacked["peak_rss_mib"], 1)
    for v in SHARED:
        r = results[v]
        per_variant[f"{v}_tokens"] = r["tokens"]
        per_variant[f"{v}_s"] = round(r["time_s"], 4)
        per_variant[f"{v}_cpu_s"] = round(r["cpu_s"], 4)
        per_variant[f"{v}_speedup"] = ratio(unpacked["time_s"], r["time_s"])
        per_variant[f"{v}_cpu_speedup"] = ratio(unpacked["cpu_s"], r["cpu_s"])
        per_variant[f"{v}_peak_rss_mib"] = round(r["peak_rss_mib"], 1)
        per_variant[f"{v}_peak_rss_ratio"] = ratio(unpacked["peak_rss_mib"], r["peak_rss_mib"])
        per_variant[f"{v}_step_rss_ratio"] = ratio(
            unpacked["peak_rss_mib"] - unpacked["baseline_rss_mib"], r["peak_rss_mib"] - r["baseline_rss_mib"]
        )
        per_variant[f"{v}_logprob_max_abs_diff"] = float((unpacked["logprobs"] - r["logprobs"]).abs().max())
    method = min(SHARED, key=lambda v: results[v]["time_s"])
    summary = {
        "prompt_len": prompt_len,
        "response_len": response_len,
        "group_size": group_size,
        "groups": groups,
        "method": method,
        "unpacked_tokens": unpacked["tokens"],
        "packed_tokens": sum(packed_length(p, c) for p, c in work),
        "token_ratio": ratio(unpacked["tokens"], sum(packed_length(p, c) for p, c in work)),
        "speedup": per_variant[f"{method}_speedup"],
        "cpu_speedup": per_variant[f"{method}_cpu_speedup"],
        "peak_rss_ratio": per_variant[f"{method}_peak_rss_ratio"],
        "step_rss_ratio": per_variant[f"{method}_step_rss_ratio"],
        "logprob_max_abs_diff": max(per_variant[f"{v}_logprob_max_abs_diff"] for v in SHARED),
        **per_variant,
        "threads": torch.get_num_threads(),
    }
    print(json.dumps(summary), flush=True)
    return 0
