"""The meaning checks after the codec: each well-formed but meaningless message gets a reason; every
sound one gets None. The values are run through the codec first, as an actor would see them: a value
outside its type's own range (a negative version, count or token id) never gets past the codec."""

from __future__ import annotations

import math
import typing
from typing import Any

import msgpack
import msgspec
import pytest

from cadence.tasks.environments.base import Ending
from cadence.wire.meaning import (
    ENDINGS,
    MAX_CREDITS,
    GroupBounds,
    eval_result_problem,
    group_problem,
    plain_json,
    run_done_problem,
    upload_problem,
    version_ready_problem,
    work_request_problem,
)
from cadence.wire.messages import (
    DecodeError,
    EpisodeFigures,
    EvalResult,
    GroupResult,
    Message,
    RunDone,
    VersionReady,
    WeightUpload,
    WorkRequest,
    decode_frames,
    encode_frames,
)

VOCAB = 12
BOUNDS = GroupBounds(VOCAB)


def wire(msg: Message) -> Any:
    """`msg` as the actor receives it: encoded and decoded."""
    return decode_frames(encode_frames(msg, "peer", "run")).message


def wire_of(msg: Message) -> VersionReady:
    assert isinstance(msg, VersionReady)
    return msg


def group(**changes: Any) -> GroupResult:
    sound = GroupResult(
        period=2,
        version=2,
        prompt_id=5,
        prompt_tokens=[1, 2, 3],
        completions=[[4, 11], [5]],
        logprobs=[[-0.5, -1.0], [-2.0]],
        rewards=[1.0, 0.0],
        correct=[1.0, 0.0],
        gen_s=0.1,
        load_s=0.0,
        finished_at=1.0,
        reward_parts={"task": [1.0, 0.0]},
        responses=["a", "b"],
    )
    return msgspec.structs.replace(sound, **changes)


def test_a_sound_group_passes() -> None:
    assert group_problem(wire(group()), BOUNDS) is None
    assert group_problem(wire(group(responses=[])), BOUNDS) is None  # texts are kept for some groups only


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"completions": [], "logprobs": [], "rewards": [], "correct": []}, "no completions"),
        ({"rewards": [1.0]}, "2 rows but 1 samples, and no episode_of"),
        ({"rewards": [], "correct": []}, "no samples"),
        ({"logprobs": [[-0.5, -1.0]]}, "'logprobs': 1"),
        ({"correct": [1.0, 0.0, 0.0]}, "2 rewards but {'correct': 3}"),
        ({"reward_parts": {"task": [1.0]}}, "'reward_parts[task]': 1"),
        ({"responses": ["a"]}, "'responses': 1"),
        ({"logprobs": [[-0.5], [-2.0]]}, "completion 0: 2 tokens but 1 log-probs"),
        ({"completions": [[4, 12], [5]]}, "completion 0: a token id outside the vocabulary of 12"),
        ({"prompt_tokens": [1, 99]}, "prompt: a token id outside the vocabulary"),
        ({"logprobs": [[-0.5, math.nan], [-2.0]]}, "completion 0: a log-prob that is not finite"),
        ({"logprobs": [[-0.5, -1.0], [-math.inf]]}, "completion 1: a log-prob that is not finite"),
        ({"rewards": [math.nan, 0.0]}, "not finite"),
        ({"correct": [math.inf, 0.0]}, "not finite"),
        ({"reward_parts": {"task": [1.0, math.nan]}}, "not finite"),
        ({"gen_s": math.nan}, "not finite"),
    ],
)
def test_a_meaningless_group_is_refused_with_its_reason(changes: dict[str, Any], reason: str) -> None:
    problem = group_problem(wire(group(**changes)), BOUNDS)
    assert problem is not None and reason in problem


FIGURES = set(EpisodeFigures.__struct_fields__)


def episodes(**changes: Any) -> GroupResult:
    """A sound group of two episodes: the first sampled a token, then the environment wrote one."""
    figures = EpisodeFigures(
        turns=[2, 1],
        tool_calls=[1, 0],
        tool_errors=[1, 0],
        env_timeouts=[0, 0],
        env_s=[0.25, 0.0],
        env_tokens=[1, 0],
        endings=["max_turns", "done"],
        transcripts=[["first", "a", "[calc]"], ["first", "b"]],
    )
    figures = msgspec.structs.replace(figures, **{k: v for k, v in changes.items() if k in FIGURES})
    sound = group(logprobs=[[-0.5, 0.0], [-2.0]], masks=[[1, 0], [1]], episodes=figures)
    return msgspec.structs.replace(sound, **{k: v for k, v in changes.items() if k not in FIGURES})


