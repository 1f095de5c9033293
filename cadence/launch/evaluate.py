"""`cadence eval`: a saved checkpoint on the run's eval set, with the code a run's eval rounds use.

The same eval set (`cadence.tasks.heldout`), tokenizer, sampling settings (`eval.greedy`, `eval.k`,
`eval.temperature`, `rollout.max_new_tokens`, `rollout.top_p`), sample seeds
`sample_seed(seed, version, prompt id, i)`, reward functions (`cadence.rewards.scorer`) and figures
(`cadence.monitor.evaluation.eval_figures`) as the rollout workers and the dispatcher. With
`environment.name` each sample is a whole episode, played by the workers' episode runner
(`cadence.actors.episodes.Episodes.run`) within the `[environment]` bounds and scored by the environment; the
episode figures (`eval_turns_mean`, `eval_tool_calls`, ..., `eval_ended_<ending>`) are added.

Invariant: with the run's config, the final checkpoint and `version = periods`, the figures equal the
run's last `eval.jsonl` row (exactly when greedy; sampled ones up to the engine's batch invariance).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from cadence.actors.episodes import EngineGenerate, Episodes
from cadence.actors.groups import GroupSamples
from cadence.config import RunConfig
from cadence.launch.build import make_episodes, make_tokenizer
from cadence.launch.threads import rollout_threads, use_threads
from cadence.model.checkpoint import load_checkpoint
from cadence.model.engine import SamplingParams, TorchEngine, sample_seed
from cadence.model.rollout_engine import TorchRolloutEngine
from cadence.model.tokenizer import TextTokenizer
from cadence.monitor.evaluation import eval_episodes, eval_figures
from cadence.rewards.scorer import make_scorer
from cadence.tasks.base import Prompt
from cadence.tasks.heldout import eval_prompts, held_out
from cadence.tasks.registry import make_task

Scored = list[tuple[list[float], list[float]]]  # (rewards, correct) a prompt


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
    episodes = make_episodes(cfg, tokenizer)  # a name that does not load: refused before the model loads
    use_threads(rollout_threads(cfg))
    model = load_checkpoint(checkpoint)[0].eval()
    engine = TorchEngine(model, tokenizer.eos_id)
    e, r = cfg.eval, cfg.rollout
    params = SamplingParams(r.max_new_tokens, 0.0 if e.greedy else e.temperature, r.top_p)
    n = 1 if e.greedy else e.k
    seeds = [[sample_seed(cfg.seed, version, p.prompt_id, i) for i in range(n)] for p in prompts]
    extra: dict[str, Any] = {}
    if episodes is None:
        scored = _complete(cfg, engine, params, tokenizer, prompts, seeds)
    else:
        turns = TorchRolloutEngine(engine, params)
        scored, extra = _episodes(episodes, turns, tokenizer, prompts, seeds, r.inflight)
    return {"checkpoint": str(checkpoint), "version": version, **eval_figures(scored, n), **extra}


def _complete(
    cfg: RunConfig,
    engine: TorchEngine,
    params: SamplingParams,
    tokenizer: TextTokenizer,
    prompts: list[Prompt],
    seeds: list[list[int]],
) -> Scored:
    """One completion a sample, scored by the run's reward functions."""
    groups = [(tokenizer.encode_prompt(p.text), s) for p, s in zip(prompts, seeds, strict=True)]
    completions = []
    batch = cfg.rollout.inflight
    for start in range(0, len(groups), batch):  # batches of a worker's size
        completions.extend(engine.generate_many(groups[start : start + batch], params))
    scorer = make_scorer(cfg, make_task(cfg.task, cfg.seed))

    async def score_all() -> Scored:
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

    return asyncio.run(score_all())


def _episodes(
    episodes: Episodes,
    engine: TorchRolloutEngine,
    tokenizer: TextTokenizer,
    prompts: list[Prompt],
    seeds: list[list[int]],
    batch: int,
) -> tuple[Scored, dict[str, Any]]:
    """One episode a sample, a batch's episodes run together as a worker runs them (at the engine's
    sampling settings, the eval ones), scored by the environment; with the episode figures."""
    generate = EngineGenerate(engine, engine.params.temperature)
    groups = [(p, s, tokenizer.encode_prompt(p.text)) for p, s in zip(prompts, seeds, strict=True)]

    async def play_all() -> list[GroupSamples]:
        made: list[GroupSamples] = []
        for start in range(0, len(groups), batch):  # batches of a worker's size
            made.extend(await episodes.run(generate, groups[start : start + batch], tokenizer.eos_id))
        return made

    made = asyncio.run(play_all())
    scored = [([s.reward for s in g.scores], [s.correct for s in g.scores]) for g in made]
    return scored, eval_episodes([g.episodes for g in made if g.episodes is not None])
