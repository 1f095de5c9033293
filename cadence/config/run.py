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

from cadence.config.checks import check_run
from cadence.config.sections import (
    ConfigError,
    EvalConfig,
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
    eval: EvalConfig = field(
        default_factory=EvalConfig,
        metadata={"doc": "held-out evaluation during the run and by `cadence eval`"},
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
        check_run(self)


def load_config(path: Path | None, overrides: Sequence[str] = ()) -> RunConfig:
    """The config in TOML or JSON file `path` (defaults if None), with `key=value` overrides."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            text = Path(path).read_text()
        except FileNotFoundError:
            raise ConfigError(f"config file {path} not found") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"config file {path} cannot be read: {exc}") from None
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