def test_a_sound_episode_group_passes() -> None:
    assert group_problem(wire(episodes()), BOUNDS) is None
    assert group_problem(wire(episodes(transcripts=[], env_s=[])), BOUNDS) is None  # each list may be empty
    # an episode the environment ended before the model's first token: one environment token, no 1
    ended = episodes(
        completions=[[4, 11], [2]], logprobs=[[-0.5, 0.0], [0.0]], masks=[[1, 0], [0]], env_tokens=[1, 1]
    )
    assert group_problem(wire(ended), BOUNDS) is None
    # turn rewards: one list an episode, at most its model turns long, a turn without one None
    assert group_problem(wire(episodes(turn_rewards=[[1.0, None], []])), BOUNDS) is None


def test_the_endings_are_the_runners() -> None:
    assert set(typing.get_args(Ending)) == ENDINGS


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"masks": [[1, 0]]}, "2 completions but {'masks': 1}"),
        ({"masks": [[1], [1]]}, "completion 0: 2 tokens but a mask of 1"),
        (
            {"completions": [[4, 11], []], "logprobs": [[-0.5, 0.0], []], "masks": [[1, 0], []]},
            "completion 1: no token (an episode's completion holds at least one)",
        ),
        ({"masks": [[1, 2], [1]]}, "completion 0: a mask value other than 0 (environment) or 1"),
        ({"logprobs": [[-0.5, -1.0], [-2.0]]}, "completion 0: an environment token (mask 0) with a log-prob"),
        ({"turns": [1]}, "2 samples but {'turns': 1}"),
        ({"tool_calls": [1, 0, 0]}, "'tool_calls': 3"),
        ({"env_timeouts": [0]}, "'env_timeouts': 1"),
        ({"endings": ["done"]}, "'endings': 1"),
        ({"transcripts": [["first"]]}, "'transcripts': 1"),
        ({"env_s": [math.nan, 0.0]}, "an environment time that is not finite and non-negative"),
        ({"env_s": [-0.5, 0.0]}, "an environment time that is not finite and non-negative"),
        ({"tool_errors": [2, 0]}, "more tool errors than tool calls"),
        ({"endings": ["done", "bored"]}, "an ending outside"),
        ({"turn_rewards": [[1.0]]}, "2 samples but {'turn_rewards': 1}"),
        ({"turn_rewards": [[1.0, 0.0, 1.0], []]}, "episode 0: 3 turn rewards for 2 model turns"),
        ({"turn_rewards": [[1.0], [math.inf]]}, "episode 1: a turn reward that is not finite"),
        ({"env_tokens": [0, 0]}, "environment tokens other than the masks' zeros"),
        ({"call_s": [0.1, -1.0]}, "a call time that is not finite and non-negative"),
        ({"call_s": [0.1, math.nan]}, "a call time that is not finite and non-negative"),
        ({"sequences": [1]}, "2 samples but {'sequences': 1}"),
        ({"call_tokens": [3, 1, 2]}, "2 samples but {'call_tokens': 3}"),
    ],
)
def test_a_meaningless_episode_group_is_refused_with_its_reason(changes: dict[str, Any], reason: str) -> None:
    problem = group_problem(wire(episodes(**changes)), BOUNDS)
    assert problem is not None and reason in problem


def test_an_eval_answer_has_a_transcript_a_sample_or_none() -> None:
    answer = EvalResult(
        0, -1, [1.0], [1.0], ["a"], [1], episodes=EpisodeFigures(transcripts=[["first", "a"]])
    )
    assert eval_result_problem(wire(answer), 1) is None
    two = msgspec.structs.replace(answer, episodes=EpisodeFigures(transcripts=[["first", "a"], ["x"]]))
    assert "'transcripts': 2" in str(eval_result_problem(wire(two), 1))


