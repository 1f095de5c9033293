"""`cadence eval`: a saved checkpoint on the run's eval set, with the code a run's eval rounds use.

The same eval set (`cadence.tasks.heldout`), tokenizer, sampling settings (`eval.greedy`, `eval.k`,
`eval.temperature`, `rollout.max_new_tokens`, `rollout.top_p`), sample seeds
`sample_seed(seed, version, prompt id, i)`, reward functions (`cadence.rewards.scorer`) and figures
(`cadence.monitor.evaluation.eval_figures`) as the rollout workers and the dispatcher.

Invariant: with the run's config, the final checkpoint and `version = periods`, the figures equal the
run's last `eval.jsonl` row (exactly when greedy; sampled ones up to the engine's batch invariance).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from cadence.config import RunConfig
from cadence.launch.build import make_tokenizer
from cadence.launch.threads import rollout_threads, use_threads
from cadence.model.checkpoint import load_checkpoint
from cadence.model.engine import SamplingParams, TorchEngine, sample_seed
from cadence.monitor.evaluation import eval_figures
from cadence.rewards.scorer import make_scorer
from cadence.tasks.heldout import eval_prompts, held_out
from cadence.tasks.registry import make_task


def evaluate_checkpoint(cfg: RunConfig, checkpoint: Path, version: int) -> dict[str, Any]:
    """The eval figures of the weights in `checkpoint` (a Hugging Face folder), seeded as version
    `version` of the run of `cfg`."""
    if not (checkpoint / "config.json").is_file():
        raise ValueError(f"{checkpoint}: no checkpoint folder (no config.json)")
    task = make_task(cfg.task, cfg.seed, held_out(cfg.task, cfg.eval))
    prompts = eval_prompts(cfg.task, cfg.eval, task)
    if not prompts:
        raise ValueError("the eval set is empty: set eval.prompts (or eval.path)")
    tokenizer = make_tokenizer(cfg)
    use_threads(rollout_threads(cfg))
    model = load_checkpoint(checkpoint)[0].eval()
    engine = TorchEngine(model, tokenizer.eos_id)
    e, r = cfg.eval, cfg.rollout
    params = SamplingParams(r.max_new_tokens, 0.0 if e.greedy else e.temperature, r.top_p)
    n = 1 if e.greedy else e.k
    groups = [
        (tokenizer.encode_prompt(p.text), [sample_seed(cfg.seed, version, p.prompt_id, i) for i in range(n)])
        for p in prompts
    ]
    completions = []
    for start in range(0, len(groups), r.inflight):  # batches of a worker's size
        completions.extend(engine.generate_many(groups[start : start + r.inflight], params))
    scorer = make_scorer(cfg, make_task(cfg.task, cfg.seed))

    async def score_all() -> list[tuple[list[float], list[float]]]:
        out = []
        for prompt, group in zip(prompts, completions, strict=True):
            scores = [
                await scorer.score(
                    prompt.text,
                    tokenizer.decode_response(c.tokens),
                    prompt.answer,
                    c.finished,
                    prompt.prompt_id,
                )
                for c in group
            ]
            out.append(([s.reward for s in scores], [s.correct for s in scores]))
        return out

    figures = eval_figures(asyncio.run(score_all()), n)
    return {"checkpoint": str(checkpoint), "version": version, **figures}
