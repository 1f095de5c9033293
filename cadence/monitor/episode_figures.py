"""A period's multi-turn episodes in figures: turns, tool calls and errors, environment timeouts,
seconds and tokens, and why episodes ended, from the `EpisodeFigures` of the groups the trainer
accepted (or, for an eval round, of the answers of its prompts; for `cadence eval`, of the groups a
checkpoint played).

Invariant: a pure function of the groups; single-turn groups (no episode figures) give nothing, so a
single-turn run's period and eval rows keep exactly their keys.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from cadence.wire.messages import EpisodeFigures


def episode_metrics(groups: Sequence[EpisodeFigures | None]) -> dict[str, Any]:
    """The `PeriodMetrics` fields of the episodes among `groups`' figures (None: a single-turn group;
    each figure one a sample, checked by
    `wire/meaning.py`): model turns an episode (mean), tool calls and errors, environment timeouts,
    seconds in environment calls (each episode's, `env_s`; the workers' wall seconds in which any ran,
    `env_wall_s`) and environment tokens (the masks' zeros), summed over the groups,
    and episodes by ending; the mean of the turns' own rewards when any turn got one (`Reply.reward`);
    {} when no group holds an episode."""
    played = [g for g in groups if g is not None and g.turns]
    episodes = sum(len(g.turns) for g in played)
    if not episodes:
        return {}
    endings = Counter(ending for g in played for ending in g.endings)
    given = [r for g in played for rewards in g.turn_rewards for r in rewards if r is not None]
    rewarded = {"turn_reward_mean": sum(given) / len(given)} if given else {}
    return (
        rewarded
        | _calls(played)
        | {
            "turns_mean": sum(sum(g.turns) for g in played) / episodes,
            "tool_calls": sum(sum(g.tool_calls) for g in played),
            "tool_errors": sum(sum(g.tool_errors) for g in played),
            "env_timeouts": sum(sum(g.env_timeouts) for g in played),
            "env_s": sum(sum(g.env_s) for g in played),
            "env_wall_s": sum(g.env_wall_s for g in played),
            "env_tokens": sum(sum(g.env_tokens) for g in played),
            "endings": dict(sorted(endings.items())),
        }
    )


def _calls(played: Sequence[EpisodeFigures]) -> dict[str, Any]:
    """Agent episodes' figures (`environment.agent`): sequences an episode (mean, most), episodes of
    more than one sequence (a rewritten history, or an `n > 1` call's other choices: every sequence is
    trained) and their share of the episodes, tokens a call and seconds a call (means); {} for others."""
    agents = [g for g in played if g.sequences]
    calls = sum(sum(g.turns) for g in agents)
    if not agents:
        return {}
    episodes = sum(len(g.sequences) for g in agents)
    return {
        "sequences_mean": sum(sum(g.sequences) for g in agents) / episodes,
        "sequences_max": max(n for g in agents for n in g.sequences),
        "rewrites": sum(n > 1 for g in agents for n in g.sequences),
        "rewrite_share": sum(n > 1 for g in agents for n in g.sequences) / episodes,
        "call_tokens_mean": sum(sum(g.call_tokens) for g in agents) / calls if calls else 0.0,
        "call_s_mean": sum(sum(g.call_s) for g in agents) / calls if calls else 0.0,
    }