def episode_answer(**changes: Any) -> EvalResult:
    """A sound eval answer of two episodes, with their figures."""
    figures = EpisodeFigures(
        transcripts=[["first", "a", "[calc]"], ["first", "b"]],
        turns=[2, 1],
        tool_calls=[1, 0],
        tool_errors=[1, 0],
        env_timeouts=[0, 0],
        env_s=[0.25, 0.0],
        env_tokens=[2, 1],
        endings=["max_turns", "error"],
        turn_rewards=[[1.0, None], []],
    )
    sound = EvalResult(
        version=2,
        prompt_id=-1,
        rewards=[1.0, 0.0],
        correct=[1.0, 0.0],
        responses=["a", "b"],
        tokens=[4, 1],
        episodes=msgspec.structs.replace(figures, **changes),
    )
    return sound


def test_a_sound_eval_answer_of_episodes_passes_and_a_single_turn_one_carries_none_of_their_figures() -> None:
    assert eval_result_problem(wire(episode_answer()), 2) is None
    assert (
        eval_result_problem(wire(episode_answer(env_s=[], turn_rewards=[])), 2) is None
    )  # each may be empty
    single = EvalResult(2, -1, [1.0, 0.0], [1.0, 0.0], ["a", "b"], [4, 1])
    assert msgpack.unpackb(encode_frames(single, "peer", "run")[0])["body"].keys() == {
        "type",
        "version",
        "prompt_id",
        "rewards",
        "correct",
        "responses",
        "tokens",
    }


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"turns": [1]}, "2 samples expected but {'turns': 1}"),
        ({"tool_calls": [1, 0, 0]}, "'tool_calls': 3"),
        ({"tool_errors": [0]}, "'tool_errors': 1"),
        ({"env_timeouts": [0]}, "'env_timeouts': 1"),
        ({"env_s": [0.5]}, "'env_s': 1"),
        ({"env_tokens": [2]}, "'env_tokens': 1"),
        ({"endings": ["done"]}, "'endings': 1"),
        ({"turn_rewards": [[1.0]]}, "'turn_rewards': 1"),
        ({"env_s": [math.nan, 0.0]}, "an environment time that is not finite and non-negative"),
        ({"env_s": [0.25, -0.5]}, "an environment time that is not finite and non-negative"),
        ({"env_s": [math.inf, 0.0]}, "an environment time that is not finite and non-negative"),
        ({"tool_errors": [2, 0]}, "more tool errors than tool calls"),
        ({"env_tokens": [5, 1]}, "more environment tokens than tokens"),
        ({"endings": ["done", "bored"]}, "an ending outside"),
        ({"turn_rewards": [[1.0, 0.0, 1.0], []]}, "episode 0: 3 turn rewards for 2 model turns"),
        ({"turn_rewards": [[1.0], [math.nan]]}, "episode 1: a turn reward that is not finite"),
    ],
)
def test_a_meaningless_eval_answer_of_episodes_is_refused_with_its_reason(
    changes: dict[str, Any], reason: str
) -> None:
    problem = eval_result_problem(wire(episode_answer(**changes)), 2)
    assert problem is not None and reason in problem, problem


@pytest.mark.parametrize(
    ("msg", "field"),
    [
        (group(completions=[[4, 11], [-1]]), "completions[1][0]"),
        (episodes(masks=[[1, -1], [1]]), "masks[0][1]"),
        (episodes(turns=[-1, 0]), "episodes.turns[0]"),
        (episode_answer(env_tokens=[2, -1]), "episodes.env_tokens[1]"),
        (episode_answer(tool_calls=[-1, 0]), "episodes.tool_calls[0]"),
        (group(following=-1), "following"),
        (VersionReady(-1, "s", 1), "version"),
        (VersionReady(1, "s", -3), "nbytes"),
        (WorkRequest(-1), "credits"),
        (WeightUpload(1, -1, 3, "d", b"x" * 4), "index"),
        (WeightUpload(-2, 0, 1, "d", b"x"), "version"),
    ],
)
def test_a_value_outside_its_types_range_is_refused_by_the_codec(msg: Message, field: str) -> None:
    with pytest.raises(DecodeError) as info:
        wire(msg)
    assert info.value.reason.endswith(f"at `$.{field}`") and info.value.type_tag == msg.TAG


