"""`cadence eval`: a saved checkpoint on the run's eval set, with the code a run's eval rounds use.

The same eval set (`cadence.tasks.heldout`), tokenizer, sampling settings (`eval.greedy`, `eval.k`,
`eval.temperature`, `rollout.max_new_tokens`, `rollout.top_p`), sample seeds
`sample_seed(seed, version, prompt id, i)`, reward functions (`cadence.rewards.scorer`), engine
(`launch/build.py` `make_torch_engine`), group maker (`cadence.rollout.maker.GroupMaker`) and figures
(`cadence.monitor.evaluation.eval_figures`) as the rollout workers and the dispatcher. With
`environment.name` each sample is a whole episode, played as the workers play it within the
`[environment]` bounds and scored by the environment; the episode figures (`eval_turns_mean`,
`eval_tool_calls`, ..., `eval_ended_<ending>`) are added.

Invariant: with the run's config, the final checkpoint and `version = periods`, the figures equal the
run's last `eval.jsonl` row (exactly when greedy; sampled ones up to the engine's batch invariance).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from cadence.config import RunConfig
from cadence.launch.build import (
    make_episodes,
    make_group_maker,
    make_model,
    make_tokenizer,
    make_torch_engine,
)
from cadence.launch.threads import rollout_threads, use_threads
from cadence.model.checkpoint import load_checkpoint
from cadence.model.hf_state import hf_state_dict, load_hf_state_dict
from cadence.model.tokenizer import TextTokenizer
from cadence.model.transformer import Transformer
from cadence.monitor.evaluation import eval_episodes, eval_figures
from cadence.rollout.results import GroupSamples
from cadence.tasks.heldout import eval_prompts, held_out
from cadence.tasks.registry import make_task


def evaluate_checkpoint(cfg: RunConfig, checkpoint: Path, version: int) -> dict[str, Any]:
    """The eval figures of the weights in `checkpoint` (a Hugging Face folder), seeded as version
    `version` of the run of `cfg`: its eval prompts made into groups in batches of a worker's size
    (`rollout.inflight`) by the maker a worker makes them with (`cadence/rollout/`)."""
    adapters = (checkpoint / "adapter_config.json").is_file()  # a LoRA run's final folder
    if not adapters and not (checkpoint / "config.json").is_file():
        raise ValueError(f"{checkpoint}: no checkpoint folder (no config.json, no adapter_config.json)")
    task = make_task(cfg.task, cfg.seed, held_out(cfg.task, cfg.eval))
    prompts = eval_prompts(cfg.task, cfg.eval, task)
    if not prompts:
        raise ValueError("the eval set is empty: set eval.prompts (or eval.path)")
    tokenizer = make_tokenizer(cfg)
    episodes = make_episodes(cfg, tokenizer)  # a name that does not load: refused before the model loads
    use_threads(rollout_threads(cfg))
    engine = make_torch_engine(
        cfg,
        tokenizer,
        merged_model(cfg, tokenizer, checkpoint) if adapters else load_checkpoint(checkpoint)[0],
    )
    maker = make_group_maker(cfg, tokenizer, engine, episodes)
    n = 1 if cfg.eval.greedy else cfg.eval.k
    batch = cfg.rollout.inflight

    async def make_all() -> list[GroupSamples]:
        made: list[GroupSamples] = []
        for start in range(0, len(prompts), batch):  # batches of a worker's size
            groups = await maker.make(prompts[start : start + batch], version, n, evaluation=True)
            made.extend(g for g in groups if g is not None)  # none is stopped here
        return made

    made = asyncio.run(make_all())
    scored = [([s.reward for s in g.scores], [s.correct for s in g.scores]) for g in made]
    extra = eval_episodes([g.episodes for g in made])
    return {"checkpoint": str(checkpoint), "version": version, **eval_figures(scored, n), **extra}


def merged_model(cfg: RunConfig, tokenizer: TextTokenizer, folder: Path) -> Transformer:
    """The run's base model (`model.checkpoint`, or its random init) with the adapters of the PEFT
    folder `folder` merged in."""
    from cadence.model.lora import merge_adapters
    from cadence.model.lora_files import read_peft

    adapters, spec, _ = read_peft(folder)
    model, _ = make_model(cfg, tokenizer)
    load_hf_state_dict(model, merge_adapters(hf_state_dict(model), adapters, spec.scale))
    return model
