"""A batch's samples as the messages that carry them: a training group's `GroupResult` to the trainer,
an eval prompt's `EvalResult` to the dispatcher.

Invariant: every per-sample list of a message lines up with its completions; a single-turn group (or
eval answer) leaves every episode field empty (on the wire: left out), an episode group fills each one
a sample; texts (responses, transcripts, prompt, answer) travel only for a group kept as a sample.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cadence.tasks.base import Score
from cadence.wire.messages import Assignment, EvalResult, GroupResult


@dataclass(frozen=True)
class EpisodeFigures:
    """A group's episodes beyond their ids: masks, figures and messages, one a sample."""

    masks: list[list[int]]  # 1: sampled by the model; 0: the environment's
    turns: list[int]
    tool_calls: list[int]
    tool_errors: list[int]
    env_timeouts: list[int]
    env_s: list[float]
    endings: list[str]
    transcripts: list[list[str]] = field(
        default_factory=list
    )  # the first message, then model, environment, ...
    turn_rewards: list[list[float | None]] = field(default_factory=list)  # empty: no turn got one

    @property
    def env_tokens(self) -> list[int]:
        """Each episode's environment tokens (its mask's zeros)."""
        return [mask.count(0) for mask in self.masks]

    def fields(self, keep_texts: bool) -> dict[str, Any]:
        """The `GroupResult` fields (the messages only of a group kept as a sample)."""
        return {
            "masks": self.masks,
            "turns": self.turns,
            "tool_calls": self.tool_calls,
            "tool_errors": self.tool_errors,
            "env_timeouts": self.env_timeouts,
            "env_s": self.env_s,
            "endings": self.endings,
            "transcripts": self.transcripts if keep_texts else [],
            "turn_rewards": self.turn_rewards,
        }


@dataclass(frozen=True)
class GroupSamples:
    """A group's samples: the prompt's ids, each sample's ids after it with their log-probs, its text
    and score; for episodes also the figures."""

    prompt: list[int]
    completions: list[list[int]]
    logprobs: list[list[float]]
    texts: list[str]  # the completion's text; an episode's: the model's last turn
    scores: list[Score]
    episodes: EpisodeFigures | None = None


def group_result(
    job: Assignment,
    samples: GroupSamples,
    keep: bool,
    gen_s: float,
    load_s: float,
    finished_at: float,
    following: int,
) -> GroupResult:
    """The `GroupResult` of `job`'s samples; `keep`: the group is kept as a sample (its texts travel)."""
    scores = samples.scores
    names = list(dict.fromkeys(name for s in scores for name in s.parts))  # an error episode's too
    episodes = samples.episodes.fields(keep) if samples.episodes is not None else {}
    return GroupResult(
        period=job.period,
        version=job.version,
        prompt_id=job.prompt_id,
        prompt_tokens=samples.prompt,
        completions=samples.completions,
        logprobs=samples.logprobs,
        rewards=[s.reward for s in scores],
        correct=[s.correct for s in scores],
        gen_s=gen_s,
        load_s=load_s,
        finished_at=finished_at,
        reward_parts={name: [s.parts.get(name, 0.0) for s in scores] for name in names},
        prompt=job.prompt if keep else "",
        answer=job.answer if keep else "",
        responses=samples.texts if keep else [],
        ticket=job.ticket,
        following=following,
        **episodes,
    )


def eval_result(job: Assignment, result: GroupResult) -> EvalResult:
    """The dispatcher's answer to an eval assignment, from the group generated for it: its samples and,
    for episodes, their figures (each episode's environment tokens in place of its mask); a
    single-turn group's are empty."""
    return EvalResult(
        job.version,
        job.prompt_id,
        result.rewards,
        result.correct,
        result.responses,
        [len(c) for c in result.completions],
        result.gen_s,
        result.transcripts,
        turns=result.turns,
        tool_calls=result.tool_calls,
        tool_errors=result.tool_errors,
        env_timeouts=result.env_timeouts,
        env_s=result.env_s,
        env_tokens=result.env_tokens,
        endings=result.endings,
        turn_rewards=result.turn_rewards,
    )
