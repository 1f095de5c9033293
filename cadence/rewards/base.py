"""What a reward function is, and the registry that turns `rewards.weights` names into functions.

A reward function takes one `Sample` (prompt text, response text, reference answer, whether the
response ended on its own, and the run's reward settings) and returns a float, or an awaitable of one
(an async function is awaited). Functions register by name with `@reward("name")`, in cadence or in a
user's own module listed in `rewards.modules`; cadence never needs to be edited to add one.

Invariant: a name is registered once; `get_reward` of an unknown name raises `KeyError` naming the
known ones; importing a module of `rewards.modules` that does not exist raises `ImportError` naming it.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from cadence.config import RewardsConfig


@dataclass(frozen=True)
class Sample:
    prompt: str
    response: str
    answer: str
    finished: bool
    settings: RewardsConfig


RewardFn = Callable[[Sample], float | Awaitable[float]]

_REGISTRY: dict[str, RewardFn] = {}


def reward(name: str) -> Callable[[RewardFn], RewardFn]:
    """Register a reward function under `name`."""

    def register(fn: RewardFn) -> RewardFn:
        if name in _REGISTRY and _REGISTRY[name] is not fn:
            raise ValueError(f"reward function {name!r} is already registered")
        _REGISTRY[name] = fn
        return fn

    return register


def load_modules(modules: Iterable[str]) -> None:
    """Import cadence's own reward functions and every user module, so their names are registered."""
    for module in ("cadence.rewards.math", "cadence.rewards.shape", *modules):
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ImportError(f"rewards.modules: cannot import {module!r}: {exc}") from exc


def get_reward(name: str) -> RewardFn:
    if name not in _REGISTRY:
        raise KeyError(f"no reward function {name!r}; registered: {', '.join(sorted(_REGISTRY)) or 'none'}")
    return _REGISTRY[name]


def registered() -> list[str]:
    return sorted(_REGISTRY)
