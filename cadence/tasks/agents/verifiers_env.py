"""A verifiers environment (verifiers 0.4.0, `verifiers.v1`) as an agent of the worker's endpoint:
each sample is one episode of the environment on the task's row, every model call of its harness
answered by the endpoint, the reward its rubric's (the task's weighted `@vf.reward`s, summed).

```python
# my_agent.py, then environment.agent = "my_agent:agent"
from cadence.tasks.agents.verifiers_env import VerifiersAgent

agent = VerifiersAgent({"taskset": {"id": "my-taskset"}})
```

```
 agent(client, task): row ─► the taskset's Task (prompt, answer) ─► Env.run_episode under env.serving()
   the harness's calls ─► verifiers' interception server ─► client.base_url with the episode's key
   episode ok ─► Score(sum of rewards, parts: each reward's value) | failed ─► raises (scored on_error)
```

Invariant: every call of the episode carries the episode's own key (verifiers reads a client's key
from an environment variable: one of its own per episode, set for the episode only), so a call after
the episode ended is refused by the endpoint like any agent's.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Mapping
from typing import Any

from cadence.tasks.base import Score

ToTask = Callable[[Any, Any], Any]


def row_task(env: Any, task: Any) -> Any:
    """The taskset's own Task type made from the row: its prompt, and its answer where the task's data
    has an `answer` field."""
    task_type = type(env.taskset).task_type()
    data_type = task_type.data_type()
    fields: dict[str, Any] = {"prompt": task.prompt}
    if "answer" in data_type.model_fields:
        fields["answer"] = task.answer
    return task_type(data_type(**fields), env.taskset.config.task)


class VerifiersAgent:
    """`async def agent(client, task) -> Score` playing one episode of the verifiers environment
    `config` describes (an `EnvConfig`, or its fields as a mapping; the agent's runtime defaults to a
    local subprocess, not verifiers' remote sandbox). `to_task(env, task)` makes the environment's task
    of cadence's row (`row_task` by default); `correct`: the reward whose score above 0 makes a sample
    correct (by default, the total above 0). The environment is loaded at the first episode."""

    def __init__(
        self, config: Mapping[str, Any] | Any, to_task: ToTask = row_task, correct: str | None = None
    ) -> None:
        self.config = config
        self.to_task = to_task
        self.correct = correct
        self.env: Any = None

    def load(self) -> Any:
        """The environment, loaded once."""
        if self.env is None:
            import verifiers.v1 as vf

            raw = dict(self.config) if isinstance(self.config, Mapping) else self.config
            if isinstance(raw, dict):
                raw.setdefault("agent", {}).setdefault("runtime", {"type": "subprocess"})
            self.env = vf.load_environment(vf.resolve_env_config(raw))
        return self.env

    async def __call__(self, client: Any, task: Any) -> Score:
        from verifiers.v1 import EvalClientConfig, ModelContext

        env = self.load()
        variable = f"CADENCE_VERIFIERS_KEY_{secrets.token_hex(8)}"
        os.environ[variable] = client.api_key
        try:
            ctx = ModelContext(
                model=task.model,
                client=EvalClientConfig(base_url=str(client.base_url), api_key_var=variable),
            )
            async with env.serving():
                episode = await env.run_episode(self.to_task(env, task), ctx)
        finally:
            os.environ.pop(variable, None)
        return episode_score(episode, self.correct)


def episode_score(episode: Any, correct: str | None = None) -> Score:
    """The rubric's reward of a finished episode: the sum of every trace's weighted rewards, each
    reward's value a part, correct when the reward `correct` scored above 0 (else the sum); an episode
    that failed raises with verifiers' errors."""
    if not episode.ok:
        errors = [e for t in episode.traces for e in t.errors] + list(episode.errors)
        said = "; ".join(f"{e.type}: {e.message}" for e in errors) or "no trace completed"
        raise RuntimeError(f"the verifiers episode failed: {said}")
    parts = {
        name: reward.value
        for trace in episode.traces
        for name, reward in trace.rewards.items()
        if reward is not None
    }
    reward = float(sum(trace.reward for trace in episode.traces))
    if correct is None:
        return Score(reward=reward, correct=float(reward > 0), parts=parts)
    scores = [t.rewards[correct].score for t in episode.traces if t.rewards.get(correct) is not None]
    return Score(reward=reward, correct=float(any(s > 0 for s in scores)), parts=parts)
