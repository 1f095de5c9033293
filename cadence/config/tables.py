"""Plain tables (TOML or JSON, with `--set` overrides applied) read into the configuration's dataclasses.

Invariant: one walk over the dataclass fields and their type hints, no per-section code: a key the
dataclass does not declare, a value not of its field's type (an int is taken for a float, a bool is no
int), a choice outside its `Literal` raise `ConfigError` naming the full dotted key.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Literal, get_args, get_origin

from cadence.config.fields import ConfigError


def from_dict(cls: type[Any], data: Any, prefix: str = "") -> Any:
    """An instance of dataclass `cls` from table `data`; keys left out keep their defaults."""
    where = prefix.rstrip(".") or "config"
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must be a table, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for key in data:
        if key not in names:
            raise ConfigError(f"unknown key {prefix + key!r}; allowed here: {', '.join(sorted(names))}")
    kwargs = {name: typed(hints[name], value, prefix + name) for name, value in data.items()}
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from None


def typed(hint: Any, value: Any, key: str) -> Any:
    """`value` as type `hint` wants it, or `ConfigError` naming `key`."""
    origin = get_origin(hint)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return from_dict(hint, value, key + ".")
    if origin is Literal:
        return _choice(get_args(hint), value, key)
    if origin is dict:
        key_type, value_type = get_args(hint)
        if not isinstance(value, dict):
            raise ConfigError(f"{key} must be a table, got {value!r}")
        return {typed(key_type, k, key): typed(value_type, v, f"{key}.{k}") for k, v in value.items()}
    if origin is list:
        (item_type,) = get_args(hint)
        if not isinstance(value, list):
            raise ConfigError(f"{key} must be a list, got {value!r}")
        return [typed(item_type, v, f"{key}[{i}]") for i, v in enumerate(value)]
    return _scalar(hint, value, key)


def _choice(allowed: tuple[Any, ...], value: Any, key: str) -> Any:
    if value not in allowed:
        raise ConfigError(f"{key} = {value!r} is not allowed; choose one of {', '.join(map(repr, allowed))}")
    return value


def _scalar(hint: Any, value: Any, key: str) -> Any:
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint in (int, float, str, bool) and (
        not isinstance(value, hint) or (hint is int and isinstance(value, bool))
    ):
        raise ConfigError(f"{key} must be {hint.__name__}, got {value!r}")
    return value
