"""Typed run configuration, loaded from TOML, overridable with `key=value` strings.

Invariant: a `RunConfig` exists only if every key was known and every value had its declared type
and an allowed value; otherwise `ConfigError` names the key and what would have been accepted.
No torch here: every command can parse a config in milliseconds.
"""

from __future__ import annotations

import dataclasses
import tomllib
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from cadence.config.sections import (
    ConfigError,
    ModelConfigSection,
    MonitorConfig,
    RewardsConfig,
    RolloutConfig,
    SimulatedConfig,
    TaskConfig,
    TrainerConfig,
    TransportConfig,
    VllmConfig,
    WeightsConfig,
    doc,
)

__all__ = [
    "ConfigError",
    "ModelConfigSection",
    "MonitorConfig",
    "RewardsConfig",
    "RolloutConfig",
    "RunConfig",
    "SimulatedConfig",
    "TaskConfig",
    "TrainerConfig",
    "TransportConfig",
    "VllmConfig",
    "WeightsConfig",
    "doc",
    "from_dict",
    "load_config",
    "to_dict",
]


@dataclass(frozen=True)
class RunConfig:
    mode: Literal["periodic", "sync"] = doc("periodic", "periodic: train while generating; sync: train after")
    seed: int = doc(0, "seeds data, sampling and everything random")
    periods: int = doc(40, "training periods, one optimizer step each")
    run_id: str = doc("", "identifies the run on the wire; `cadence run` fills it in")
    task: TaskConfig = field(default_factory=TaskConfig, metadata={"doc": "the prompt source and its reward"})
    rewards: RewardsConfig = field(
        default_factory=RewardsConfig, metadata={"doc": "reward functions by name, and their settings"}
    )
    monitor: MonitorConfig = field(
        default_factory=MonitorConfig, metadata={"doc": "samples, log streaming and metric writers"}
    )
    rollout: RolloutConfig = field(
        default_factory=RolloutConfig, metadata={"doc": "rollout workers and sampling"}
    )
    model: ModelConfigSection = field(
        default_factory=ModelConfigSection, metadata={"doc": "the transformer's shape"}
    )
    vllm: VllmConfig = field(
        default_factory=VllmConfig, metadata={"doc": "the vLLM engine, when rollout.engine is vllm"}
    )
    trainer: TrainerConfig = field(default_factory=TrainerConfig, metadata={"doc": "optimizer and GRPO loss"})
    simulated: SimulatedConfig = field(
        default_factory=SimulatedConfig, metadata={"doc": "costs of the simulated engine and learner (bench)"}
    )
    weights: WeightsConfig = field(
        default_factory=WeightsConfig, metadata={"doc": "how weights are published and pulled"}
    )
    transport: TransportConfig = field(
        default_factory=TransportConfig, metadata={"doc": "sockets and liveness"}
    )

    def __post_init__(self) -> None:
        positive = {
            "periods": self.periods,
            "task.prompts_per_period": self.task.prompts_per_period,
            "rollout.group_size": self.rollout.group_size,
            "rollout.max_new_tokens": self.rollout.max_new_tokens,
            "rollout.inflight": self.rollout.inflight,
            "weights.chunk_bytes": self.weights.chunk_bytes,
            "weights.keep_versions": self.weights.keep_versions,
            "weights.bucket_bytes": self.weights.bucket_bytes,
            "weights.broadcast_timeout_s": self.weights.broadcast_timeout_s,
            "transport.heartbeat_s": self.transport.heartbeat_s,
            "transport.liveness": self.transport.liveness,
            "transport.max_frame_bytes": self.transport.max_frame_bytes,
            "task.digits": self.task.digits,
            "trainer.lr": self.trainer.lr,
            "model.hidden_size": self.model.hidden_size,
            "model.num_layers": self.model.num_layers,
            "model.num_heads": self.model.num_heads,
            "model.num_kv_heads": self.model.num_kv_heads,
            "model.intermediate_size": self.model.intermediate_size,
            "model.max_position": self.model.max_position,
        }
        for key, value in positive.items():
            if value <= 0:
                raise ConfigError(f"{key} must be positive, got {value}")
        steps = self.trainer.steps_per_period
        if steps < 1 or self.task.prompts_per_period % steps:
            raise ConfigError(
                f"trainer.steps_per_period = {steps} must be >= 1 and divide task.prompts_per_period"
                f" = {self.task.prompts_per_period}"
            )
        if not 0 <= self.monitor.samples_fraction <= 1:
            raise ConfigError(
                f"monitor.samples_fraction must be in [0, 1], got {self.monitor.samples_fraction}"
            )
        if self.trainer.micro_batch_tokens < 0:
            raise ConfigError(
                f"trainer.micro_batch_tokens must be >= 0, got {self.trainer.micro_batch_tokens}"
            )
        for key, threads in (
            ("rollout.threads", self.rollout.threads),
            ("trainer.threads", self.trainer.threads),
        ):
            if threads < 0:
                raise ConfigError(f"{key} must be >= 0 (0: automatic), got {threads}")
        if self.trainer.ranks < 1:
            raise ConfigError(f"trainer.ranks must be >= 1, got {self.trainer.ranks}")
        if self.trainer.ranks > 1 and self.trainer.learner != "torch":
            raise ConfigError(
                f"trainer.ranks = {self.trainer.ranks} needs trainer.learner = 'torch'"
                f" (got {self.trainer.learner!r})"
            )
        if self.trainer.sharding == "fsdp2" and self.trainer.ranks < 2:
            raise ConfigError(
                f"trainer.sharding = 'fsdp2' needs trainer.ranks > 1 (got {self.trainer.ranks}): one rank"
                " holds the whole model, use trainer.sharding = 'none'"
            )
        if self.trainer.sharding == "fsdp2" and self.trainer.packing != "shared_prompt":
            raise ConfigError(
                f"trainer.sharding = 'fsdp2' needs trainer.packing = 'shared_prompt' (got"
                f" {self.trainer.packing!r}): every rank must run one forward a micro-batch"
            )
        if self.trainer.collective_timeout_s <= 0:
            raise ConfigError(
                f"trainer.collective_timeout_s must be positive, got {self.trainer.collective_timeout_s}"
            )
        if self.trainer.checkpoint_every < 0:
            raise ConfigError(f"trainer.checkpoint_every must be >= 0, got {self.trainer.checkpoint_every}")
        if self.vllm.max_model_len < 0 or self.vllm.kv_cache_mib < 0:
            raise ConfigError(
                f"vllm.max_model_len ({self.vllm.max_model_len}) and vllm.kv_cache_mib"
                f" ({self.vllm.kv_cache_mib}) must be >= 0"
            )
        if not 0 < self.vllm.gpu_memory_utilization <= 1:
            raise ConfigError(
                f"vllm.gpu_memory_utilization must be in (0, 1], got {self.vllm.gpu_memory_utilization}"
            )
        if self.weights.chunk_bytes > self.transport.max_frame_bytes:
            raise ConfigError(
                f"weights.chunk_bytes ({self.weights.chunk_bytes}) must be at most transport.max_frame_bytes"
                f" ({self.transport.max_frame_bytes}): a larger chunk would be refused by every worker"
            )
        if self.rollout.workers < 0:
            raise ConfigError(f"rollout.workers must be >= 0, got {self.rollout.workers}")
        if self.rollout.temperature < 0:
            raise ConfigError(f"rollout.temperature must be >= 0, got {self.rollout.temperature}")
        if not 0 < self.rollout.top_p <= 1:
            raise ConfigError(f"rollout.top_p must be in (0, 1], got {self.rollout.top_p}")


