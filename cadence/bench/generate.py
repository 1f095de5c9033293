"""`cadence bench generate`: the built-in engine's generation speed, eager and compiled, beside
transformers' `generate` and vLLM on the same prompts and token limits.

A case is (model, rows, dtype, new tokens, engine): `rows / 8` prompts of the arithmetic task, eight
samples each (seeded alike for every engine), at temperature 1: every engine stops a sample on eos,
so tokens/s counts the tokens each generated, and engines that draw other samples do other work
(SmolLM2's samples of at most 64 tokens, 32 rows: 865 to 1 325 tokens by the seeds alone). With
``full_length`` no sample stops before its limit (the built-in engine given no eos, transformers'
``min_new_tokens``, vLLM's ``ignore_eos``): every engine computes the same rows and steps, and
tokens/s compares the engines alone. Each case runs in a
process of its own (its peak memory its own, no compiled code shared), the engines of a case one after
another, every other round in reverse order. A case's figures: tokens/s over the timed calls (after one
untimed call, which compiles what the engine compiles), ms a decode step, time to the first token,
peak resident memory (and device memory on a GPU), and the seconds the warm-up took; the built-in
engine's also the identity of its last call's samples (`samples_sha`, tokens and log-probs to the
bit), and the summary line whether the compiled engine drew the eager one's (`compiled_equals_eager`).

Invariant: every engine of a case reads the same prompt ids and makes as many samples a prompt; the
built-in engine's eager and compiled runs are the same engine with its step compiled or not.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

SAMPLES = 8  # a prompt's samples: a group
SMOLLM2 = Path("~/.cache/cadence/smollm2-135m-instruct").expanduser()
ENGINES = ("eager", "compiled", "transformers", "vllm")
TINY_POSITIONS = 512  # the quick start's model made long enough for every token limit


@dataclass(frozen=True)
class Case:
    model: str  # "tiny" or "smollm2"
    rows: int
    dtype: str  # "float32" or "bfloat16"
    new_tokens: int
    engine: str
    device: str = "cpu"
    repeats: int = 2
    threads: int = 0  # torch threads (0: torch's own count)
    full_length: bool = False  # every sample exactly new_tokens long (eos not a stop): equal work


def _prompts(model: str, rows: int) -> tuple[list[list[int]], int, Path | None]:
    """The prompt ids of a case, the eos id, and the checkpoint folder (None: the tiny random model)."""
    from cadence.config import load_config
    from cadence.launch.build import make_tokenizer
    from cadence.tasks.registry import make_task

    config = "configs/smollm2-arithmetic.toml" if model == "smollm2" else "configs/quickstart.toml"
    cfg = load_config(Path(config))
    tokenizer = make_tokenizer(cfg)
    task = make_task(cfg.task, cfg.seed)
    prompts = [tokenizer.encode_prompt(p.text) for p in task.prompts(0, max(1, rows // SAMPLES))]
    return prompts, tokenizer.eos_id, SMOLLM2 if model == "smollm2" else None


def _tiny_folder(folder: Path) -> Path:
    """The quick start's random model saved as a checkpoint (transformers and vLLM read folders)."""
    from cadence.config import load_config
    from cadence.launch.build import make_model, make_tokenizer
    from cadence.model.checkpoint import save_checkpoint

    cfg = load_config(Path("configs/quickstart.toml"))
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, max_position=TINY_POSITIONS))
    save_checkpoint(*make_model(cfg, make_tokenizer(cfg)), folder)
    return folder


def _seeds(prompts: list[list[int]]) -> list[list[int]]:
    from cadence.model.engine import sample_seed

    return [[sample_seed(0, 0, i, j) for j in range(SAMPLES)] for i in range(len(prompts))]


def _builtin(case: Case, prompts: list[list[int]], eos: int, folder: Path) -> dict[str, Any]:
    from cadence.model.checkpoint import load_checkpoint
    from cadence.model.engine import SamplingParams, TorchEngine

    model, _ = load_checkpoint(folder)
    dtype = getattr(torch, case.dtype)
    stop = -1 if case.full_length else eos  # no token is -1: every row decodes to its limit
    engine = TorchEngine(
        model, stop, case.device, dtype=dtype, rows=max(case.rows, 2), compiled=case.engine == "compiled"
    )
    warm = engine.warm_up(max(len(p) for p in prompts) + case.new_tokens)
    params = SamplingParams(max_new_tokens=case.new_tokens, temperature=1.0)
    groups = list(zip(prompts, _seeds(prompts), strict=True))
    engine.generate_many(groups, params)  # untimed: anything left to compile or record
    tokens = steps = 0
    seconds = first = 0.0
    for _ in range(case.repeats):
        begin = time.perf_counter()
        out = engine.generate_many(groups, params)
        _sync(case.device)
        seconds += time.perf_counter() - begin
        tokens += sum(len(c.tokens) for g in out for c in g)
        steps += len(engine.last_call.steps)
        first += engine.last_call.first_token_s
    return {
        "samples_sha": samples_sha([[(c.tokens, c.logprobs) for c in g] for g in out]),
        "tokens": tokens,
        "seconds": seconds,
        "ms_a_step": 1000 * (seconds - first) / max(steps, 1),
        "first_token_s": first / case.repeats,
        "warm_up_s": warm,
        "compiled": engine.runner.compiled,
    }


def samples_sha(samples: list[list[tuple[list[int], list[float]]]]) -> str:
    """The identity of a call's samples, each one's tokens and log-probs to the bit: the built-in
    engine eager and compiled give one, with the same seeds, when they compute the same bits."""
    return hashlib.sha256(json.dumps(samples).encode()).hexdigest()[:16]


