"""The rules of a run configuration that span several keys, each a named function; a key's own range
is declared on its field (`fields.py`) and checked first.

Invariant: `check_run` raises `ConfigError` naming the keys, the values and what is allowed, for the
first rule a config breaks (each field's in declaration order, then `ACROSS` in order); a config that
passes has every value the actors assume.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from cadence.config.fields import ConfigError, check_fields

if TYPE_CHECKING:
    from cadence.config.run import RunConfig


def steps_divide_the_batch(cfg: RunConfig) -> None:
    """`trainer.steps_per_period` divides `task.prompts_per_period`: each step takes B/steps groups."""
    steps, batch = cfg.trainer.steps_per_period, cfg.task.prompts_per_period
    if batch % steps:
        raise ConfigError(
            f"trainer.steps_per_period = {steps} must be >= 1 and divide task.prompts_per_period = {batch}"
        )


def warmup_within_the_run(cfg: RunConfig) -> None:
    """`trainer.warmup_periods` is at most `periods`."""
    if cfg.trainer.warmup_periods > cfg.periods:
        raise ConfigError(
            f"trainer.warmup_periods must be in [0, periods = {cfg.periods}], got {cfg.trainer.warmup_periods}"
        )


def waiting_needs_checkpoints(cfg: RunConfig) -> None:
    """`trainer.on_loss = "wait"` needs `trainer.checkpoint_every > 0`: a lost trainer comes back only
    from a resume checkpoint."""
    if cfg.trainer.on_loss == "wait" and cfg.trainer.checkpoint_every <= 0:
        raise ConfigError(
            "trainer.on_loss = 'wait' needs trainer.checkpoint_every > 0 (got"
            f" {cfg.trainer.checkpoint_every}): a lost trainer comes back only from a resume checkpoint"
        )


def normaliser_only_for_dapo(cfg: RunConfig) -> None:
    """`trainer.normaliser = "samples"` only with `trainer.objective = "dapo"`: the other objectives
    fix their own normaliser."""
    t = cfg.trainer
    if t.normaliser != "tokens" and t.objective != "dapo":
        raise ConfigError(
            f"trainer.normaliser = {t.normaliser!r} applies to trainer.objective = 'dapo' only (got"
            f" {t.objective!r}, which fixes its own normaliser): leave trainer.normaliser = 'tokens'"
        )


def several_steps_need_old_log_probs_at_the_temperature(cfg: RunConfig) -> None:
    """`trainer.steps_per_period > 1` takes the old log-probs from the engine: not with
    `rollout.engine = "vllm"` sampling with both a temperature (other than 0 and 1) and `rollout.top_p
    < 1`, where vLLM returns them at temperature 1."""
    t, r = cfg.trainer, cfg.rollout
    tempered = r.temperature not in (0.0, 1.0)
    if r.engine == "vllm" and tempered and r.top_p < 1.0 and t.steps_per_period > 1:
        raise ConfigError(
            f"trainer.steps_per_period = {t.steps_per_period} takes the old log-probs from the engine,"
            f" and rollout.engine = 'vllm' with rollout.top_p = {r.top_p} returns them at"
            f" temperature 1, not at rollout.temperature = {r.temperature}: use"
            " rollout.engine = 'torch', top_p 1, temperature 1, or one step a period"
        )


def engine_log_probs_at_the_temperature(cfg: RunConfig) -> bool:
    """Whether the engine's log-probs are of the distribution it samples from, softmax(z / T): all but
    vLLM's with both a temperature (other than 0 and 1) and `rollout.top_p < 1` (then at T = 1)."""
    r = cfg.rollout
    return not (r.engine == "vllm" and r.temperature not in (0.0, 1.0) and r.top_p < 1.0)


def a_correction_needs_log_probs_at_the_temperature(cfg: RunConfig) -> None:
    """`trainer.rollout_correction` weighs by the engine's log-probs: not where they are at T = 1."""
    mode = cfg.trainer.rollout_correction.mode
    if mode != "off" and not engine_log_probs_at_the_temperature(cfg):
        raise ConfigError(
            f"trainer.rollout_correction.mode = {mode!r} weighs by the engine's log-probs, and"
            f" rollout.engine = 'vllm' with rollout.top_p = {cfg.rollout.top_p} returns them at"
            f" temperature 1, not at rollout.temperature = {cfg.rollout.temperature}: use top_p 1,"
            " temperature 1, or rollout.engine = 'torch'"
        )


def ranks_need_the_torch_learner(cfg: RunConfig) -> None:
    """`trainer.ranks > 1` needs `trainer.learner = "torch"`."""
    trainer = cfg.trainer
    if trainer.ranks > 1 and trainer.learner != "torch":
        raise ConfigError(
            f"trainer.ranks = {trainer.ranks} needs trainer.learner = 'torch' (got {trainer.learner!r})"
        )


def sharding_needs_ranks_and_shared_prompt_packing(cfg: RunConfig) -> None:
    """`trainer.sharding = "fsdp2"` needs `trainer.ranks > 1` and `trainer.packing = "shared_prompt"`
    (every rank runs one forward a micro-batch)."""
    trainer = cfg.trainer
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