def load_config(path: Path | None, overrides: Sequence[str] = ()) -> RunConfig:
    """The config in TOML or JSON file `path` (defaults if None), with `key=value` overrides."""
    data: dict[str, Any] = {}
    if path is not None:
        text = Path(path).read_text()
        try:
            data = _json_or_toml(path, text)
        except ValueError as exc:
            raise ConfigError(f"{path}: {exc}") from None
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r} is not key=value")
        _set_path(data, key.strip().split("."), _parse_value(raw.strip()))
    return from_dict(RunConfig, data)


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def from_dict(cls: type[Any], data: dict[str, Any], prefix: str = "") -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'} must be a table, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for key in data:
        if key not in names:
            raise ConfigError(f"unknown key {prefix + key!r}; allowed here: {', '.join(sorted(names))}")
    kwargs = {}
    for name, value in data.items():
        kwargs[name] = _check(hints[name], value, prefix + name)
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: {exc}") from None


def _check(hint: Any, value: Any, key: str) -> Any:
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, value, key + ".")  # type: ignore[arg-type]
    if get_origin(hint) is Literal:
        allowed = get_args(hint)
        if value not in allowed:
            raise ConfigError(
                f"{key} = {value!r} is not allowed; choose one of {', '.join(map(repr, allowed))}"
            )
        return value
    if get_origin(hint) is dict:
        key_type, value_type = get_args(hint)
        if not isinstance(value, dict):
            raise ConfigError(f"{key} must be a table, got {value!r}")
        return {_check(key_type, k, key): _check(value_type, v, f"{key}.{k}") for k, v in value.items()}
    if get_origin(hint) is list:
        (item_type,) = get_args(hint)
        if not isinstance(value, list):
            raise ConfigError(f"{key} must be a list, got {value!r}")
        return [_check(item_type, v, f"{key}[{i}]") for i, v in enumerate(value)]
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint in (int, float, str, bool) and not (
        isinstance(value, hint) and not (hint is int and isinstance(value, bool))
    ):
        raise ConfigError(f"{key} must be {hint.__name__}, got {value!r}")
    return value


def _set_path(data: dict[str, Any], path: list[str], value: Any) -> None:
    for part in path[:-1]:
        data = data.setdefault(part, {})
        if not isinstance(data, dict):
            raise ConfigError(f"cannot set {'.'.join(path)}: {part} is not a table")
    data[path[-1]] = value


def _parse_value(raw: str) -> Any:
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def _json_or_toml(path: Path, text: str) -> dict[str, Any]:
    if str(path).endswith(".json"):
        import json

        result = json.loads(text)
        if not isinstance(result, dict):
            raise ValueError("top level must be an object")
        return result
    return tomllib.loads(text)
