"""SkyRL-gym environments, unchanged, behind cadence's interface (an optional extra: `pip install
'cadence[skyrl]'`). `environment.name = "skyrl:gsm8k_multi_turn"` names one by its registry id,
`"skyrl:my_package.envs:MyEnv"` by its class; `environment.kwargs` gives its `env_config` (the
`env_config` table) and what else each row's `extras` holds, beside the row's answer as
`extras["reward_spec"]["ground_truth"]` (SkyRL-gym's dataset convention).

```
 SkyRL-gym (BaseTextEnv)                       cadence
 Env(env_config, extras) / skyrl_gym.make(id)  factory(prompt, seed)
 init([{"role": "user", "content": prompt}])   start() ─► the conversation it gives back
 step(action) ─► observations, reward, done    step(text) ─► Reply(the observations' text, done, reward)
 (the last step's reward)                      score() ─► Score(that reward, correct: reward >= 1)
 close()                                       close()
```

Its methods are synchronous; they run on the episode's own thread (`episode_loop.py`), so a slow
`step` holds that episode alone, and the step timeout bounds the wait for it.

Invariant: the environment's own code is never changed or re-implemented: a per-step reward is
`Reply.reward`, `done` the episode's end, the last reward the episode's score.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from cadence.config import ConfigError
from cadence.tasks.base import Prompt, Score
from cadence.tasks.environments.base import ChatMessage, Environment, EnvironmentFactory, Reply, Transcript

PREFIX = "skyrl:"
INSTALL = "SkyRL-gym is not installed: pip install 'cadence[skyrl]' (or skyrl-gym==0.4.0)"
_ROLES = ("system", "user", "assistant", "tool")


class FromSkyRL(Environment):
    """One SkyRL-gym `BaseTextEnv` (made for one row) as a cadence environment."""

    def __init__(self, env: Any, prompt: Prompt, name: str) -> None:
        self.env = env
        self.prompt = prompt
        self.name = name
        self.last_reward = 0.0

    async def start(self) -> list[ChatMessage]:
        conversation, _ = self.env.init([{"role": "user", "content": self.prompt.text}])
        return [ChatMessage(m["role"], str(m["content"])) for m in conversation if m["role"] in _ROLES]

    async def step(self, response: str) -> Reply:
        out = self.env.step(response)
        self.last_reward = float(out["reward"])
        message = "\n\n".join(str(m["content"]) for m in out.get("observations") or [])
        return Reply(message, done=bool(out["done"]), reward=self.last_reward)

    async def score(self, transcript: Transcript) -> Score:
        correct = float(self.last_reward >= 1.0)
        return Score(reward=self.last_reward, correct=correct, parts={"skyrl": self.last_reward})

    async def close(self) -> None:
        self.env.close()


def skyrl_factory(name: str, kwargs: Mapping[str, Any], key: str = "environment.name") -> EnvironmentFactory:
    """The factory of the SkyRL-gym environment `name` ("skyrl:<id>" or "skyrl:package.module:Class");
    `ConfigError` naming `key` when it does not load."""
    target = name.removeprefix(PREFIX)
    make_env = _constructor(target, name, key)
    options = dict(kwargs)
    env_config = _env_config(options.pop("env_config", {}))

    def make(prompt: Prompt, seed: int) -> Environment:
        extras = {**options, "reward_spec": {"method": "rule", "ground_truth": prompt.answer}}
        extras.setdefault("extra_info", {})
        return FromSkyRL(make_env(env_config, extras), prompt, target)

    return make


def _constructor(target: str, name: str, key: str) -> Any:
    try:
        import skyrl_gym
    except ImportError:
        raise ConfigError(f"{key} = {name!r}: {INSTALL}") from None
    if ":" in target:
        module_name, _, attribute = target.partition(":")
        try:
            found = getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"{key} = {name!r}: cannot load {target!r} ({exc})") from None
        return lambda env_config, extras: found(env_config=env_config, extras=extras)
    if target not in skyrl_gym.envs.registration.registry:
        known = ", ".join(sorted(skyrl_gym.envs.registration.registry))
        raise ConfigError(f"{key} = {name!r}: no SkyRL-gym environment {target!r}; registered: {known}")
    return lambda env_config, extras: skyrl_gym.make(target, env_config=env_config, extras=extras)


def _env_config(table: object) -> Any:
    """The `env_config` table as the OmegaConf config SkyRL-gym environments read (attribute access)."""
    from omegaconf import OmegaConf

    return OmegaConf.create(dict(table) if isinstance(table, Mapping) else {})
