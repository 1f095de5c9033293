"""Environments by name: a built-in one ("calculator", "guess_number",
"tool_calculator", "units") or a user's factory named
"package.module:factory" in the user's own module, as reward functions come from `rewards.modules`;
cadence never needs to be edited to add one; or a SkyRL-gym environment, "skyrl:<registry id>" or
"skyrl:package.module:Class" (`skyrl.py`).

Invariant: a name that cannot be loaded raises `ConfigError` naming the key, the name and why (the
module that does not import, the attribute it lacks, the value that is not callable), so a bad name
fails a run at its start, never in the middle of a period.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from cadence.config import ConfigError
from cadence.config.targets import load_callable
from cadence.tasks.environments.base import EnvironmentFactory

BUILT_IN = {
    "calculator": "cadence.tasks.environments.calculator:Calculator",
    "guess_number": "cadence.tasks.environments.guess:GuessNumber",
    "tool_calculator": "cadence.tasks.environments.tool_calculator:ToolCalculator",
    "units": "cadence.tasks.environments.units:Units",
}


def load_environment(
    name: str, key: str = "environment.name", kwargs: Mapping[str, Any] | None = None
) -> EnvironmentFactory:
    """The factory `name` stands for: `factory(prompt, seed)` makes one episode's `Environment`; a
    SkyRL-gym one (`skyrl:...`) with `kwargs` (`environment.kwargs`)."""
    if name.startswith("skyrl:"):
        from cadence.tasks.environments.skyrl import skyrl_factory

        return skyrl_factory(name, kwargs or {}, key)
    target = BUILT_IN.get(name, name)
    module_name, colon, attribute = target.partition(":")
    if not colon or not module_name or not attribute:
        raise ConfigError(
            f"{key}: {name!r} is neither a built-in environment ({', '.join(sorted(BUILT_IN))})"
            " nor 'package.module:factory'"
        )
    found = load_callable(target, key, name, "a callable factory")
    return cast(EnvironmentFactory, found)
