"""The run's configuration: typed sections (`sections.py`, the trainer's in `trainer.py`, the rollout
workers' in `rollout.py`, multi-turn episodes' in `environment.py`), each key's declaration and range (`fields.py`), the rules across keys
(`checks.py`), the whole run and its loading (`run.py`, through `tables.py`), and its reference page
(`reference.py`, `docs/config.md`).

Everyone imports from here; this package imports nothing else of cadence.
"""

from cadence.config.environment import EnvironmentConfig
from cadence.config.fields import ConfigError, Rule, doc
from cadence.config.rollout import RolloutConfig, VllmConfig
from cadence.config.run import RunConfig, load_config, to_dict
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
from cadence.config.trainer import GspoConfig, TrainerConfig

__all__ = [
    "ConfigError",
    "EnvironmentConfig",
    "EvalConfig",
    "GspoConfig",
    "ModelConfigSection",
    "MonitorConfig",
    "RewardsConfig",
    "RolloutConfig",
    "Rule",
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