def compiled_alike(lines: list[dict[str, Any]]) -> dict[str, bool]:
    """For each (model, rows, dtype, new tokens) run both eager and compiled: whether the two drew the
    same samples to the bit (``samples_sha``)."""
    seen: dict[str, dict[str, str]] = {}
    for line in lines:
        if "samples_sha" in line:
            key = f"{line['model']}/{line['rows']}/{line['dtype']}/{line['new_tokens']}"
            seen.setdefault(key, {})[line["engine"]] = line["samples_sha"]
    return {k: v["eager"] == v["compiled"] for k, v in seen.items() if {"eager", "compiled"} <= v.keys()}


def _transformers(case: Case, prompts: list[list[int]], eos: int, folder: Path) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, case.dtype))
    model = model.to(case.device).eval()  # type: ignore[arg-type]
    width = max(len(p) for p in prompts)
    pad = eos
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=case.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=case.device)

    def run() -> int:
        torch.manual_seed(0)
        with torch.no_grad():
            out = model.generate(
                input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                max_new_tokens=case.new_tokens, num_return_sequences=SAMPLES, eos_token_id=eos,
                pad_token_id=pad, min_new_tokens=case.new_tokens if case.full_length else 0,
            )  # fmt: skip
        new = out[:, width:].tolist()
        if case.full_length:
            return sum(len(row) for row in new)
        return sum(row.index(eos) + 1 if eos in row else len(row) for row in new)

    run()
    tokens, seconds = 0, 0.0
    for _ in range(case.repeats):
        begin = time.perf_counter()
        tokens += run()
        _sync(case.device)
        seconds += time.perf_counter() - begin
    return {"tokens": tokens, "seconds": seconds}


def _vllm(case: Case, prompts: list[list[int]], eos: int, folder: Path) -> dict[str, Any]:
    from vllm import LLM, SamplingParams, TokensPrompt

    llm = LLM(
        model=str(folder),
        dtype=case.dtype,
        seed=0,
        max_model_len=max(len(p) for p in prompts) + case.new_tokens,
    )
    params = SamplingParams(
        n=SAMPLES,
        temperature=1.0,
        top_p=1.0,
        max_tokens=case.new_tokens,
        stop_token_ids=[] if case.full_length else [eos],  # a stop token stops even with ignore_eos
        ignore_eos=case.full_length,
    )
    asked = [TokensPrompt(prompt_token_ids=p) for p in prompts]

    def run() -> int:
        out = llm.generate(asked, params, use_tqdm=False)
        return sum(len(c.token_ids) for r in out for c in r.outputs)

    run()
    tokens, seconds = 0, 0.0
    for _ in range(case.repeats):
        begin = time.perf_counter()
        tokens += run()
        seconds += time.perf_counter() - begin
    return {"tokens": tokens, "seconds": seconds}


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def run_case(case: Case) -> dict[str, Any]:
    """One case's figures, in this process."""
    torch.manual_seed(0)
    if case.threads:
        torch.set_num_threads(case.threads)
    prompts, eos, folder = _prompts(case.model, case.rows)
    with tempfile.TemporaryDirectory(prefix="cadence-bench-") as tmp:
        folder = folder or _tiny_folder(Path(tmp))
        runner = {"transformers": _transformers, "vllm": _vllm}.get(case.engine, _builtin)
        figures = runner(case, prompts, eos, folder)
    figures["tokens_per_s"] = figures["tokens"] / figures["seconds"]
    figures["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if case.device == "cuda":
        figures["peak_device_mib"] = torch.cuda.max_memory_allocated() / 2**20
    return asdict(case) | {"prompts": len(prompts), "samples": SAMPLES} | figures


def _python(engine: str) -> str | None:
    """The Python a case runs in: vLLM's own environment for vLLM (None where there is none)."""
    if engine != "vllm":
        return sys.executable
    here = Path(".venv-vllm/bin/python")
    return str(here) if here.exists() else None


def bench_generate(
    as_json: bool,
    models: list[str],
    rows: list[int],
    dtypes: list[str],
    new_tokens: list[int],
    engines: list[str],
    device: str,
    repeats: int,
    threads: int = 0,
    full_length: bool = False,
) -> int:
    """Every case in a process of its own, the engines of a (model, rows, dtype, tokens) alternated:
    one JSON line a case (a case that could not run: its error)."""
    lines: list[dict[str, Any]] = []
    load = os.getloadavg()
    for model in models:
        for n in rows:
            for dtype in dtypes:
                for tokens in new_tokens:
                    order = engines if len(lines) // max(len(engines), 1) % 2 == 0 else engines[::-1]
                    for engine in order:
                        case = Case(model, n, dtype, tokens, engine, device, repeats, threads, full_length)
                        line = _run_apart(case)
                        lines.append(line)
                        print(json.dumps(line), flush=True)
    if as_json:
        print(
            json.dumps(
                {
                    "cases": len(lines),
                    "compiled_equals_eager": compiled_alike(lines),
                    "load_average_before": load,
                    "load_average_after": os.getloadavg(),
                }
            )
        )
    return 0


def _run_apart(case: Case) -> dict[str, Any]:
    python = _python(case.engine)
    if python is None:
        return asdict(case) | {"skipped": "no .venv-vllm (make vllm)"}
    done = subprocess.run(
        [python, "-m", "cadence.bench.generate", json.dumps(asdict(case))],
        capture_output=True,
        text=True,
        check=False,
    )
    for text in reversed(done.stdout.splitlines()):
        if text.startswith("{"):
            return dict(json.loads(text))
    return asdict(case) | {"error": (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]}


if __name__ == "__main__":
    print(json.dumps(run_case(Case(**json.loads(sys.argv[1])))), flush=True)
