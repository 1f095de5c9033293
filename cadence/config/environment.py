"""The `[environment]` section: multi-turn episodes instead of single completions, and their bounds.

Invariant: `name = ""` and `agent = ""` is the single-turn run, whatever the other keys say; with a
name or an agent (never both), every bound here becomes one field of the episodes' `Bounds`
(`cadence/tasks/environments/bounds.py`), with the same range. No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from cadence.config.fields import Rule, doc

FINITE_POSITIVE = Rule(gt=0, finite=True)


@dataclass(frozen=True)
class EnvironmentConfig:
    """Multi-turn episodes: with a `name`, each sample of a group is one episode in which the model and
    an environment (a tool, a game, a simulated user) take turns until the environment is done or a
    bound is reached; the environment's score is the sample's reward. See docs/environments.md."""

    name: str = doc(
        "",
        "empty: single-turn (one completion a sample); a built-in environment (calculator,"
        " guess_number, tool_calculator, units), a factory `package.module:factory` of your own, or a"
        " SkyRL-gym environment (`skyrl:<registry id>` or `skyrl:package.module:Class`); a name that"
        " does not load stops the run at its start",
    )
    max_turns: int = doc(8, "model turns an episode may take", Rule(ge=1))
    max_tokens: int = doc(
        1024,
        "tokens an episode may hold after its first message, the model's and the environment's together"
        " (the completion the trainer gets)",
        Rule(ge=1),
    )
    max_turn_tokens: int = doc(256, "tokens one model turn may sample", Rule(ge=1))
    step_timeout_s: float = doc(
        10.0,
        "seconds one call into the environment may take (start, step, score); a step past it becomes a"
        " message the model reads, a start or score past it an error",
        FINITE_POSITIVE,
    )
    episode_timeout_s: float = doc(
        300.0,
        "seconds of wall clock an episode may take from its first message, generation included; past"
        " them it is scored as it stands",
        FINITE_POSITIVE,
    )
    on_error: float = doc(
        0.0,
        "the reward of an episode whose environment raised, gave a wrong type or a message the"
        " tokenizer cannot take (logged as environment_failed)",
        Rule(finite=True),
    )
    agent: str = doc(
        "",
        "an agent of your own, `package.module:function`: `async def agent(client, task)` gets an"
        " `openai.AsyncOpenAI` client of the worker's endpoint and the task's row, returns the reward (or a"
        " Score); each sample is one agent run, its calls the episode's turns (with the bounds above);"
        " instead of `name`",
    )
    served_model: str = doc(
        "cadence", "agent episodes: the model name the endpoint serves (`model=` of a call)"
    )
    max_choices: int = doc(4, "agent episodes: the most choices (`n`) one call may ask for", Rule(ge=1))
    agent_sampling: Literal["run", "refuse"] = doc(
        "run",
        "agent episodes: a call asking another temperature or top_p than the run samples at"
        " (rollout.temperature and rollout.top_p; an eval batch's: the eval temperature): `run` serves it"
        " at the run's, its response's `cadence.overridden` naming what was asked otherwise; `refuse`"
        " answers 400 naming the run's value. A call asking the same, or nothing, is served either way",
    )
    agent_listen: Literal["loopback", "unix"] = doc(
        "loopback",
        "agent episodes: where the worker serves its endpoint: `loopback` (127.0.0.1, a port the system"
        " picks) or `unix` (a Unix socket in a folder only the worker's user may enter, removed with the"
        " batch; the agent's client reaches it, its path is the task's `socket`)",
    )
    max_message_chars: int = doc(
        4000,
        "an environment message (each tool result) longer than this is cut to it, with a marker the"
        " model reads ([truncated: N characters, the first M shown]), and logged",
        Rule(ge=1),
    )
    kwargs: dict[str, Any] = doc(
        {},
        "a SkyRL-gym environment's settings (environment.name = 'skyrl:...'): its `env_config` table, and"
        " every other key added to each row's `extras` (beside reward_spec.ground_truth, the row's answer)",
    )
    role: Literal["user", "tool"] = doc(
        "user",
        "the chat role the environment's messages are rendered in (tool: where the model's chat"
        " template renders tool results apart; agent episodes: the role of tool results)",
    )

    @property
    def played(self) -> bool:
        """Each sample is an episode: an environment's or an agent's."""
        return bool(self.name or self.agent)
