"""A user's Python object named in a config as `package.module:attribute`, loaded when a run starts.

Invariant: a name that cannot be loaded raises `ConfigError` naming the key, the name and why (the
module that does not import, the attribute it lacks, the value that is not callable).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from cadence.config.fields import ConfigError


def load_callable(target: str, key: str, name: str, what: str) -> Callable[..., Any]:
    """The callable `target` (`package.module:attribute`, dotted attributes allowed) names; `name`:
    how the config wrote it, `what`: what it must be (in the error: "a callable factory")."""
    module_name, _, attribute = target.partition(":")
    try:
        found: object = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{key}: cannot import {module_name!r} for {name!r}: {exc}") from exc
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise ConfigError(f"{key}: {module_name!r} has no {attribute!r}")
        found = getattr(found, part)
    if not callable(found):
        raise ConfigError(f"{key}: {name!r} is a {type(found).__name__}, not {what}")
    return found
