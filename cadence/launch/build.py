"""The composition root: turns a `RunConfig` into the tokenizer, model, engine and learner.

Invariant: every process of a run builds the same tokenizer and model shape from the same config,
so weights published by the trainer always fit every worker's engine.
"""

from __future__ import annotations

import json
import string
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from cadence.config import ConfigError, RunConfig
from cadence.config.checks import engine_log_probs_at_the_temperature
from cadence.launch.threads import rollout_threads, trainer_threads, use_threads
from cadence.model.checkpoint import load_checkpoint, save_checkpoint
from cadence.model.compiled_step import wants_compile
from cadence.model.config import ModelConfig
from cadence.model.devices import open_device
from cadence.model.engine import SamplingParams, TorchEngine, prompt_trunk
from cadence.model.lora import LoraSpec
from cadence.model.rollout_engine import RolloutEngine, TorchRolloutEngine
from cadence.model.slots import auto_rows
from cadence.model.tokenizer import CharTokenizer, TextTokenizer
from cadence.model.transformer import Transformer, init_model
from cadence.ops.correction import CorrectionRule
from cadence.rewards.scorer import make_scorer
from cadence.rollout.maker import GroupMaker
from cadence.rollout.play import Episodes
from cadence.tasks.base import Task
from cadence.tasks.environments.bounds import Bounds
from cadence.tasks.environments.loading import load_environment
from cadence.tasks.registry import make_task, task_alphabet
from cadence.training.learner import Learner, TorchLearner
from cadence.training.ranks import Ranks
from cadence.training.simulated import SimulatedEngine, SimulatedLearner

if TYPE_CHECKING:
    from cadence.rollout.agent.episodes import Agent, AgentEpisodes
    from cadence.training.collectives import Collectives


def make_tokenizer(cfg: RunConfig, task: Task | None = None) -> TextTokenizer:
    """The checkpoint's tokenizer, else a char tokenizer of the task's alphabet (`task`'s where given,
    else read from the config without building the task), a held-out file's characters and, with an
    environment, printable ASCII."""
    if cfg.model.checkpoint:
        from cadence.model.hf_tokenizer import open_tokenizer

        return open_tokenizer(Path(cfg.model.checkpoint).expanduser())
    alphabet = task.alphabet if task is not None else task_alphabet(cfg.task, cfg.seed)
    if cfg.eval.path:  # a held-out file's characters too, after the task's (whose ids stay the same)
        from cadence.tasks.heldout import eval_file_records

        extra = {c for text, answer in eval_file_records(cfg.task, cfg.eval) for c in text + answer}
        alphabet += "".join(sorted(extra - set(alphabet)))
    if cfg.environment.played:  # an environment writes text of its own: printable ASCII, after the rest
        alphabet += "".join(c for c in string.printable if c not in alphabet and c not in "\t\r\x0b\x0c")
    return CharTokenizer(alphabet)


def make_model(cfg: RunConfig, tokenizer: TextTokenizer) -> tuple[Transformer, ModelConfig]:
    """The checkpoint's model when the config names one, else a random one of the config's shape."""
    if cfg.model.checkpoint:
        return load_checkpoint(Path(cfg.model.checkpoint).expanduser())
    model_cfg = make_model_config(cfg, tokenizer)
    return init_model(model_cfg, cfg.model.init_seed), model_cfg


def checkpoint_config(cfg: RunConfig) -> dict[str, Any]:
    """The `config.json` of `model.checkpoint`."""
    config: dict[str, Any] = json.loads((Path(cfg.model.checkpoint).expanduser() / "config.json").read_text())
    return config


def model_positions(cfg: RunConfig) -> int:
    """The positions of the run's model: its checkpoint's, else `model.max_position`."""
    if cfg.model.checkpoint:
        return int(checkpoint_config(cfg).get("max_position_embeddings", 2048))
    return cfg.model.max_position


def load_agent(target: str) -> Agent:
    """The agent `environment.agent` names; `ConfigError` naming the key when it does not load."""
    from cadence.config.targets import load_callable

    if not all(target.partition(":")[::2]):
        raise ConfigError(f"environment.agent: {target!r} is not 'package.module:function'")
    return cast("Agent", load_callable(target, "environment.agent", target, "an async agent function"))


