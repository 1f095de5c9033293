"""A math dataset written by `cadence data` trains through the file prompt source and the math checker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cadence.monitor.run_dir import read_jsonl
from tests.system.helpers import SMALL, cadence, summary

pytestmark = pytest.mark.timeout(240)


def test_a_reasoning_gym_file_trains_with_math_and_format_rewards(tmp_path: Path) -> None:
    data = tmp_path / "arith.jsonl"
    made = cadence(
        "data", "reasoning-gym", "basic_arithmetic", "--size", "300", "--seed", "1", "-o", str(data)
    )
    assert "wrote 300 problems" in made.stdout
    problems = [json.loads(line) for line in data.read_text().splitlines()]
    assert len(problems) == 300 and all(p["question"] and p["answer"] for p in problems)
    out = tmp_path / "run"
    cadence(
        "run",
        "configs/quickstart.toml",
        "--out",
        str(out),
        *SMALL,
        "--set",
        "periods=4",
        "--set",
        "task.name='file'",
        "--set",
        f"task.path='{data}'",
        "--set",
        "task.prompt_template='{prompt} Answer in a box.'",
        "--set",
        "rewards.weights={math = 1.0, format = 0.2}",
        "--set",
        "rollout.max_new_tokens=6",
        "--set",
        "model.max_position=256",
        "--set",
        "monitor.samples_fraction=1.0",
    )
    rows = read_jsonl(out / "metrics.jsonl")
    assert len(rows) == 4 and all("reward_math" in r and "reward_format" in r for r in rows)
    assert summary(out)["groups_trained"] == 4 * 4
    questions = {p["question"] for p in problems}
    kept = [
        json.loads(x)
        for k in range(4)
        for x in (out / "samples" / f"period-{k}.jsonl").read_text().splitlines()
    ]
    assert len(kept) == 16  # every group, all four periods
    assert all(s["prompt"].removesuffix(" Answer in a box.") in questions for s in kept)
    assert len({s["prompt"] for s in kept}) == 16  # one pass through a shuffled file: no repeats
    by_question = {p["question"]: p["answer"] for p in problems}
    assert all(s["answer"] == by_question[s["prompt"].removesuffix(" Answer in a box.")] for s in kept)
    assert all({"math", "format", "reward", "text"} <= set(r) for s in kept for r in s["responses"])
