"""The run's configuration: typed sections (`sections.py`), the whole run and its loading (`run.py`).

Everyone imports from here; this package imports nothing else of cadence.
"""

from cadence.config.run import RunConfig, from_dict, load_config, to_dict
from cadence.config.sections import (
    ConfigError,
    EvalConfig,
    GspoConfig,
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
    "EvalConfig",
    "GspoConfig",
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
