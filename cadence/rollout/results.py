"""A group as made and scored (`GroupSamples`), and the messages that carry it: a training group's
`GroupResult` to the trainer, an eval prompt's `EvalResult` to the dispatcher.

Invariant: every per-row list of a message (completions, log-probs, masks, truncated) lines up with its
completions, every per-sample list with its samples (`episode_of` maps rows onto samples where an
agent's episode is several rows; empty, a row is a sample); a single-turn group (or
eval answer) leaves its masks empty and its episode figures out (on the wire: left out), an episode
group fills each one a sample; texts (responses, transcripts, prompt, answer) travel only for a group
kept as a sample, and always in an eval answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from cadence.tasks.base import Score
from cadence.wire.messages import Assignment, EpisodeFigures, EvalResult, GroupResult
from cadence.wire.rows import per_sample


@dataclass(frozen=True)
class GroupSamples:
    """A group's samples: the prompt's ids, each sample's ids after it with their log-probs, its text
    and score, whether it was cut at its token limit; for episodes also which tokens the environment wrote (`masks`: 1 sampled, 0 the
    environment's; empty: every token sampled) and the episodes' figures, as the wire carries them.
    Completions, log-probs, masks and `truncated` are one a row, the rest one a sample: an agent's
    episode of several sequences is several rows (`episode_of`, `cadence.wire.rows`)."""

    prompt: list[int]
    completions: list[list[int]]
    logprobs: list[list[float]]
    texts: list[str]  # the completion's text; an episode's: the model's last turn
    scores: list[Score]
    masks: list[list[int]] = field(default_factory=list)
    episodes: EpisodeFigures | None = None
    truncated: list[bool] = field(default_factory=list)  # cut at the token limit (single-turn)
    episode_of: list[int] = field(default_factory=list)  # each completion's sample where an episode
    # is several (an agent's sequences), in order; empty: completion i is sample i


def group_result(
    job: Assignment,
    samples: GroupSamples,
    keep: bool,
    gen_s: float,
    load_s: float,
    finished_at: float,
    following: int,
    weights_from: str = "",
) -> GroupResult:
    """The `GroupResult` of `job`'s samples; `keep`: the group is kept as a sample (its texts travel);
    `weights_from`: how the worker's version came (a batch's first group says it)."""
    scores = samples.scores
    names = list(dict.fromkeys(name for s in scores for name in s.parts))  # an error episode's too
    episodes = samples.episodes
    if episodes is not None and not keep:
        episodes = msgspec.structs.replace(episodes, transcripts=[])
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
        weights_from=weights_from,
        finished_at=finished_at,
        reward_parts={name: [s.parts.get(name, 0.0) for s in scores] for name in names},
        prompt=job.prompt if keep else "",
        answer=job.answer if keep else "",
        responses=samples.texts if keep else [],
        ticket=job.ticket,
        following=following,
        masks=samples.masks,
        episodes=episodes,
        truncated=samples.truncated if any(samples.truncated) else [],
        episode_of=samples.episode_of,
    )


def eval_result(job: Assignment, samples: GroupSamples, gen_s: float) -> EvalResult:
    """The dispatcher's answer to an eval assignment: its samples' rewards, texts and lengths and, for
    episodes, their figures and messages."""
    return EvalResult(
        job.version,
        job.prompt_id,
        [s.reward for s in samples.scores],
        [s.correct for s in samples.scores],
        samples.texts,
        per_sample([len(c) for c in samples.completions], samples.episode_of, len(samples.scores)),
        gen_s,
        episodes=samples.episodes,
    )