def make_episodes(cfg: RunConfig, tokenizer: TextTokenizer) -> Episodes | AgentEpisodes | None:
    """What a worker runs its samples as episodes with (`environment.name`, or `environment.agent`:
    agent episodes), or None (single-turn).
    `ConfigError` naming the key for a name that does not load, a token budget that leaves the first
    message no room in the model's positions, a chat template whose turns cannot be appended."""
    from cadence.model.turns import ChatTurns

    e = cfg.environment
    if not e.played:
        return None
    positions = model_positions(cfg)
    if e.max_tokens >= positions:
        raise ConfigError(
            f"environment.max_tokens = {e.max_tokens} leaves the first message no room in the model's"
            f" {positions} positions: lower it"
        )
    bounds = Bounds(
        e.max_turns,
        e.max_tokens,
        e.max_turn_tokens,
        e.step_timeout_s,
        e.episode_timeout_s,
        e.on_error,
        e.max_message_chars,
    )
    if e.agent:
        try:
            from cadence.rollout.agent.episodes import AgentEpisodes
        except ImportError as err:
            raise ConfigError(
                f"environment.agent = {e.agent!r} needs the agents extra ({err}): pip install 'cadence[agents]'"
            ) from None

        from cadence.rollout.agent.sampling import Sampling

        agent = load_agent(e.agent)
        sampling = Sampling(cfg.rollout.temperature, cfg.rollout.top_p, e.agent_sampling)
        return AgentEpisodes(
            e.agent,
            agent,
            tokenizer,
            bounds,
            e.served_model,
            e.max_choices,
            e.role,
            sampling=sampling,
            listen=e.agent_listen,
        )
    factory = load_environment(e.name, kwargs=e.kwargs)
    try:
        codec = ChatTurns(tokenizer, e.role)
    except ValueError as err:
        raise ConfigError(f"environment.name = {e.name!r}: {err}") from None
    return Episodes(e.name, factory, codec, bounds)


def vocab_limit(cfg: RunConfig, tokenizer: TextTokenizer) -> int:
    """How many token ids a group may use: the model's embedding rows (at least the tokenizer's)."""
    if cfg.model.checkpoint:
        rows = int(checkpoint_config(cfg).get("vocab_size") or 0)
    else:
        rows = make_model_config(cfg, tokenizer).vocab_size
    return max(rows, tokenizer.vocab_size)


def make_model_config(cfg: RunConfig, tokenizer: TextTokenizer) -> ModelConfig:
    m = cfg.model
    return ModelConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=m.hidden_size,
        num_layers=m.num_layers,
        num_heads=m.num_heads,
        num_kv_heads=m.num_kv_heads,
        intermediate_size=m.intermediate_size,
        max_position=m.max_position,
    )


def make_group_maker(
    cfg: RunConfig,
    tokenizer: TextTokenizer,
    engine: RolloutEngine,
    episodes: Episodes | AgentEpisodes | None,
    task: Task | None = None,
) -> GroupMaker:
    """What makes a worker's (or `cadence eval`'s) groups on `engine`: the run's reward functions (with
    the training task's own check: `task`, built here when not given) and seed, the eval temperature
    (0: greedy), and `episodes` (`make_episodes`) for an environment."""
    temperature = 0.0 if cfg.eval.greedy else cfg.eval.temperature
    scorer = make_scorer(cfg, task if task is not None else make_task(cfg.task, cfg.seed))
    return GroupMaker(engine, tokenizer, scorer, cfg.seed, temperature, episodes)


def sampling_params(cfg: RunConfig) -> SamplingParams:
    """The rollout engine's own sampling settings (an eval batch overrides the temperature)."""
    r = cfg.rollout
    return SamplingParams(max_new_tokens=r.max_new_tokens, temperature=r.temperature, top_p=r.top_p)


