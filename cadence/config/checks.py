"""The allowed values of a run configuration beyond each key's type: ranges, and keys that must
agree with one another.

Invariant: `check_run` raises `ConfigError` naming the key (or keys), the value and what is allowed,
for the first rule a config breaks; a config that passes has every value the actors assume.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from cadence.config.sections import ConfigError

if TYPE_CHECKING:
    from cadence.config.run import RunConfig


def check_run(cfg: RunConfig) -> None:
    """Every rule below, in order."""
    check_positive(cfg)
    check_trainer(cfg)
    check_objective(cfg)
    check_parallel(cfg)
    check_vllm(cfg)
    check_weights(cfg)
    check_rollout(cfg)
    check_rewards(cfg)
    check_eval(cfg)


def check_positive(cfg: RunConfig) -> None:
    """Counts, sizes, rates and intervals that must be above zero."""
    positive = {
        "periods": cfg.periods,
        "task.prompts_per_period": cfg.task.prompts_per_period,
        "rollout.group_size": cfg.rollout.group_size,
        "rollout.max_new_tokens": cfg.rollout.max_new_tokens,
        "rollout.inflight": cfg.rollout.inflight,
        "weights.chunk_bytes": cfg.weights.chunk_bytes,
        "weights.keep_versions": cfg.weights.keep_versions,
        "weights.max_upload_bytes": cfg.weights.max_upload_bytes,
        "weights.bucket_bytes": cfg.weights.bucket_bytes,
        "weights.broadcast_timeout_s": cfg.weights.broadcast_timeout_s,
        "transport.heartbeat_s": cfg.transport.heartbeat_s,
        "transport.liveness": cfg.transport.liveness,
        "transport.max_frame_bytes": cfg.transport.max_frame_bytes,
        "task.digits": cfg.task.digits,
        "model.hidden_size": cfg.model.hidden_size,
        "model.num_layers": cfg.model.num_layers,
        "model.num_heads": cfg.model.num_heads,
        "model.num_kv_heads": cfg.model.num_kv_heads,
        "model.intermediate_size": cfg.model.intermediate_size,
        "model.max_position": cfg.model.max_position,
    }
    for key, value in positive.items():
        if not value > 0:  # NaN too
            raise ConfigError(f"{key} must be positive, got {value}")
    if not (cfg.trainer.lr > 0 and math.isfinite(cfg.trainer.lr)):
        raise ConfigError(f"trainer.lr must be finite and positive, got {cfg.trainer.lr}")


def check_trainer(cfg: RunConfig) -> None:
    """Optimizer steps a period, micro-batch size, checkpoints (and the share of samples kept)."""
    steps = cfg.trainer.steps_per_period
    if steps < 1 or cfg.task.prompts_per_period % steps:
        raise ConfigError(
            f"trainer.steps_per_period = {steps} must be >= 1 and divide task.prompts_per_period"
            f" = {cfg.task.prompts_per_period}"
        )
    if not 0 <= cfg.monitor.samples_fraction <= 1:
        raise ConfigError(f"monitor.samples_fraction must be in [0, 1], got {cfg.monitor.samples_fraction}")
    if cfg.trainer.micro_batch_tokens < 0:
        raise ConfigError(f"trainer.micro_batch_tokens must be >= 0, got {cfg.trainer.micro_batch_tokens}")
    if cfg.trainer.checkpoint_every < 0:
        raise ConfigError(f"trainer.checkpoint_every must be >= 0, got {cfg.trainer.checkpoint_every}")
    for key, threads in (("rollout.threads", cfg.rollout.threads), ("trainer.threads", cfg.trainer.threads)):
        if threads < 0:
            raise ConfigError(f"{key} must be >= 0 (0: automatic), got {threads}")
    if cfg.trainer.on_loss == "wait" and cfg.trainer.checkpoint_every <= 0:
        raise ConfigError(
            "trainer.on_loss = 'wait' needs trainer.checkpoint_every > 0 (got"
            f" {cfg.trainer.checkpoint_every}): a lost trainer comes back only from a resume checkpoint"
        )


def check_objective(cfg: RunConfig) -> None:
    """The objective's clip ranges and normaliser, the learning rate's schedule, sampling log-probs."""
    t = cfg.trainer
    for key, low in (("trainer.clip_low", t.clip_low), ("trainer.gspo.clip_low", t.gspo.clip_low)):
        if not 0 <= low < 1:
            raise ConfigError(f"{key} must be in [0, 1), got {low}")
    for key, high in (("trainer.clip_high", t.clip_high), ("trainer.gspo.clip_high", t.gspo.clip_high)):
        if high < 0:
            raise ConfigError(f"{key} must be >= 0, got {high}")
    if t.normaliser != "tokens" and t.objective != "dapo":
        raise ConfigError(
            f"trainer.normaliser = {t.normaliser!r} applies to trainer.objective = 'dapo' only (got"
            f" {t.objective!r}, which fixes its own normaliser): leave trainer.normaliser = 'tokens'"
        )
    if t.warmup_periods < 0 or t.warmup_periods > cfg.periods:
        raise ConfigError(
            f"trainer.warmup_periods must be in [0, periods = {cfg.periods}], got {t.warmup_periods}"
        )
    if not 0 <= t.min_lr_ratio <= 1:
        raise ConfigError(f"trainer.min_lr_ratio must be in [0, 1], got {t.min_lr_ratio}")
    tempered = cfg.rollout.temperature not in (0.0, 1.0)
    nucleus = cfg.rollout.top_p < 1.0
    if cfg.rollout.engine == "vllm" and tempered and nucleus and t.steps_per_period > 1:
        raise ConfigError(
            f"trainer.steps_per_period = {t.steps_per_period} takes the old log-probs from the engine,"
            f" and rollout.engine = 'vllm' with rollout.top_p = {cfg.rollout.top_p} returns them at"
            f" temperature 1, not at rollout.temperature = {cfg.rollout.temperature}: use"
            " rollout.engine = 'torch', top_p 1, temperature 1, or one step a period"
        )


def check_parallel(cfg: RunConfig) -> None:
    """The trainer's ranks, sharding and collectives agree with one another."""
    trainer = cfg.trainer
    if trainer.ranks < 1:
        raise ConfigError(f"trainer.ranks must be >= 1, got {trainer.ranks}")
    if trainer.ranks > 1 and trainer.learner != "torch":
        raise ConfigError(
            f"trainer.ranks = {trainer.ranks} needs trainer.learner = 'torch' (got {trainer.learner!r})"
        )
    if trainer.sharding == "fsdp2" and trainer.ranks < 2:
        raise ConfigError(
            f"trainer.sharding = 'fsdp2' needs trainer.ranks > 1 (got {trainer.ranks}): one rank"
            " holds the whole model, use trainer.sharding = 'none'"
        )
    if trainer.sharding == "fsdp2" and trainer.packing != "shared_prompt":
        raise ConfigError(
            f"trainer.sharding = 'fsdp2' needs trainer.packing = 'shared_prompt' (got"
            f" {trainer.packing!r}): every rank must run one forward a micro-batch"
        )
    if trainer.collective_timeout_s <= 0:
        raise ConfigError(
            f"trainer.collective_timeout_s must be positive, got {trainer.collective_timeout_s}"
        )


