"""Held-out evaluation: the eval set's disjointness, pass@k and the round's figures (and episodes', in
the round's row as `cadence eval` gives them), the config rules, the meaning check of an eval answer."""

from __future__ import annotations

import itertools
import json
import math
import random
from collections import deque
from pathlib import Path

import pytest

from cadence.config import ConfigError, load_config
from cadence.dispatch.rounds import EvalRound, EvalRounds
from cadence.launch.build import make_tokenizer
from cadence.monitor.evaluation import eval_episodes, eval_figures, pass_at_k
from cadence.monitor.run_dir import RunRecorder, read_jsonl
from cadence.rollout.results import GroupSamples, eval_result
from cadence.tasks.base import Prompt, Score
from cadence.tasks.heldout import eval_prompts, held_out
from cadence.tasks.registry import make_task
from cadence.wire.meaning import eval_result_problem
from cadence.wire.messages import (
    Assignment,
    DecodeError,
    EpisodeFigures,
    EvalResult,
    decode_frames,
    encode_frames,
)
from tests.conftest import episodes_of


def test_pass_at_k_against_enumerating_every_draw() -> None:
    for n in range(1, 7):
        for c in range(n + 1):
            for k in range(1, n + 1):
                samples = [1] * c + [0] * (n - c)
                draws = list(itertools.combinations(range(n), k))
                share = sum(any(samples[i] for i in d) for d in draws) / len(draws)
                assert math.isclose(pass_at_k(n, c, k), share), (n, c, k)
    with pytest.raises(ValueError):
        pass_at_k(2, 3, 1)


def test_eval_figures_are_sample_means_and_prompt_pass_rates() -> None:
    groups = [([1.0, 0.25, 0.0], [1.0, 0.0, 0.0]), ([0.25, 0.25, 0.25], [0.0, 0.0, 0.0])]
    figures = eval_figures(groups, 3)
    assert math.isclose(figures["eval_reward"], 2.0 / 6)
    assert math.isclose(figures["eval_accuracy"], 1.0 / 6)
    assert math.isclose(figures["eval_pass_at_k"], 0.5)  # one prompt of two has a correct sample
    assert (figures["eval_prompts"], figures["eval_samples"], figures["eval_k"]) == (2, 6, 3)
    greedy = eval_figures([([1.0], [1.0]), ([0.0], [0.0]), ([0.0], [0.0])], 1)
    assert math.isclose(greedy["eval_pass_at_k"], greedy["eval_accuracy"])


def test_a_round_does_not_depend_on_answer_order_and_requeues_a_lost_peers_prompts() -> None:
    prompts = [Prompt(-(i + 1), f"q{i}", str(i)) for i in range(4)]
    rows: list[dict[str, object]] = []
    for order in ([0, 1, 2, 3], [3, 1, 0, 2]):
        r = EvalRound(5, deque(prompts), 0.0)
        given = r.give(b"a", 3) + r.give(b"b", 3)
        assert [p.prompt_id for p in given] == [-1, -2, -3, -4] and r.complete is False
        for i in order:
            p = prompts[i]
            r.answer(EvalResult(5, p.prompt_id, [i / 4], [float(i == 0)], [str(i)], [1]))
        assert r.complete
        rows.append(r.row(1, 1.0))
        assert [s["prompt_id"] for s in r.samples()] == [-1, -2, -3, -4]
    assert rows[0] == rows[1] and rows[0]["period"] == rows[0]["version"] == 5
    r = EvalRound(0, deque(prompts), 0.0)
    r.give(b"a", 2)
    r.give(b"b", 2)
    assert r.requeue(b"a") == 2 and [p.prompt_id for p in r.pending] == [-1, -2]
    assert not r.held_by(b"a", -1) and r.held_by(b"b", -3)


def test_generated_tasks_draw_eval_prompts_from_a_seed_stream_training_never_uses() -> None:
    cfg = load_config(None, ["task.name='arithmetic'", "task.max_operand=1000", "eval.prompts=20"])
    task = make_task(cfg.task, cfg.seed, held_out(cfg.task, cfg.eval))
    evals = eval_prompts(cfg.task, cfg.eval, task)
    assert [p.prompt_id for p in evals] == [-(i + 1) for i in range(20)]
    assert held_out(cfg.task, cfg.eval) == 0
    training = {p.text for period in range(50) for p in task.prompts(period, 16)}
    assert not training & {p.text for p in evals}  # 10^6 operand pairs: disjoint seeds give disjoint texts
    again = eval_prompts(cfg.task, cfg.eval, make_task(cfg.task, cfg.seed))
    assert evals == again


