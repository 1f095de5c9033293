"""A verifiers environment trains from the command line: `cadence run` with `VerifiersAgent` as the
agent plays the test's environment in every episode, and each period row's reward is its rubric's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cadence.monitor.run_dir import read_jsonl
from tests.system.helpers import SMALL, cadence
from tests.verifiers.helpers import PACKAGES, VF_MARKS

pytestmark = [*VF_MARKS, pytest.mark.system, pytest.mark.timeout(600)]

RUBRIC = {"correct": 1.0, "used_tool": 0.25, "numeric": 0.5}  # vf_calculator's rewards and their weights


def test_a_run_trains_on_the_rubrics_reward(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(PACKAGES))  # vf_calculator, as an installed environment
    out = tmp_path / "run"
    cadence(
        "run",
        "configs/quickstart.toml",
        "--out",
        str(out),
        "--set",
        "environment.agent='tests.verifiers.vf_agent:agent'",
        "--set",
        "model.max_position=1024",  # the tools' block is 660 of the character tokenizer's tokens
        "--set",
        "environment.max_tokens=64",
        "--set",
        "environment.max_turn_tokens=8",
        "--set",
        "periods=3",
        "--set",
        "rollout.workers=1",
        "--set",
        "eval.every=0",
        *SMALL,
        timeout=500,
    )
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["period"] for r in rows] == [0, 1, 2]
    for row in rows:  # each sample's reward the rubric's: the sum of its weighted rewards
        parts = {k: row[f"reward_{k}"] for k in RUBRIC}
        assert [k for k in row if k.startswith("ended_")] == ["ended_done"]  # no episode failed
        assert row["reward_mean"] == pytest.approx(sum(parts.values()), abs=1e-6)
        assert all(0.0 <= parts[k] <= RUBRIC[k] for k in RUBRIC)  # each a weighted score in 0..1
        assert row["turns_mean"] >= 1.0 and row["sequences_mean"] >= 1.0
    assert any(row["reward_numeric"] > 0 for row in rows)  # the random model's answers hold digits
    sample = json.loads((out / "samples" / "period-0.jsonl").read_text().splitlines()[0])
    response = sample["responses"][0]
    assert response["turns"] >= 1 and [m["author"] for m in response["messages"]][:2] == [
        "environment",
        "model",
    ]