def test_versions_are_in_the_run_and_metrics_plain_json() -> None:
    row = {"period": 3, "reward_mean": 0.5, "spans": [[1.0, 2.0]], "reward_fn": {"a": None}}

    def problem(msg: VersionReady, periods: int = 5) -> str | None:  # a dispatcher that has seen none
        return version_ready_problem(wire(msg), periods, published=-1, first=True)

    assert problem(VersionReady(4, "s", 10, row)) is None
    assert problem(VersionReady(5, "s", 10)) is None  # the last one
    assert problem(VersionReady(6, "s", 1)) == "version 6 outside the run's 0..5"
    ext = msgpack.ExtType(5, b"\x00\x01")
    frames = encode_frames(VersionReady(1, "s", 1), "trainer", "run")
    header = msgpack.unpackb(frames[0])
    header["body"]["metrics"] = {"reward_mean": ext}  # what a forger can put on the wire
    forged = wire_of(decode_frames([msgpack.packb(header)]).message)
    assert "not plain JSON" in str(version_ready_problem(forged, 5, -1, True))
    for bad in (b"bytes", ext, {1: 2}, [[[[[[[[[[[1]]]]]]]]]]], {"x": {b"k"}}):
        assert not plain_json(bad), bad
    assert plain_json({"a": [1, 2.5, "x", None, True, {"b": math.nan}]})


@pytest.mark.parametrize(
    ("version", "first", "allowed"),
    [
        (4, False, True),  # the next
        (3, False, True),  # the same again
        (5, False, False),  # a jump
        (60, False, False),  # the jump to the end that once ended a run
        (2, False, False),  # back, from a trainer that announced before
        (2, True, True),  # back: a resumed trainer's first announcement, from its checkpoint
        (0, True, True),
        (4, True, True),  # its checkpoint was written just before it announced the next
        (5, True, False),  # never beyond the next
    ],
)
def test_a_version_follows_the_last_one_announced(version: int, first: bool, allowed: bool) -> None:
    problem = version_ready_problem(wire(VersionReady(version, "s", 1)), periods=60, published=3, first=first)
    assert (problem is None) == allowed, problem


def test_the_run_is_done_only_at_its_last_version_announced_by_the_same_trainer() -> None:
    assert run_done_problem(wire(RunDone(5, "s", "c")), periods=5, announced=5) is None
    assert "the run ends at 5" in str(run_done_problem(wire(RunDone(4, "s", "c")), periods=5, announced=5))
    assert "not announced by this trainer" in str(
        run_done_problem(wire(RunDone(5, "s", "c")), 5, announced=3)
    )
    assert "its last announced is -1" in str(run_done_problem(wire(RunDone(5, "s", "c")), 5, announced=-1))


def test_credits_are_bounded() -> None:
    assert work_request_problem(wire(WorkRequest(4))) is None
    assert work_request_problem(wire(WorkRequest(MAX_CREDITS + 1))) is not None


def test_uploads_fit_the_limits_and_their_chunks() -> None:
    def upload(index: int, chunks: int, size: int) -> str | None:
        msg = wire(WeightUpload(1, index, chunks, "d", b"x" * size))
        return upload_problem(msg, chunk_bytes=10, max_bytes=100)

    assert upload(0, 3, 10) is None and upload(2, 3, 4) is None and upload(0, 1, 0) is None
    assert upload(0, 10, 10) is None  # exactly the limit
    assert "1099511627776 chunks, at most 10" in str(upload(0, 1 << 40, 10))
    assert "0 chunks" in str(upload(0, 0, 0))
    assert "chunk 3 of 3" in str(upload(3, 3, 4))
    assert "chunk 0 of 4 bytes" in str(upload(0, 3, 4))  # only the last may be short
    assert "chunk 2 of 11 bytes" in str(upload(2, 3, 11))


def test_a_consumed_names_the_open_period_or_an_older_one_and_no_group_twice() -> None:
    from cadence.wire.meaning import consumed_problem
    from cadence.wire.messages import Consumed

    assert consumed_problem(Consumed(3, [1, 2], filtered=[2], closed=True), period=3) is None
    assert consumed_problem(Consumed(2, [1]), period=3) is None  # an older period's: changes nothing
    assert consumed_problem(Consumed(4, [1]), period=3) == "period 4 is not open (the open one is 3)"
    assert consumed_problem(Consumed(3, [1, 1]), period=3) == "a prompt id named twice"
    assert consumed_problem(Consumed(3, [1], filtered=[5, 5]), period=3) == "a prompt id named twice"


