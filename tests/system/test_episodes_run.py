"""Multi-turn episodes in a whole run from the command line: every turn of a period's episodes is
generated with that period's version, so sync and periodic runs agree token for token."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from cadence.monitor.run_dir import read_jsonl
from tests.system.helpers import SMALL, cadence

EPISODES = [
    "--set",
    "model.max_position=512",  # the calculator's opening (instructions, an example) is 330 characters
    "--set",
    "environment.max_turns=3",
    "--set",
    "environment.max_tokens=48",
    "--set",
    "environment.max_turn_tokens=8",
]


@pytest.mark.parametrize("environment", ["guess_number", "calculator", "tool_calculator"])
def test_sync_and_periodic_episodes_agree(tmp_path: Path, environment: str) -> None:
    # the JSON calculator's opening declares its tool's schema too: 975 characters
    positions = ["--set", "model.max_position=1152"] if environment == "tool_calculator" else []
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
            "--set",
            "periods=3",
            "--set",
            "rollout.workers=1",
            "--set",
            "seed=3",
            "--set",
            f"environment.name={environment!r}",
            *EPISODES,
            *positions,
            *SMALL,
        )
        rows[mode] = read_jsonl(out / "metrics.jsonl")
        weights[mode] = load_file(str(out / "checkpoints" / "final" / "model.safetensors"))
    hashes = {mode: [r["samples_sha256"] for r in rows[mode]] for mode in rows}
    assert hashes["sync"] == hashes["periodic"] and len(set(hashes["sync"])) == 3
    diff = max(float((weights["sync"][k] - weights["periodic"][k]).abs().max()) for k in weights["sync"])
    assert diff <= 1e-5
    row = rows["periodic"][-1]
    assert row["turns_mean"] >= 1.0
    if environment == "guess_number":  # no number guessed in 8 random tokens: the game answers, again
        assert row["turns_mean"] > 1.0 and row["env_tokens"] > 0
    # the samples show every turn with its author, the environment's first
    sample = json.loads((tmp_path / "periodic" / "samples" / "period-0.jsonl").read_text().splitlines()[0])
    messages = sample["responses"][0]["messages"]
    assert messages[0]["author"] == "environment" and messages[1]["author"] == "model"