def check_vllm(cfg: RunConfig) -> None:
    """vLLM's context length, cache size and memory share; its precision is its own."""
    if cfg.rollout.engine != "torch" and cfg.rollout.device != "cpu":
        raise ConfigError(
            f"rollout.device = {cfg.rollout.device!r} is the built-in engine's (rollout.engine = 'torch');"
            " a vLLM worker computes on the device its vLLM build serves"
        )
    if cfg.rollout.engine == "vllm" and cfg.rollout.dtype != "float32":
        raise ConfigError(
            f"rollout.dtype = {cfg.rollout.dtype!r} is the built-in engine's; a vLLM worker computes in"
            " vllm.dtype (float32, bfloat16, float16 or auto)"
        )
    if cfg.vllm.max_model_len < 0 or cfg.vllm.kv_cache_mib < 0:
        raise ConfigError(
            f"vllm.max_model_len ({cfg.vllm.max_model_len}) and vllm.kv_cache_mib"
            f" ({cfg.vllm.kv_cache_mib}) must be >= 0"
        )
    if not 0 < cfg.vllm.gpu_memory_utilization <= 1:
        raise ConfigError(
            f"vllm.gpu_memory_utilization must be in (0, 1], got {cfg.vllm.gpu_memory_utilization}"
        )


def check_weights(cfg: RunConfig) -> None:
    """A weights chunk fits in one transport frame."""
    if cfg.weights.chunk_bytes > cfg.transport.max_frame_bytes:
        raise ConfigError(
            f"weights.chunk_bytes ({cfg.weights.chunk_bytes}) must be at most transport.max_frame_bytes"
            f" ({cfg.transport.max_frame_bytes}): a larger chunk would be refused by every worker"
        )


