"""`cadence bench learner`: the learner's forward + backward of one packed micro-batch of SmolLM2-135M's
shape (its width, heads, vocabulary; `layers` of its 30 blocks) at several token budgets, two ways:

- `dense`: the row attended through its dense [T, T] bool mask, the head's float32 logits [N, V]
  whole (the reference path);
- `blocks`: the row attended by blocks (ops/block_attention.py), the log-probs read a chunk of
  tokens at a time (ops/logprobs.py `head_logprobs`).
- `recompute`: `blocks` with each transformer block computed again in the backward
  (`trainer.activation_checkpointing`): only the blocks' inputs are kept through the forward.

On a GPU (`device`) the memory is the device's peak allocation, on the CPU the process's peak
resident set.

Invariant: all run the same model, groups (prompts of 65 tokens, 8 responses of 56: 512 packed
tokens a group, as many groups as fit the budget) and advantages, each in a fresh spawned process,
so each peak RSS is its own; time is the median of `repeats` after one warm-up step (the warm-up's with none); the largest
|dlogp| of each against `dense` is printed with them, and a variant whose process dies (out of memory)
is reported as such.
"""

from __future__ import annotations

import json
import multiprocessing
import random
import resource
import statistics
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import torch

from cadence.model.config import ModelConfig
from cadence.model.transformer import init_model
from cadence.ops.logprobs import logprob_reader, token_logprobs
from cadence.ops.packing import Group, pack_groups

PAD = 0
PROMPT, RESPONSE, GROUP = 65, 56, 8  # 64 + 8 x 56 = 512 packed tokens a group
VARIANTS = ("dense", "blocks", "recompute")


def smollm2(layers: int) -> ModelConfig:
    """SmolLM2-135M's shape with `layers` blocks."""
    return ModelConfig(
        vocab_size=49152,
        hidden_size=576,
        num_layers=layers,
        num_heads=9,
        num_kv_heads=3,
        intermediate_size=1536,
        max_position=2048,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
    )


def make_groups(tokens: int, vocab: int) -> list[Group]:
    rng = random.Random(tokens)

    def ids(n: int) -> list[int]:
        return [rng.randrange(1, vocab) for _ in range(n)]

    per_group = PROMPT - 1 + GROUP * RESPONSE
    return [(ids(PROMPT), [ids(RESPONSE) for _ in range(GROUP)]) for _ in range(max(tokens // per_group, 1))]


def _rss_mib() -> float:
    scale = 1024 * 1024 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**20


def _memory_mib(device: torch.device) -> float:
    """The process's peak resident memory on the CPU; the device's peak allocation on a GPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) / 2**20
    return _rss_mib()


def _run(variant: str, tokens: int, layers: int, repeats: int, device: str = "cpu") -> dict[str, Any]:
    """`1 + repeats` forward + backward steps of one variant (in a child process)."""
    dev = torch.device(device)
    cfg = smollm2(layers)
    model = init_model(cfg, seed=0).to(dev)
    model.recompute_blocks(variant == "recompute")
    batch = pack_groups(make_groups(tokens, cfg.vocab_size), PAD)
    ids, positions, read_at = batch.input_ids.to(dev), batch.position_ids.to(dev), batch.loss_mask.to(dev)
    targets = batch.targets[batch.loss_mask].to(dev)
    advantages = torch.randn(targets.numel(), generator=torch.Generator().manual_seed(1)).to(dev)
    dense = batch.attn_mask.to(dev) if variant == "dense" else None
    baseline = _memory_mib(dev)
    times = []
    for _ in range(1 + repeats):
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        if dense is not None:
            logits = model(ids, positions, dense, logits_at=read_at)
            logp = token_logprobs(logits, targets)
            del logits
        else:
            logp = model(ids, positions, batch.segments, logits_at=read_at, head=logprob_reader(targets))
        (logp * advantages).sum().backward()
        _memory_mib(dev)  # a GPU's work finished before the clock is read
        times.append(time.perf_counter() - start)
    return {
        "tokens": batch.num_tokens,
        "time_s": statistics.median(times[1:] or times),  # no repeats: the warm-up step's
        "peak_mib": _memory_mib(dev),
        "baseline_mib": baseline,
        "logprobs": logp.detach().cpu(),
    }


def _variant(variant: str, budget: int, layers: int, repeats: int, device: str) -> dict[str, Any]:
    """One variant's figures from a fresh process; a process that dies (out of memory) is reported."""
    spawn = multiprocessing.get_context("spawn")
    try:
        with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
            result: dict[str, Any] = pool.submit(_run, variant, budget, layers, repeats, device).result()
            return result
    except BrokenProcessPool as err:
        return {"error": f"the process died ({err}): out of memory?"}


def _compare(budget: int, results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A budget's row: each variant's time and memory, and each against dense (the reference)."""
    row: dict[str, Any] = {"budget": budget}
    dense = results.get("dense", {})
    for name, r in results.items():
        if "error" in r:
            row[f"{name}_error"] = r["error"]
            continue
        row["tokens"] = r["tokens"]
        row[f"{name}_s"] = round(r["time_s"], 3)
        row[f"{name}_peak_mib"] = round(r["peak_mib"], 1)
        row[f"{name}_step_mib"] = round(r["peak_mib"] - r["baseline_mib"], 1)
        if name == "dense" or "error" in dense or not dense:
            continue
        row[f"{name}_speedup"] = round(dense["time_s"] / max(r["time_s"], 1e-9), 3)
        row[f"{name}_peak_ratio"] = round(r["peak_mib"] / max(dense["peak_mib"], 1e-9), 4)
        row[f"{name}_logprob_max_abs_diff"] = float((dense["logprobs"] - r["logprobs"]).abs().max())
    return row


def bench_learner(
    as_json: bool,
    budgets: Sequence[int],
    layers: int = 2,
    repeats: int = 2,
    variants: Sequence[str] = ("dense", "blocks"),
    device: str = "cpu",
) -> int:
    """Print each variant's figures at each budget, then (last line) the JSON summary."""
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or not variants:
        raise ValueError(f"--variants must name some of {list(VARIANTS)}, got {list(variants)}")
    rows: list[dict[str, Any]] = []
    for budget in budgets:
        results: dict[str, dict[str, Any]] = {}
        for variant in variants:
            results[variant] = r = _variant(variant, budget, layers, repeats, device)
            if not as_json:
                figures = r.get("error") or (
                    f"tokens {r['tokens']}  time {r['time_s']:.3f}s  peak {r['peak_mib']:.0f} MiB"
                    f" (baseline {r['baseline_mib']:.0f})"
                )
                print(f"{budget:>6} {variant:>9}: {figures}", flush=True)
        rows.append(_compare(budget, results))
    summary = {
        "model": "SmolLM2-135M shape",
        "layers": layers,
        "threads": torch.get_num_threads(),
        "device": device,
        "memory": "device peak allocated" if device.startswith("cuda") else "peak resident (ru_maxrss)",
        "rows": rows,
    }
    print(json.dumps(summary), flush=True)
    return 0