def recomputed_blocks_write_no_cache(cfg: RunConfig) -> None:
    """`trainer.activation_checkpointing` computes a block again in the backward, which the prefix
    cache's blocks cannot be: they append their keys and values to the cache as they run."""
    trainer = cfg.trainer
    if trainer.activation_checkpointing and trainer.packing == "prefix_cache":
        raise ConfigError(
            "trainer.activation_checkpointing = true needs trainer.packing = 'shared_prompt' or 'padded'"
            " (got 'prefix_cache', whose blocks write a KV cache that a block computed again would write"
            " twice)"
        )


def adapters_are_known_and_unsharded(cfg: RunConfig) -> None:
    """`trainer.lora.targets` names known projections, each once, at least one; adapters
    (`trainer.lora.rank > 0`) train the real model, on ranks that each hold all of it (not fsdp2)."""
    from cadence.config.trainer import LORA_TARGETS

    lora, trainer = cfg.trainer.lora, cfg.trainer
    unknown = [t for t in lora.targets if t not in LORA_TARGETS]
    if unknown or not lora.targets or len(set(lora.targets)) != len(lora.targets):
        raise ConfigError(
            f"trainer.lora.targets must name each of {list(LORA_TARGETS)} at most once, at least one;"
            f" got {lora.targets}"
        )
    if lora.rank == 0:
        return
    if lora.base_dtype == "bfloat16" and trainer.precision != "bf16":
        raise ConfigError(
            f"trainer.lora.base_dtype = 'bfloat16' needs trainer.precision = 'bf16' (got"
            f" {trainer.precision!r}): a float32 forward would copy every base weight back to float32"
        )
    if trainer.sharding == "fsdp2":
        raise ConfigError(
            f"trainer.lora.rank = {lora.rank} does not go with trainer.sharding = 'fsdp2': the frozen"
            " base is not split over the ranks; use trainer.sharding = 'none' (the adapters' optimizer"
            " state is small) or trainer.lora.rank = 0"
        )
    if trainer.learner == "simulated":
        raise ConfigError(
            f"trainer.lora.rank = {lora.rank} needs trainer.learner = 'torch' (got 'simulated', which"
            " trains no model)"
        )


def rollout_device_and_dtype_only_for_builtin_engine(cfg: RunConfig) -> None:
    """`rollout.device` other than "cpu" needs `rollout.engine = "torch"`, and `rollout.dtype` other
    than "float32" is not for `rollout.engine = "vllm"` (a vLLM worker has its build's device and
    `vllm.dtype`)."""
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


def chunks_fit_a_frame(cfg: RunConfig) -> None:
    """`weights.chunk_bytes` is at most `transport.max_frame_bytes`: a larger chunk would be refused."""
    if cfg.weights.chunk_bytes > cfg.transport.max_frame_bytes:
        raise ConfigError(
            f"weights.chunk_bytes ({cfg.weights.chunk_bytes}) must be at most transport.max_frame_bytes"
            f" ({cfg.transport.max_frame_bytes}): a larger chunk would be refused by every worker"
        )


def evaluation_has_prompts(cfg: RunConfig) -> None:
    """`eval.every > 0` needs held-out prompts: `eval.prompts > 0` or `eval.path`; `eval.path` only for
    the file and reasoning_gym tasks (digits and arithmetic draw their own)."""
    e = cfg.eval
    if e.every > 0 and e.prompts == 0 and not e.path:
        raise ConfigError(
            f"eval.every = {e.every} needs held-out prompts: set eval.prompts > 0 (a split of the task)"
            " or eval.path (a file of problems)"
        )
    if e.path and cfg.task.name not in ("file", "reasoning_gym"):
        raise ConfigError(
            f"eval.path needs task.name = 'file' or 'reasoning_gym' (got {cfg.task.name!r}): the digits"
            " and arithmetic tasks draw their held-out prompts themselves (eval.prompts)"
        )


def eval_k_and_temperature_agree_with_greedy(cfg: RunConfig) -> None:
    """`eval.greedy = true` takes `eval.k = 1`; `eval.greedy = false` a finite, positive
    `eval.temperature`."""
    e = cfg.eval
    if e.greedy and e.k != 1:
        raise ConfigError(
            f"eval.k = {e.k} with eval.greedy = true: greedy decoding gives one completion a prompt;"
            " set eval.greedy = false to sample eval.k at eval.temperature"
        )
    if not e.greedy and not (e.temperature > 0 and math.isfinite(e.temperature)):
        raise ConfigError(
            f"eval.temperature must be positive and finite when eval.greedy is false, got {e.temperature}"
        )


