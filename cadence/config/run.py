"""Typed run configuration, loaded from TOML, overridable with `key=value` strings.

Invariant: a `RunConfig` exists only if every key was known and every value had its declared type
(`tables.py`) and an allowed value (`checks.py`); otherwise `ConfigError` names the key and what would
have been accepted. No torch here: every command can parse a config in milliseconds.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from cadence.config.checks import check_run
from cadence.config.environment import EnvironmentConfig
from cadence.config.fields import POSITIVE, ConfigError, doc, section
from cadence.config.rollout import RolloutConfig, VllmConfig
from cadence.config.sampling import SamplingConfig
from cadence.config.sections import (
    EvalConfig,
    ModelConfigSection,
    MonitorConfig,
    RewardsConfig,
    SimulatedConfig,
    TaskConfig,
    TransportConfig,
    WeightsConfig,
)
from cadence.config.tables import from_dict
from cadence.config.trainer import TrainerConfig


@dataclass(frozen=True)
class RunConfig:
    """The whole run: its top-level keys, and a section (a TOML table) for each part."""

    mode: Literal["periodic", "sync"] = doc(
        "periodic",
        "periodic: the trainer trains each group as it arrives, while the period's later groups are"
        " generated; sync: it starts only when all B groups of the period are in",
    )
    seed: int = doc(0, "seeds data, sampling and everything random")
    periods: int = doc(
        40, "training periods, each of trainer.steps_per_period optimizer steps (one by default)", POSITIVE
    )
    run_id: str = doc("", "identifies the run on the wire; `cadence run` fills it in")
    task: TaskConfig = section(TaskConfig, "the prompt source and its reward")
    rewards: RewardsConfig = section(RewardsConfig, "reward functions by name, and their settings")
    environment: EnvironmentConfig = section(
        EnvironmentConfig, "multi-turn episodes: the environment the model acts in, and their bounds"
    )
    eval: EvalConfig = section(EvalConfig, "held-out evaluation during the run and by `cadence eval`")
    monitor: MonitorConfig = section(MonitorConfig, "samples, log streaming and metric writers")
    rollout: RolloutConfig = section(RolloutConfig, "rollout workers and sampling")
    sampling: SamplingConfig = section(
        SamplingConfig, "over-sampled periods: group filters, refills, and the rest stopped"
    )
    model: ModelConfigSection = section(ModelConfigSection, "the transformer's shape")
    vllm: VllmConfig = section(VllmConfig, "the vLLM engine, when rollout.engine is vllm")
    trainer: TrainerConfig = section(
        TrainerConfig, "the optimizer, its schedule, the policy loss, ranks and device"
    )
    simulated: SimulatedConfig = section(SimulatedConfig, "costs of the simulated engine and learner (bench)")
    weights: WeightsConfig = section(WeightsConfig, "how weights are published and pulled")
    transport: TransportConfig = section(TransportConfig, "sockets and liveness")

    def __post_init__(self) -> None:
        check_run(self)


def load_config(
    path: Path | None, overrides: Sequence[str] = (), fixed: Mapping[str, Any] | None = None
) -> RunConfig:
    """The config in TOML or JSON file `path` (defaults if None), with `key=value` overrides, then the
    values a command sets itself by dotted key (`fixed`: `{"trainer.ranks": 8}`), all checked together."""
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
    for key, value in (fixed or {}).items():
        _set_path(data, key.split("."), value)
    return from_dict(RunConfig, data)


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


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