def check_rollout(cfg: RunConfig) -> None:
    """Worker count and sampling settings."""
    if cfg.rollout.workers < 1:
        raise ConfigError(
            f"rollout.workers must be >= 1, got {cfg.rollout.workers}: with none the run would wait for"
            " prompts to be generated forever"
        )
    if cfg.rollout.group_size < 2:
        raise ConfigError(
            f"rollout.group_size must be >= 2, got {cfg.rollout.group_size}: GRPO's advantage compares the"
            " completions of a prompt, one alone has none"
        )
    if not cfg.rollout.wait_for_workers_s > 0:
        raise ConfigError(
            f"rollout.wait_for_workers_s must be positive, got {cfg.rollout.wait_for_workers_s}"
        )
    if cfg.rollout.temperature < 0:
        raise ConfigError(f"rollout.temperature must be >= 0, got {cfg.rollout.temperature}")
    if not 0 < cfg.rollout.top_p <= 1:
        raise ConfigError(f"rollout.top_p must be in (0, 1], got {cfg.rollout.top_p}")


def check_rewards(cfg: RunConfig) -> None:
    """A reward function's deadline and the value a failed one gives."""
    if not (cfg.rewards.timeout_s > 0 and math.isfinite(cfg.rewards.timeout_s)):
        raise ConfigError(f"rewards.timeout_s must be positive and finite, got {cfg.rewards.timeout_s}")
    if not math.isfinite(cfg.rewards.on_error):
        raise ConfigError(f"rewards.on_error must be finite, got {cfg.rewards.on_error}")


def check_eval(cfg: RunConfig) -> None:
    """Held-out evaluation: how often, how many prompts and how they are sampled."""
    e = cfg.eval
    if e.every < 0:
        raise ConfigError(f"eval.every must be >= 0 (0: no evaluation), got {e.every}")
    if e.prompts < 0:
        raise ConfigError(f"eval.prompts must be >= 0, got {e.prompts}")
    if e.every > 0 and e.prompts == 0 and not e.path:
        raise ConfigError(
            f"eval.every = {e.every} needs held-out prompts: set eval.prompts > 0 (a split of the task)"
            " or eval.path (a file of problems)"
        )
    if e.k < 1:
        raise ConfigError(f"eval.k must be >= 1, got {e.k}")
    if e.greedy and e.k != 1:
        raise ConfigError(
            f"eval.k = {e.k} with eval.greedy = true: greedy decoding gives one completion a prompt;"
            " set eval.greedy = false to sample eval.k at eval.temperature"
        )
    if not e.greedy and not (e.temperature > 0 and math.isfinite(e.temperature)):
        raise ConfigError(
            f"eval.temperature must be positive and finite when eval.greedy is false, got {e.temperature}"
        )
    if e.path and cfg.task.name not in ("file", "reasoning_gym"):
        raise ConfigError(
            f"eval.path needs task.name = 'file' or 'reasoning_gym' (got {cfg.task.name!r}): the digits"
            " and arithmetic tasks draw their held-out prompts themselves (eval.prompts)"
        )
