"""Held-out evaluation from the command line: a short run with [eval] writes its eval rows, and
`cadence eval` on the final checkpoint gives the figures of the run's last row."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cadence.monitor.run_dir import read_jsonl
from tests.system.helpers import SMALL, cadence, events

pytestmark = [pytest.mark.system, pytest.mark.timeout(300)]

EVAL = ["eval.every=2", "eval.prompts=6", "eval.greedy=false", "eval.k=4", "eval.temperature=1.0"]


def test_a_run_evaluates_at_its_periods_and_cadence_eval_agrees_on_the_final_checkpoint(
    tmp_path: Path,
) -> None:
    out = tmp_path / "run"
    sets = [arg for item in EVAL for arg in ("--set", item)]
    cadence("run", "configs/quickstart.toml", "--out", str(out), "--set", "periods=4", *SMALL, *sets)
    rows = read_jsonl(out / "eval.jsonl")
    periods = [r["period"] for r in rows]
    # versions 0, 2 and the final 4 are due; an intermediate round that found no idle worker in time is
    # abandoned and says so, the final one is always completed before the run ends
    abandoned = [e["version"] for e in events(out, "dispatcher") if e["event"] == "eval_abandoned"]
    assert sorted(periods + abandoned) == [0, 2, 4] and periods[-1] == 4
    for row in rows:
        assert (row["eval_prompts"], row["eval_samples"], row["eval_k"]) == (6, 24, 4)
        for key in ("eval_reward", "eval_accuracy", "eval_pass_at_k"):
            assert 0.0 <= row[key] <= 1.0
        samples = read_jsonl(out / "samples" / f"eval-period-{row['period']}.jsonl")
        assert [s["prompt_id"] for s in samples] == [-1, -2, -3, -4, -5, -6]
        assert all(len(s["responses"]) == 4 for s in samples)
        # single-turn: none of the episode figures an environment's rounds add (`eval_turns_mean`, ...)
        assert not any(k.startswith(("eval_turn", "eval_tool", "eval_env", "eval_ended_")) for k in row)
    final = out / "checkpoints" / "final"
    got = json.loads(cadence("eval", str(final), "--config", str(out / "config.json")).stdout)
    for key in ("eval_reward", "eval_accuracy", "eval_pass_at_k", "eval_prompts", "eval_samples"):
        assert got[key] == rows[-1][key], key
    assert got["version"] == 4
    responses = [
        r["text"] for s in read_jsonl(out / "samples" / "eval-period-4.jsonl") for r in s["responses"]
    ]
    assert (
        len(set(responses)) > 1
    )  # sampled at temperature 1, not one greedy answer: the match means something