def make_engine(cfg: RunConfig, tokenizer: TextTokenizer) -> RolloutEngine:
    if cfg.rollout.engine == "simulated":
        digits = tokenizer.encode("0123456789")
        return SimulatedEngine(cfg.simulated, tokenizer.eos_id, digits, cfg.rollout.max_new_tokens)
    use_threads(rollout_threads(cfg))
    if cfg.rollout.engine == "vllm":
        return make_vllm_engine(cfg, tokenizer, sampling_params(cfg))
    model, model_cfg = make_model(cfg, tokenizer)
    engine = make_torch_engine(cfg, tokenizer, model)
    spec = lora_spec(cfg)
    if spec is None:
        return engine
    from cadence.model.lora_engine import LoraRolloutEngine

    return LoraRolloutEngine(engine, spec, base_identity(cfg, model_cfg), cfg.trainer.lora.apply)


def make_torch_engine(cfg: RunConfig, tokenizer: TextTokenizer, model: Transformer) -> TorchRolloutEngine:
    """The built-in engine on `model`, on `rollout.device` in `rollout.dtype`, the chat template's
    beginning prefilled once a version."""
    r = cfg.rollout
    dtype = getattr(torch, r.dtype)
    device = str(open_device(r.device, 0, "rollout.device", "a rollout worker"))
    compiled = wants_compile(r.compile, torch.device(device))
    rows = r.engine_rows or auto_rows(model.cfg, torch.device(device), dtype)
    engine = TorchEngine(
        model.eval(),
        tokenizer.eos_id,
        device,
        trunk=prompt_trunk(tokenizer),
        dtype=dtype,
        rows=rows,
        compiled=compiled,
        invariant=r.batch_invariant,
    )
    engine.warm_up(prompt_positions(cfg, model.cfg.max_position))
    return TorchRolloutEngine(engine, sampling_params(cfg))


def prompt_positions(cfg: RunConfig, max_position: int) -> int:
    """The positions a row of the engine's cache is first made with: the run's token limit and room
    for a prompt of a few hundred tokens (a longer call makes it longer)."""
    return min(max_position, cfg.rollout.max_new_tokens + 256)


def make_vllm_engine(cfg: RunConfig, tokenizer: TextTokenizer, params: SamplingParams) -> RolloutEngine:
    """vLLM serving the config's checkpoint, or the config's random model written to a folder it reads
    at start (and never again: later versions are loaded from memory)."""
    from cadence.model.vllm_engine import VllmEngine  # only a vLLM worker imports vLLM

    def engine(folder: Path, model_cfg: ModelConfig | None = None) -> RolloutEngine:
        spec = lora_spec(cfg)
        if spec is None:
            return VllmEngine(folder, tokenizer.eos_id, params, cfg.vllm, cfg.seed)
        from cadence.model.vllm_lora import VllmLoraEngine

        base = base_identity(cfg, model_cfg)
        return VllmLoraEngine(folder, tokenizer.eos_id, params, cfg.vllm, cfg.seed, spec, base)

    if cfg.model.checkpoint:
        return engine(Path(cfg.model.checkpoint).expanduser())
    with tempfile.TemporaryDirectory(prefix="cadence-vllm-") as tmp:
        model, model_cfg = make_model(cfg, tokenizer)
        save_checkpoint(model, model_cfg, Path(tmp))
        return engine(Path(tmp), model_cfg)


def make_learner(cfg: RunConfig, tokenizer: TextTokenizer, ranks: Ranks | None = None) -> Learner:
    """The trainer's learner; with several `ranks` (rank 0's view) one that commands the followers."""
    if cfg.trainer.learner == "simulated":
        return SimulatedLearner(cfg.simulated)
    ranks = ranks or Ranks()
    if ranks.world == 1:
        from cadence.training.collectives import local_device

        return make_torch_learner(cfg, tokenizer, local_device(cfg.trainer, ranks))
    from cadence.training.parallel import DistributedLearner

    comm, local = join_ranks(cfg, tokenizer, ranks)
    return DistributedLearner(local, comm)


def join_ranks(cfg: RunConfig, tokenizer: TextTokenizer, ranks: Ranks) -> tuple[Collectives, TorchLearner]:
    """Join the process group of the trainer's ranks; the collectives and this rank's own learner."""
    from cadence.training.collectives import Collectives, local_device

    device = local_device(cfg.trainer, ranks)
    comm = Collectives(cfg.trainer, ranks, device)
    return comm, make_torch_learner(cfg, tokenizer, device, comm)


