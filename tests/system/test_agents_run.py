"""Agent episodes in a whole run from the command line: every call of a period's agents is answered
with that period's version, so sync and periodic runs agree token for token and end with the same
weights; the period rows and samples show the calls."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file

from cadence.monitor.run_dir import read_jsonl
from tests.system.helpers import SMALL, cadence

pytestmark = pytest.mark.system

AGENT = [
    "--set",
    "environment.agent='tests.system.tiny_agent:agent'",
    "--set",
    "model.max_position=256",
    "--set",
    "environment.max_tokens=48",
    "--set",
    "environment.max_turn_tokens=8",
    "--set",
    "periods=3",
    "--set",
    "rollout.workers=1",
    "--set",
    "seed=3",
]


def sync_and_periodic(tmp_path: Path, *extra: str) -> list[dict[str, Any]]:
    """Runs in both modes agree token for token and end with the same weights; the periodic rows."""
    rows, weights = {}, {}
    for mode in ("sync", "periodic"):
        out = tmp_path / mode
        cadence(
            "run",
            "configs/quickstart.toml",
            "--out",
            str(out),
            "--set",
            f"mode={mode!r}",
            *AGENT,
            *extra,
            *SMALL,
        )
        rows[mode] = read_jsonl(out / "metrics.jsonl")
        weights[mode] = load_file(str(out / "checkpoints" / "final" / "model.safetensors"))
    hashes = {mode: [r["samples_sha256"] for r in rows[mode]] for mode in rows}
    assert hashes["sync"] == hashes["periodic"] and len(set(hashes["sync"])) == 3
    diff = max(float((weights["sync"][k] - weights["periodic"][k]).abs().max()) for k in weights["sync"])
    assert diff <= 1e-5
    return rows["periodic"]


def test_sync_and_periodic_agent_runs_agree(tmp_path: Path) -> None:
    row = sync_and_periodic(tmp_path)[-1]
    assert row["turns_mean"] == 2.0 and row["sequences_mean"] == 1.0 and row["rewrites"] == 0
    assert 1.0 <= row["call_tokens_mean"] <= 4.0 and row["call_s_mean"] > 0.0 and row["env_tokens"] > 0
    sample = json.loads((tmp_path / "periodic" / "samples" / "period-0.jsonl").read_text().splitlines()[0])
    response = sample["responses"][0]
    assert response["sequences"] == 1 and response["turns"] == 2 and response["call_s"] > 0.0
    assert [m["author"] for m in response["messages"]][:2] == ["environment", "model"]


def test_an_agent_that_rewrites_its_history_trains_both_sequences_alike_in_both_modes(tmp_path: Path) -> None:
    rows = sync_and_periodic(tmp_path, "--set", "environment.agent='tests.system.tiny_agent:rewriting_agent'")
    for row in rows:
        assert row["turns_mean"] == 3.0 and row["sequences_mean"] == 2.0 and row["sequences_max"] == 2
        assert row["rewrites"] == 4 * 4 and row["rewrite_share"] == 1.0  # every episode of every group
    sample = json.loads((tmp_path / "periodic" / "samples" / "period-0.jsonl").read_text().splitlines()[0])
    assert {response["sequences"] for response in sample["responses"]} == {2}
