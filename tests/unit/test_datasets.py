"""File and reasoning-gym tasks: reading records, a seeded walk over epochs, scoring, the export command."""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from cadence.cli import main
from cadence.config import load_config
from cadence.tasks.base import Task
from cadence.tasks.dataset import FileTask, walk
from cadence.tasks.registry import make_task, task_alphabet


def file_task(path: Path, *overrides: str, seed: int = 0) -> Task:
    cfg = load_config(None, ["task.name='file'", f"task.path='{path}'", *overrides])
    return make_task(cfg.task, seed)


def write_jsonl(path: Path, rows: Sequence[Mapping[str, object]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def problems(n: int) -> list[dict[str, object]]:
    return [{"problem": f"What is {i} + {i}?", "solution": 2 * i, "extra": "x"} for i in range(n)]


def test_jsonl_with_custom_fields_and_a_template(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps(problems(1)[0]) + "\n\n   \n" + json.dumps(problems(2)[1]) + "\n")
    task = file_task(
        path,
        "task.prompt_field='problem'",
        "task.answer_field='solution'",
        "task.prompt_template='Q: {prompt} A:'",
    )
    assert isinstance(task, FileTask)
    assert task.records == [("Q: What is 0 + 0? A:", "0"), ("Q: What is 1 + 1? A:", "2")]
    assert set("Q:What is0+?A\\boxed{}") <= set(task.alphabet)
    assert len(set(task.alphabet)) == len(task.alphabet)


def test_parquet_with_custom_fields(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "p.parquet"
    pq.write_table(pa.Table.from_pylist(problems(3)), path)
    task = file_task(path, "task.prompt_field='problem'", "task.answer_field='solution'")
    assert isinstance(task, FileTask)
    assert task.records == [(f"What is {i} + {i}?", str(2 * i)) for i in range(3)]


def test_prompts_are_deterministic_and_cover_every_record_once_an_epoch(tmp_path: Path) -> None:
    rows = [{"question": f"q{i}", "answer": str(i)} for i in range(10)]
    path = write_jsonl(tmp_path / "p.jsonl", rows)
    task, again, other = file_task(path), file_task(path), file_task(path, seed=1)
    periods = [task.prompts(period, 4) for period in range(10)]  # 40 prompts: 4 epochs of 10
    assert periods == [again.prompts(period, 4) for period in range(10)]
    assert periods != [other.prompts(period, 4) for period in range(10)]
    flat = [p for period in periods for p in period]
    assert [p.prompt_id for p in flat] == list(range(40))
    assert all(p.text == f"q{p.answer}" for p in flat)
    epochs = [[p.answer for p in flat[e * 10 : (e + 1) * 10]] for e in range(4)]
    for epoch in epochs:
        assert sorted(epoch, key=int) == [str(i) for i in range(10)]
    assert len({tuple(epoch) for epoch in epochs}) > 1  # each epoch is shuffled anew
    assert walk(10, 0, 3, 4) == [int(p.answer) for p in task.prompts(3, 4)]  # any period on its own


@pytest.mark.parametrize("name", ["digits", "arithmetic", "file", "reasoning_gym"])
def test_a_tasks_alphabet_is_known_without_building_it(tmp_path: Path, name: str) -> None:
    if name == "reasoning_gym":
        pytest.importorskip("reasoning_gym")
    path = write_jsonl(tmp_path / "p.jsonl", [{"question": "What is 20 + 22 ~?", "answer": "42 €"}])
    cfg = load_config(
        None,
        [
            f"task.name='{name}'",
            f"task.path='{path}'",
            "task.gym_size=12",
            "task.prompt_template='Q {prompt}'",
        ],
    )
    assert task_alphabet(cfg.task, 5) == make_task(cfg.task, 5).alphabet


@pytest.mark.parametrize(
    ("response", "finished", "reward", "correct"),
    [
        ("20 + 22 = \\boxed{42}", True, 1.0, 1.0),
        ("The answer is 42.0", True, 1.0, 1.0),
        ("\\boxed{42}", False, 0.8, 1.0),
        ("\\boxed{41}", True, 0.2, 0.0),
        ("I cannot say", True, 0.0, 0.0),
    ],
)
def test_file_task_score(
    tmp_path: Path, response: str, finished: bool, reward: float, correct: float
) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [{"question": "What is 20 + 22?", "answer": 42}])
    score = file_task(path, "task.format_weight=0.2").score("What is 20 + 22?", response, "42", finished)
    assert score.reward == pytest.approx(reward) and score.correct == correct


@pytest.mark.parametrize(
    ("content", "name", "overrides", "message"),
    [
        (None, "missing.jsonl", [], r"task.path '.*missing.jsonl': no such file"),
        ("", "p.csv", [], r"unknown extension '.csv'; use .jsonl or .parquet"),
        ("\n\n", "p.jsonl", [], r"the file holds no records"),
        ('{"question": "q"}\n', "p.jsonl", [], r"p.jsonl line 1: no field 'answer' \(task.answer_field\)"),
        (
            '{"question": "q", "answer": 1}\n\n{"answer": 2}\n',
            "p.jsonl",
            [],
            r"p.jsonl line 3: no field 'question' \(task.prompt_field\); fields there: answer",
        ),
        (
            '{"question": "q", "answer": null}\n',
            "p.jsonl",
            [],
            r"line 1: a null field 'answer'",
        ),
        ('{"q": "q", "a": 1}\n', "p.jsonl", ["task.prompt_field='problem'"], r"line 1: no field 'problem'"),
        ("not json\n", "p.jsonl", [], r"p.jsonl line 1: not JSON"),
        ("[1, 2]\n", "p.jsonl", [], r"line 1: a JSON object expected, got list"),
    ],
)
def test_file_errors_name_the_file_the_field_and_the_line(
    tmp_path: Path, content: str | None, name: str, overrides: list[str], message: str
) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    with pytest.raises(ValueError, match=message):
        file_task(path, *overrides)


def test_empty_path_and_parquet_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="task.path is empty"):
        make_task(load_config(None, ["task.name='file'"]).task, 0)
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "p.parquet"
    pq.write_table(
        pa.Table.from_pylist([{"question": "q", "answer": None}, {"question": "r", "answer": 1}]), path
    )
    with pytest.raises(ValueError, match=r"p.parquet row 0: a null field 'answer'"):
        file_task(path)
    with pytest.raises(ValueError, match=r"p.parquet row 0: no field 'solution' .*columns: question, answer"):
        file_task(path, "task.answer_field='solution'")
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ValueError, match="reading Parquet needs pyarrow"):
        file_task(path)