def test_a_group_is_held_to_the_runs_sizes_before_any_tensor_is_made() -> None:
    bounds = GroupBounds(VOCAB, samples=2, completion_tokens=4, positions=7, text_chars=10)
    fits = group(completions=[[1, 2, 3, 4], [2]], logprobs=[[-1.0] * 4, [-1.0]], responses=["a", "b"])
    assert group_problem(wire(fits), bounds) is None
    cases: dict[str, dict[str, Any]] = {
        "3 samples, the run's groups have 2 (rollout.group_size)": dict(
            completions=[[1], [2], [3]], logprobs=[[-1.0]] * 3, rewards=[0.0] * 3, correct=[0.0] * 3
        ),
        "a completion of 5 tokens, beyond the run's token limit of 4": dict(
            completions=[[1] * 5, [2]], logprobs=[[-1.0] * 5, [-1.0]]
        ),
        "a text of 11 characters, beyond the run's 10": dict(responses=["a" * 11, "b"]),
    }
    for reason, changes in cases.items():
        assert group_problem(wire(group(**changes)), bounds) == reason
    long_prompt = group(
        prompt_tokens=[1, 2, 3, 4], completions=[[1, 2, 3, 4], [2]], logprobs=[[-1.0] * 4, [-1.0]]
    )
    assert group_problem(wire(long_prompt), bounds) == (
        "a prompt of 4 tokens and a completion of 4: beyond the model's 7 positions"
    )


def split(**changes: Any) -> GroupResult:
    """A sound group of two episodes in three rows: the first episode's calls formed two sequences."""
    figures = EpisodeFigures(turns=[2, 1], env_tokens=[1, 0], sequences=[2, 1], endings=["done", "done"])
    sound = group(
        completions=[[4, 11], [6], [5]],
        logprobs=[[-0.5, 0.0], [-1.5], [-2.0]],
        masks=[[1, 0], [1], [1]],
        episodes=figures,
        episode_of=[0, 0, 1],
    )
    return msgspec.structs.replace(sound, **changes)


def test_an_episode_of_several_rows_passes_within_the_runs_bound() -> None:
    assert group_problem(wire(split()), GroupBounds(VOCAB, samples=2, rows=2)) is None
    assert group_problem(wire(split()), GroupBounds(VOCAB, samples=2, rows=0)) is None  # 0: no bound
    assert group_problem(wire(split()), GroupBounds(VOCAB, samples=2, rows=1)) == (
        "a sample of 2 rows, beyond the run's 1 a sample"
    )


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"episode_of": [0, 0, 2]}, "episode_of not in order from sample 0, one step at a time"),
        ({"episode_of": [0, 1, 1, 1]}, "3 rows but an episode_of of 4"),
        ({"episode_of": [0, 0, 0]}, "episode_of names 1 samples, the group has 2"),  # episode 1 without a row
        ({"episode_of": [1, 0, 0]}, "episode_of not in order"),
        ({"episode_of": [0, 1, 0]}, "episode_of not in order"),
        ({"episode_of": []}, "3 rows but 2 samples, and no episode_of"),
        ({"episodes": None}, "rows of one sample (episode_of) in a group without episodes"),
        ({"masks": [[1, 0], [1]]}, "3 completions but {'masks': 2}"),
        ({"logprobs": [[-0.5, 0.0], [-1.5]]}, "3 completions but {'logprobs': 2}"),
        ({"correct": [1.0, 0.0, 0.0]}, "2 rewards but {'correct': 3}"),
        (
            {"episodes": EpisodeFigures(turns=[2, 1], env_tokens=[1, 0], sequences=[2, 1, 1])},
            "2 samples but {'sequences': 3}",
        ),
        ({"episodes": EpisodeFigures(turns=[2, 1], env_tokens=[2, 0])}, "environment tokens other than"),
    ],
)
def test_an_inconsistent_row_to_episode_index_is_refused(changes: dict[str, Any], reason: str) -> None:
    problem = group_problem(wire(split(**changes)), GroupBounds(VOCAB, samples=2, rows=4))
    assert problem is not None and reason in problem