def episodes_need_a_turn_engine(cfg: RunConfig) -> None:
    """`environment.name` needs an engine that plays episodes' turns (a token limit a call, the model's
    positions): `rollout.engine = "torch"` or `"vllm"`; the simulated engine plays none."""
    name, engine = cfg.environment.name or cfg.environment.agent, cfg.rollout.engine
    if cfg.environment.name and cfg.environment.agent:
        raise ConfigError(
            f"environment.name = {cfg.environment.name!r} and environment.agent ="
            f" {cfg.environment.agent!r}: an episode is an environment's or an agent's, set one"
        )
    if name and engine not in ("torch", "vllm"):
        raise ConfigError(
            f"environment.name = {name!r} needs rollout.engine = 'torch' or 'vllm' (got {engine!r}):"
            f" the {engine} engine plays no episodes"
        )


def episodes_fit_the_positions(cfg: RunConfig) -> None:
    """`environment.max_turn_tokens` is at most `environment.max_tokens`, and `environment.max_tokens`
    leaves the first message room in `model.max_position` (with `environment.name`; a
    `model.checkpoint`'s own positions are checked when a worker builds) and, with `rollout.engine =
    "vllm"`, in `vllm.max_model_len` when set."""
    e = cfg.environment
    if not e.played:
        return
    if e.max_turn_tokens > e.max_tokens:
        raise ConfigError(
            f"environment.max_turn_tokens = {e.max_turn_tokens} must be at most environment.max_tokens"
            f" = {e.max_tokens}: a turn is part of its episode's tokens"
        )
    positions = cfg.model.max_position
    if not cfg.model.checkpoint and e.max_tokens >= positions:
        raise ConfigError(
            f"environment.max_tokens = {e.max_tokens} leaves the first message no room in"
            f" model.max_position = {positions}: the episode's first message and its tokens after it"
            " share the model's positions; lower environment.max_tokens or raise model.max_position"
        )
    planned = cfg.vllm.max_model_len if cfg.rollout.engine == "vllm" else 0
    if planned and e.max_tokens >= planned:
        raise ConfigError(
            f"environment.max_tokens = {e.max_tokens} leaves the first message no room in"
            f" vllm.max_model_len = {planned}: the episode's first message and its tokens after it share"
            " vLLM's positions; lower environment.max_tokens or raise vllm.max_model_len"
        )


def episodes_take_no_reward_weights(cfg: RunConfig) -> None:
    """`environment.name` takes no `rewards.weights`: an episode's reward is its environment's score."""
    if cfg.environment.played and cfg.rewards.weights:
        raise ConfigError(
            f"rewards.weights = {cfg.rewards.weights} with environment.name ="
            f" {cfg.environment.name!r}: an episode's reward is its environment's score; leave"
            " rewards.weights empty (score in the environment's `score` instead)"
        )


def math_verify_is_installed(cfg: RunConfig) -> None:
    """`task.checker = "math_verify"` and the `math_verify` reward need the math-verify package."""
    import importlib.util

    asked = [
        key
        for key, on in (
            ("task.checker", cfg.task.checker == "math_verify"),
            ("rewards.weights", "math_verify" in cfg.rewards.weights),
        )
        if on
    ]
    if asked and importlib.util.find_spec("math_verify") is None:
        raise ConfigError(
            f"{asked[0]} asks for math-verify, which is not installed: pip install 'cadence[math]'"
        )


def sampling_filters_are_known(cfg: RunConfig) -> None:
    """Every `sampling.filters` entry is a built-in filter or a `package.module:function`, named once;
    `sampling.reward_range` is [low, high], finite, low <= high."""
    from cadence.config.sampling import BUILT_IN_FILTERS

    s = cfg.sampling
    for name in s.filters:
        module, sep, function = name.partition(":")
        if name not in BUILT_IN_FILTERS and not (sep and module.strip() and function.strip()):
            raise ConfigError(
                f"sampling.filters: {name!r} is none of {list(BUILT_IN_FILTERS)} nor a"
                " `package.module:function`"
            )
    if len(set(s.filters)) != len(s.filters):
        raise ConfigError(f"sampling.filters names a filter twice: {s.filters}")
    low_high = s.reward_range
    if len(low_high) != 2 or not all(math.isfinite(v) for v in low_high) or low_high[0] > low_high[1]:
        raise ConfigError(f"sampling.reward_range must be [low, high], finite, low <= high; got {low_high}")


ACROSS: tuple[Callable[[RunConfig], None], ...] = (
    steps_divide_the_batch,
    warmup_within_the_run,
    waiting_needs_checkpoints,
    normaliser_only_for_dapo,
    several_steps_need_old_log_probs_at_the_temperature,
    a_correction_needs_log_probs_at_the_temperature,
    ranks_need_the_torch_learner,
    sharding_needs_ranks_and_shared_prompt_packing,
    recomputed_blocks_write_no_cache,
    adapters_are_known_and_unsharded,
    rollout_device_and_dtype_only_for_builtin_engine,
    chunks_fit_a_frame,
    evaluation_has_prompts,
    eval_k_and_temperature_agree_with_greedy,
    episodes_need_a_turn_engine,
    episodes_fit_the_positions,
    episodes_take_no_reward_weights,
    math_verify_is_installed,
    sampling_filters_are_known,
)


def check_run(cfg: RunConfig) -> None:
    """Every field's own rules, then every rule across keys, in order."""
    check_fields(cfg)
    for rule in ACROSS:
        rule(cfg)