def gym_task(*overrides: str) -> Task:
    cfg = load_config(None, ["task.name='reasoning_gym'", "task.gym_size=12", *overrides])
    return make_task(cfg.task, 5)


def test_reasoning_gym_task_scores_with_the_generator() -> None:
    pytest.importorskip("reasoning_gym")
    task = gym_task("task.prompt_template='{prompt} Put it in \\boxed{}.'", "task.format_weight=0.2")
    prompts = task.prompts(0, 12) + task.prompts(1, 12)
    assert sorted(p.prompt_id for p in prompts) == list(range(24))
    assert Counter(p.text for p in prompts[:12]) == Counter(p.text for p in prompts[12:])
    assert gym_task("task.prompt_template='{prompt} Put it in \\boxed{}.'").prompts(1, 12) == prompts[12:]
    for p in prompts[:12]:
        assert p.text.endswith(" Put it in \\boxed{}.")
        right = task.score(p.text, f"So \\boxed{{{p.answer}}}", p.answer, True)
        assert right.correct == 1.0 and right.reward == pytest.approx(1.0)
        wrong = task.score(p.text, f"So \\boxed{{{p.answer}1}}", p.answer, True)
        assert wrong.correct == 0.0 and wrong.reward == pytest.approx(0.2)
        bare = task.score(p.text, p.answer, p.answer, False)
        assert bare.correct == 1.0 and bare.reward == pytest.approx(0.8)
    assert task.score("not one of ours", "\\boxed{7}", "7", True).correct == 1.0  # the math checker


def test_reasoning_gym_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("reasoning_gym")
    with pytest.raises(
        ValueError, match="task.gym_dataset = 'no_such_generator': reasoning-gym dataset 'no_such_generator'"
    ):
        gym_task("task.gym_dataset='no_such_generator'")
    with pytest.raises(ValueError, match="task.gym_size must be >= 1"):
        gym_task("task.gym_size=0")
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)
    with pytest.raises(ValueError, match="needs reasoning-gym"):
        gym_task()


def test_export_command_writes_a_file_the_file_task_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("reasoning_gym")
    out = tmp_path / "data" / "chain.jsonl"
    assert main(["data", "reasoning-gym", "chain_sum", "--size", "7", "--seed", "3", "-o", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"cadence: wrote 7 problems to {out}"
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 7 and all(set(row) == {"question", "answer"} for row in rows)
    task = file_task(out)
    assert isinstance(task, FileTask) and sorted(task.records) == sorted(
        (r["question"], r["answer"]) for r in rows
    )
    prompt = task.prompts(0, 1)[0]
    assert task.score(prompt.text, f"\\boxed{{{prompt.answer}}}", prompt.answer, True).correct == 1.0
    assert main(["data", "reasoning-gym", "no_such_generator", "-o", str(out)]) == 2
    assert "no_such_generator" in capsys.readouterr().err


def test_export_unique_skips_repeated_questions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("reasoning_gym")
    out = tmp_path / "one_digit.jsonl"
    # one-digit sums of two terms: 100 distinct questions, so 400 draws repeat many
    options = ["--option", "min_terms=2", "--option", "max_terms=2", "--option", "min_digits=1"]
    options += ["--option", "max_digits=1", "--option", "operators=['+']"]
    assert main(["data", "reasoning-gym", "basic_arithmetic", "--size", "400", "-o", str(out), *options]) == 0
    repeated = [json.loads(line)["question"] for line in out.read_text().splitlines()]
    assert len(repeated) == 400 and len(set(repeated)) < 400
    capsys.readouterr()
    assert (
        main(
            [
                "data",
                "reasoning-gym",
                "basic_arithmetic",
                "--size",
                "400",
                "-o",
                str(out),
                "--unique",
                *options,
            ]
        )
        == 0
    )
    questions = [json.loads(line)["question"] for line in out.read_text().splitlines()]
    assert len(questions) == len(set(questions)) == len(set(repeated))
    assert capsys.readouterr().out.strip() == f"cadence: wrote {len(questions)} problems to {out}"
