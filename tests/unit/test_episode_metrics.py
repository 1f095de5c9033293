"""Episodes in what a run writes and shows: the period row's episode figures (left out of a single-turn
run's row), the progress line, the samples' turns with who wrote each; and a group's episodes as one
prompt and a completion each (`rollout/play.py`)."""

from __future__ import annotations

import json
from collections import deque
from typing import Any

import msgspec
import pytest

from cadence.dispatch.rounds import EvalRound
from cadence.monitor.episode_figures import episode_metrics
from cadence.monitor.metrics import PeriodStats
from cadence.monitor.period_metrics import PeriodMetrics
from cadence.monitor.progress import episode_part, period_line, status_line
from cadence.monitor.samples import sample_record
from cadence.rollout.play import episode_group, shared_prompt
from cadence.tasks.base import Prompt, Score
from cadence.tasks.environments.base import Turn
from cadence.tasks.environments.episode_record import EpisodeResult
from cadence.wire.messages import EpisodeFigures, EvalResult, GroupResult

FIGURES = {name for name in EpisodeFigures.__struct_fields__}


def played(prompt_id: int, **changes: Any) -> GroupResult:
    """A sound group of two episodes; `changes` to its fields or to its episodes' figures."""
    figures = EpisodeFigures(
        turns=[2, 1],
        tool_calls=[2, 0],
        tool_errors=[1, 0],
        env_timeouts=[1, 0],
        env_s=[0.25, 0.5],
        env_wall_s=0.5,  # the two episodes' calls overlapped
        env_tokens=[2, 0],
        endings=["done", "max_turns"],
    )
    sound = GroupResult(
        period=0,
        version=0,
        prompt_id=prompt_id,
        prompt_tokens=[1, 3],
        completions=[[5, 6, 7, 2], [5, 2]],
        logprobs=[[-1.0, 0.0, 0.0, -1.0], [-1.0, -1.0]],
        rewards=[1.0, 0.0],
        correct=[1.0, 0.0],
        gen_s=0.5,
        load_s=0.0,
        finished_at=1.0,
        masks=[[1, 0, 0, 1], [1, 1]],
        episodes=msgspec.structs.replace(figures, **{k: v for k, v in changes.items() if k in FIGURES}),
    )
    return msgspec.structs.replace(sound, **{k: v for k, v in changes.items() if k not in FIGURES})


def single_turn(msg: GroupResult) -> GroupResult:
    """`msg` as a single-turn group: no masks, no episode figures."""
    return msgspec.structs.replace(msg, masks=[], episodes=None)


def test_the_episode_figures_of_a_period() -> None:
    figures = episode_metrics([played(0).episodes, played(1, endings=["done", "error"]).episodes])
    assert figures == {
        "turns_mean": 1.5,
        "tool_calls": 4,
        "tool_errors": 2,
        "env_timeouts": 2,
        "env_s": 1.5,
        "env_wall_s": 1.0,
        "env_tokens": 4,
        "endings": {"done": 2, "error": 1, "max_turns": 1},
    }
    assert episode_metrics([single_turn(played(2)).episodes]) == {}
    # the turns' own rewards: a mean over the turns that got one
    rewarded = played(3, turn_rewards=[[1.0, None], [0.0]])
    figures = episode_metrics(
        [played(0).episodes, rewarded.episodes, played(4, turn_rewards=[[None, 0.5], []]).episodes]
    )
    assert figures["turn_reward_mean"] == 0.5


def _row(*groups: GroupResult) -> PeriodMetrics:
    stats = PeriodStats(period=0, start=0.0)
    for msg in groups:
        stats.arrived(1.0, "w0", msg)
    return stats.finish(end=2.0, publish_s=0.5)


def test_the_row_of_an_episode_run_and_its_round_trip() -> None:
    metrics = _row(played(0), played(1))
    row = metrics.to_row()
    assert (row["turns_mean"], row["tool_calls"], row["env_tokens"]) == (1.5, 4, 4)
    assert (row["ended_done"], row["ended_max_turns"]) == (2, 2) and "endings" not in row
    assert row["tokens_generated"] == 12 - 4 and row["response_len_mean"] == 3.0  # sampled; all
    assert PeriodMetrics.from_row(row) == metrics and PeriodMetrics.from_row(row).to_row() == row
    assert json.loads(json.dumps(row)) == row
    single = _row(single_turn(played(0))).to_row()
    assert not {"turns_mean", "tool_calls", "env_s", "env_tokens"} & set(single)
    assert not [key for key in single if key.startswith("ended_")]


def test_the_progress_line_shows_episodes_only_for_an_episode_run() -> None:
    metrics = _row(played(0), played(1))
    line = period_line(metrics, 10)
    assert (metrics.env_wall_s, metrics.env_s) == (1.0, 1.5)  # each figure after its own label
    assert "turns 1.50  tools 4 (2 err)  env wall 1.00s episodes 1.50s tokens 4  timeouts 2" in line
    assert "turns 1.50" in status_line(1, 10, 0, 4, metrics, 1.0)
    single = PeriodMetrics.from_row({"period": 0})
    assert "turns" not in period_line(single, 10) and "turns" not in status_line(1, 10, 0, 4, single, 1.0)