def write_problems(path: Path, n: int) -> None:
    path.write_text("".join(json.dumps({"question": f"q{i}", "answer": str(i)}) + "\n" for i in range(n)))


def test_the_file_task_holds_out_its_last_records_and_training_never_draws_them(tmp_path: Path) -> None:
    write_problems(tmp_path / "p.jsonl", 30)
    cfg = load_config(None, ["task.name='file'", f"task.path='{tmp_path / 'p.jsonl'}'", "eval.prompts=7"])
    task = make_task(cfg.task, cfg.seed, held_out(cfg.task, cfg.eval))
    evals = eval_prompts(cfg.task, cfg.eval, task)
    assert [p.text for p in evals] == [f"q{i}" for i in range(23, 30)]
    drawn = {p.text for period in range(40) for p in task.prompts(period, 5)}  # several epochs
    assert drawn == {f"q{i}" for i in range(23)}
    with pytest.raises(ValueError, match="eval.prompts"):
        make_task(cfg.task, cfg.seed, 30)


def test_eval_path_takes_the_first_records_of_its_file(tmp_path: Path) -> None:
    write_problems(tmp_path / "train.jsonl", 10)
    write_problems(tmp_path / "eval.jsonl", 5)
    cfg = load_config(
        None,
        [
            "task.name='file'",
            f"task.path='{tmp_path / 'train.jsonl'}'",
            f"eval.path='{tmp_path / 'eval.jsonl'}'",
            "eval.prompts=3",
            "eval.every=1",
        ],
    )
    assert held_out(cfg.task, cfg.eval) == 0  # a separate file: training keeps every record
    task = make_task(cfg.task, cfg.seed, held_out(cfg.task, cfg.eval))
    assert [p.text for p in eval_prompts(cfg.task, cfg.eval, task)] == ["q0", "q1", "q2"]


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["eval.every=-1"], "eval.every"),
        (["eval.prompts=-2"], "eval.prompts"),
        (["eval.every=2"], "eval.every"),  # no held-out prompts
        (["eval.k=0"], "eval.k"),
        (["eval.k=4"], "eval.k"),  # greedy with k > 1
        (["eval.greedy=false", "eval.k=4", "eval.temperature=0"], "eval.temperature"),
        (["eval.path='x.jsonl'", "eval.every=1"], "eval.path"),  # digits draws its own
        (["eval.greediness=1"], "eval.greediness"),
    ],
)
def test_bad_eval_settings_are_named(overrides: list[str], key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(None, overrides)


def test_good_eval_settings_load() -> None:
    cfg = load_config(None, ["eval.every=5", "eval.prompts=16", "eval.greedy=false", "eval.k=4"])
    assert (cfg.eval.every, cfg.eval.prompts, cfg.eval.greedy, cfg.eval.k) == (5, 16, False, 4)


def wire(msg: EvalResult) -> EvalResult:
    out = decode_frames(encode_frames(msg, "peer", "run")).message
    assert isinstance(out, EvalResult)
    return out


def test_an_eval_answer_must_make_sense() -> None:
    good = EvalResult(3, -2, [0.5, 1.0], [0.0, 1.0], ["1", "2"], [2, 1], 0.1)
    assert eval_result_problem(wire(good), 2) is None
    rng = random.Random(0)
    bad = [
        (EvalResult(3, 4, [0.5, 1.0], [0.0, 1.0], ["1", "2"], [2, 1]), "no eval prompt"),
        (EvalResult(3, -2, [0.5], [0.0, 1.0], ["1", "2"], [2, 1]), "rewards"),
        (EvalResult(3, -2, [0.5, 1.0], [0.0, 1.0], ["1"], [2, 1]), "responses"),
        (EvalResult(3, -2, [0.5, math.nan], [0.0, 1.0], ["1", "2"], [2, 1]), "finite"),
    ]
    rng.shuffle(bad)
    for msg, reason in bad:
        problem = eval_result_problem(wire(msg), 2)
        assert problem is not None and reason in problem, (msg, problem)
    with pytest.raises(DecodeError, match=r"at `\$\.tokens\[1\]`"):  # a length is never negative
        wire(EvalResult(3, -2, [0.5, 1.0], [0.0, 1.0], ["1", "2"], [2, -1]))


class Scalars:
    """A metric writer that keeps what it is given."""

    def __init__(self) -> None:
        self.got: list[tuple[int, dict[str, float]]] = []

    def write(self, step: int, metrics: object) -> None:
        pass

    def scalars(self, step: int, values: dict[str, float]) -> None:
        self.got.append((step, values))

    def close(self) -> None:
        pass


def test_the_recorder_writes_eval_rows_samples_and_writers_and_a_resume_rewinds_them(tmp_path: Path) -> None:
    writer = Scalars()
    recorder = RunRecorder(tmp_path, "periodic", [writer])
    for version in (0, 2, 4):
        row = {"period": version, "version": version, "eval_accuracy": version / 4, "eval_k": 1}
        recorder.evaluation(row, [{"prompt_id": -1, "responses": []}])
    assert [r["period"] for r in read_jsonl(tmp_path / "eval.jsonl")] == [0, 2, 4]
    assert read_jsonl(tmp_path / "samples" / "eval-period-2.jsonl") == [{"prompt_id": -1, "responses": []}]
    assert writer.got[1] == (2, {"eval_accuracy": 0.5, "eval_k": 1.0})
    summary = recorder.finish(1.0, 4, "sha")
    assert (summary["eval_first"]["period"], summary["eval_last"]["eval_accuracy"]) == (0, 1.0)
    recorder = RunRecorder(tmp_path, "periodic", resume=True)
    # a trainer resumed at version 3 re-reports period 2 (rewind(2)): the rounds of versions >= 3 run again
    recorder.rewind(2)
    assert [r["period"] for r in read_jsonl(tmp_path / "eval.jsonl")] == [0, 2]


def test_rounds_are_due_at_multiples_and_the_end_and_a_rounds_rest_goes_out_before_the_next() -> None:
    prompts = [Prompt(-(i + 1), f"q{i}", str(i)) for i in range(3)]
    rounds = EvalRounds(prompts, every=1, periods=5, samples=1, keep_versions=2)
    assert [v for v in range(6) if EvalRounds(prompts, 2, 5, 1, 2).due(v)] == [0, 2, 4, 5]
    assert not EvalRounds([], 2, 5, 1, 2).due(0)
    rounds.announce(0, 0.0)
    first = rounds.give(b"a", 2, 0)
    last = rounds.give(b"b", 3, 0)
    assert [p.prompt_id for _, p in first + last] == [-1, -2, -3]
    rounds.announce(1, 1.0)  # round 0, all handed out, waits for its answers beside round 1
    assert [r.version for r in rounds.open] == [0, 1] and not rounds.behind(1)
    assert [(r.version, p.prompt_id) for r, p in rounds.give(b"b", 1, 1)] == [(1, -1)]
    assert rounds.problem(b"b", 0, -1) is not None and rounds.problem(b"a", 0, -1) is None
    for _, p in first:
        assert rounds.answer(EvalResult(0, p.prompt_id, [1.0], [1.0], ["x"], [1]), 2.0) is None
    done = rounds.answer(EvalResult(0, -3, [0.0], [0.0], ["y"], [1]), 2.0)
    assert done is not None and done[0]["version"] == 0 and abs(done[0]["eval_accuracy"] - 2 / 3) < 1e-9
    rounds.announce(2, 3.0)  # round 1 still has prompts never handed out: its rest goes first
    assert [r.version for r in rounds.open] == [1, 2] and rounds.behind(2)
    rest = rounds.give(b"a", 5, 2)  # one batch of one version: round 1's rest, not round 2's
    assert [(r.version, p.prompt_id) for r, p in rest] == [(1, -2), (1, -3)] and not rounds.behind(2)
    assert [(r.version, p.prompt_id) for r, p in rounds.give(b"a", 1, 2)] == [(2, -1)]
    rounds.give(b"a", 3, 2)
    rounds.announce(3, 4.0)  # round 1's weights may be gone (1 + 2 <= 3): abandoned unanswered
    assert [r.version for r in rounds.open] == [2, 3]
    rounds.announce(4, 5.0)
    assert [r.version for r in rounds.open] == [3, 4]
    rounds.give(b"a", 3, 4)
    rounds.announce(5, 6.0)
    rounds.close_before(5)  # the run is done: only the final round is waited for
    assert [r.version for r in rounds.open] == [5]


def test_a_char_tokenizer_also_spells_a_held_out_files_characters(tmp_path: Path) -> None:
    write_problems(tmp_path / "train.jsonl", 3)
    (tmp_path / "eval.jsonl").write_text(json.dumps({"question": "what is 2 ~ 2 €", "answer": "4"}) + "\n")
    base = ["task.name='file'", f"task.path='{tmp_path / 'train.jsonl'}'"]
    plain = make_tokenizer(load_config(None, base))
    cfg = load_config(None, [*base, f"eval.path='{tmp_path / 'eval.jsonl'}'", "eval.every=1"])
    tokenizer = make_tokenizer(cfg)
    text = "what is 2 ~ 2 €"
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.encode("q1") == plain.encode("q1")  # the training texts keep their ids


def test_eval_episode_figures_are_a_period_rows_prefixed_and_none_for_single_turn_groups() -> None:
    def group(turns: list[int], endings: list[str], masks: list[list[int]]) -> EpisodeFigures:
        n = len(turns)
        env_tokens = [mask.count(0) for mask in masks]
        return EpisodeFigures(turns, [2] * n, [1] * n, [0] * n, [0.25] * n, env_tokens, endings)

    groups = [
        group([1, 3], ["done", "max_turns"], [[1, 1], [1, 0, 0, 1]]),
        group([2], ["done"], [[1, 0, 1]]),
    ]
    assert eval_episodes(groups) == {
        "eval_turns_mean": 2.0,
        "eval_tool_calls": 6,
        "eval_tool_errors": 3,
        "eval_env_timeouts": 0,
        "eval_env_s": 0.75,
        "eval_env_wall_s": 0.0,
        "eval_env_tokens": 3,
        "eval_ended_done": 2,
        "eval_ended_max_turns": 1,
    }
    assert eval_episodes([]) == {}
    assert eval_episodes([EpisodeFigures()]) == {} and eval_episodes([None]) == {}


SINGLE_TURN_ROW = {
    "period",
    "version",
    "eval_reward",
    "eval_accuracy",
    "eval_pass_at_k",
    "eval_k",
    "eval_prompts",
    "eval_samples",
    "eval_s",
}


def _played(prompt_id: int, masks: list[list[int]], figures: EpisodeFigures | None) -> EvalResult:
    """A worker's answer to eval prompt `prompt_id` of two samples (episodes with these masks and
    `figures`), through the wire."""
    job = Assignment(3, 3, prompt_id, "q", "7", 2, eval=True)
    completions = [[5] * len(m) for m in masks] if figures else [[5, 6], [5]]
    samples = GroupSamples(
        [1],
        completions,
        [[0.0] * len(c) for c in completions],
        ["7", "8"],
        [Score(1.0, 1.0), Score(0.0, 0.0)],
        masks,
        figures,
    )
    answer = wire(eval_result(job, samples, 0.1))
    assert eval_result_problem(answer, 2) is None
    return answer


def test_an_eval_rounds_row_adds_its_episodes_figures_as_cadence_eval_does_and_single_turn_rows_none() -> (
    None
):
    masks = [[[1, 0, 0, 1], [1]], [[1, 0, 1], [0]]]
    figures = [
        EpisodeFigures([2, 1], [2, 0], [1, 0], [1, 0], [0.25, 0.5], [2, 0], ["done", "max_turns"]),
        EpisodeFigures(
            [2, 0],
            [1, 0],
            [0, 0],
            [0, 0],
            [0.125, 0.0],
            [1, 1],
            ["done", "error"],
            turn_rewards=[[1.0, None], []],
        ),
    ]
    prompts = [Prompt(-1, "q1", "7"), Prompt(-2, "q2", "7")]
    r = EvalRound(3, deque(prompts), 0.0)
    r.give(b"a", 2)
    answers = [_played(-1, masks[0], figures[0]), _played(-2, masks[1], figures[1])]
    assert episodes_of(answers[0]).env_tokens == [2, 0] and episodes_of(answers[1]).env_tokens == [1, 1]
    for answer in reversed(answers):  # the order they come in does not matter
        r.answer(answer)
    row = r.row(2, 4.0)
    assert (
        {k: v for k, v in row.items() if k not in SINGLE_TURN_ROW}
        == eval_episodes(figures)
        == {
            "eval_turn_reward_mean": 1.0,
            "eval_turns_mean": 1.25,
            "eval_tool_calls": 3,
            "eval_tool_errors": 1,
            "eval_env_timeouts": 1,
            "eval_env_s": 0.875,
            "eval_env_wall_s": 0.0,
            "eval_env_tokens": 4,
            "eval_ended_done": 2,
            "eval_ended_error": 1,
            "eval_ended_max_turns": 1,
        }
    )
    assert (row["eval_samples"], row["eval_accuracy"]) == (4, 0.5)
    single = EvalRound(3, deque(prompts), 0.0)
    single.give(b"a", 2)
    for prompt in prompts:
        answer = _played(prompt.prompt_id, [], None)
        assert answer.episodes is None
        single.answer(answer)
    assert single.row(2, 4.0).keys() == SINGLE_TURN_ROW