def correction_rule(cfg: RunConfig) -> CorrectionRule:
    """`[trainer.rollout_correction]` as the learner applies it (ops/correction.py)."""
    c = cfg.trainer.rollout_correction
    return CorrectionRule(c.mode, c.level, c.cap, c.low, c.high)


def make_torch_learner(
    cfg: RunConfig, tokenizer: TextTokenizer, device: torch.device, comm: Collectives | None = None
) -> TorchLearner:
    """This rank's learner; with `trainer.sharding = "fsdp2"` one whose policy is split over `comm`.
    Its log-probs are at the sampling temperature; gspo clips with its own range."""
    use_threads(trainer_threads(cfg))
    model, model_cfg = make_model(cfg, tokenizer)
    t = cfg.trainer
    clip = t.gspo if t.objective == "gspo" else t
    settings: dict[str, Any] = dict(
        lr=t.lr,
        weight_decay=t.weight_decay,
        clip_low=clip.clip_low,
        clip_high=clip.clip_high,
        kl_beta=t.kl_beta,
        max_grad_norm=t.max_grad_norm,
        packing=t.packing,
        device=device,
        objective=t.objective,
        temperature=cfg.rollout.temperature,
        precision=t.precision,
        recompute=t.activation_checkpointing,
        correction=correction_rule(cfg),
        # the gap is measured where the engine's log-probs are of the tempered distribution
        mismatch_bound=t.mismatch.bound if engine_log_probs_at_the_temperature(cfg) else None,
    )
    if t.sharding == "fsdp2" and comm is not None:
        from cadence.training.sharding import ShardedLearner

        return ShardedLearner(comm, model, model_cfg, tokenizer, **settings)
    spec = lora_spec(cfg)
    if spec is not None:
        from cadence.training.lora_learner import LoraLearner

        path = str(Path(cfg.model.checkpoint).expanduser().resolve()) if cfg.model.checkpoint else None
        base = base_identity(cfg, model_cfg)
        return LoraLearner(
            model,
            model_cfg,
            tokenizer,
            lora=spec,
            seed=cfg.seed,
            base=base,
            base_path=path,
            base_dtype=t.lora.base_dtype,
            **settings,
        )
    return TorchLearner(model, model_cfg, tokenizer, **settings)


def lora_spec(cfg: RunConfig) -> LoraSpec | None:
    """`[trainer.lora]` as the learner and the engines apply it; None without adapters (rank 0)."""
    lora = cfg.trainer.lora
    if lora.rank == 0:
        return None
    return LoraSpec(lora.rank, lora.alpha, lora.dropout, tuple(lora.targets))


def base_identity(cfg: RunConfig, model_cfg: ModelConfig | None) -> str:
    """What identifies the model adapters apply to: `model.checkpoint`'s files, or the random model's
    config (`model_cfg`, given without a checkpoint) and `model.init_seed` (model/lora_files.py)."""
    from cadence.model.lora_files import checkpoint_identity, init_identity

    if cfg.model.checkpoint:
        return checkpoint_identity(Path(cfg.model.checkpoint).expanduser())
    if model_cfg is None:
        raise ValueError("a random base's identity needs its model config")
    return init_identity(model_cfg, cfg.model.init_seed)


def version_figures(cfg: RunConfig) -> tuple[int, int]:
    """The parameters the optimizer moves and the bytes of a published version (without the small
    header), counted on a model without storage: every weight in the publish dtype, or the adapters."""
    from cadence.launch.settings import publish_dtype
    from cadence.model.hf_state import hf_state_dict
    from cadence.model.lora import adapter_tensors, apply_lora, trainable_count

    if cfg.model.checkpoint:
        model_cfg = ModelConfig.from_hf_dict(checkpoint_config(cfg))
    else:
        model_cfg = make_model_config(cfg, make_tokenizer(cfg))
    with torch.device("meta"):
        model = Transformer(model_cfg)
    spec = lora_spec(cfg)
    if spec is not None:
        apply_lora(model, spec, cfg.seed)
    published = adapter_tensors(model) if spec is not None else hf_state_dict(model)
    itemsize = getattr(torch, publish_dtype(cfg) or "float32").itemsize
    return trainable_count(model), sum(t.numel() for t in published.values()) * itemsize