def test_a_kept_episode_group_writes_every_turn_with_its_author() -> None:
    msg = played(
        0,
        prompt="3+4",
        answer="7",
        responses=["7", "8"],
        transcripts=[["3+4?", "<calc>3+4</calc>", "<result>7</result>", "7"], ["3+4?", "8"]],
    )
    record = sample_record(msg)
    first = record["responses"][0]
    assert [m["author"] for m in first["messages"]] == ["environment", "model", "environment", "model"]
    assert first["messages"][2]["text"] == "<result>7</result>"
    assert (first["turns"], first["ended"], first["tool_calls"], first["env_tokens"]) == (2, "done", 2, 2)
    assert record["reward_mean"] == 0.5
    bare = sample_record(played(0, prompt="3+4", answer="7", responses=["7", "8"]))  # kept without its turns
    assert "messages" not in bare["responses"][0] and "turn_rewards" not in first
    assert msg.episodes is not None
    with_rewards = msgspec.structs.replace(msg.episodes, turn_rewards=[[1.0, None], [0.0]])
    rewarded = sample_record(msgspec.structs.replace(msg, episodes=with_rewards))
    assert [r["turn_rewards"] for r in rewarded["responses"]] == [[1.0, None], [0.0]]


def test_an_eval_rounds_samples_hold_the_episodes_turns() -> None:
    prompt = Prompt(-1, "q", "7")
    r = EvalRound(3, deque([prompt]), 0.0)
    r.give(b"a", 1)
    r.answer(EvalResult(3, -1, [1.0], [1.0], ["7"], [1], episodes=EpisodeFigures(transcripts=[["q", "7"]])))
    (sample,) = r.samples()
    assert sample["responses"][0]["messages"] == [
        {"author": "environment", "text": "q"},
        {"author": "model", "text": "7"},
    ]


def _result(
    prompt: list[int],
    tokens: list[int],
    mask: list[int],
    ended: str = "done",
    rewards: list[float | None] | None = None,
) -> EpisodeResult:
    turns = [Turn("environment", "q", len(prompt))] if prompt else []
    if tokens:
        turns.append(Turn("model", "a", sum(mask)))
    return EpisodeResult(
        prompt_id=1, seed=0, prompt_tokens=prompt, tokens=tokens, mask=mask,
        logprobs=[-0.5 if m else 0.0 for m in mask], turns=turns, turn_rewards=rewards or [],
        score=Score(1.0, 1.0, {"answer": 1.0}), ended=ended, finished=True, tool_calls=0,  # type: ignore[arg-type]
        tool_errors=0, timeouts=0, env_seconds=0.0, env_tokens=mask.count(0),
    )  # fmt: skip


def test_a_groups_episodes_share_one_prompt_and_each_keeps_its_own_ids() -> None:
    assert shared_prompt([[1, 2, 3], [1, 2, 4], [1, 2]]) == [1, 2] and shared_prompt([[5]]) == [5]
    group = episode_group(
        [
            _result([1, 2, 3], [7, 8, 2], [1, 0, 1]),
            _result([1, 2, 4], [9], [1]),  # another first message: its own ids begin its completion
            _result([], [], [], "error"),  # failed to start: one environment token
            _result([1, 2, 3], [], [], "context"),  # no room for a model token
        ],
        fallback=[1, 5],
        eos_id=2,
    )
    assert group.prompt == [1, 2]
    assert group.completions == [[3, 7, 8, 2], [4, 9], [2], [3]]
    assert group.episodes is not None
    assert group.masks == [[0, 1, 0, 1], [0, 1], [0], [0]]
    assert group.logprobs == [[0.0, -0.5, 0.0, -0.5], [0.0, -0.5], [0.0], [0.0]]
    assert group.episodes.endings == ["done", "done", "error", "context"] and group.texts == [
        "a",
        "a",
        "",
        "",
    ]
    assert group.episodes.turn_rewards == []  # no turn got a reward: none on the wire
    rewarded = episode_group([_result([1], [7], [1], rewards=[0.5]), _result([1], [7], [1])], [1], eos_id=2)
    assert rewarded.episodes is not None and rewarded.episodes.turn_rewards == [[0.5], []]
    failed = episode_group([_result([], [], [], "error")] * 2, fallback=[1, 5], eos_id=2)
    assert failed.prompt == [1, 5] and failed.completions == [[2], [2]]
    with pytest.raises(ValueError, match="share no first token"):
        episode_group([_result([1, 2], [7], [1]), _result([3, 2], [7], [1])], fallback=[1], eos_id=2)


def test_agent_episodes_add_their_calls_figures_and_others_do_not() -> None:
    agents = EpisodeFigures(
        turns=[2, 3],
        endings=["done", "done"],
        sequences=[1, 2],
        call_tokens=[10, 20],
        call_s=[0.5, 1.0],
    )
    figures = episode_metrics([agents, None])
    assert figures["sequences_mean"] == 1.5 and figures["rewrites"] == 1
    assert figures["sequences_max"] == 2 and figures["rewrite_share"] == 0.5
    assert figures["call_tokens_mean"] == 6.0 and figures["call_s_mean"] == 0.3
    assert "sequences_mean" not in episode_metrics([EpisodeFigures(turns=[2], endings=["done"])])
    row = PeriodMetrics(turns_mean=2.5, sequences_mean=1.5, sequences_max=2, rewrites=1, rewrite_share=0.5)
    assert row.to_row()["sequences_max"] == 2 and row.to_row()["rewrite_share"] == 0.5
    assert row.to_row()["rewrites"] == 1 and "call_s_mean" not in row.to_row()
    assert "sequences 1.50 (max 2, 50% rewritten)" in episode_part(row)
    assert "sequences" not in episode_part(PeriodMetrics(turns_mean=2.5))  # an environment's episodes
