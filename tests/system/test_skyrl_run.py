"""A SkyRL-gym environment, unchanged, trains in a run from the command line on data made here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cadence.monitor.run_dir import read_jsonl
from tests.system.helpers import SMALL, cadence

pytest.importorskip("skyrl_gym", reason="SkyRL-gym is an optional extra: pip install 'cadence[skyrl]'")


def test_a_skyrl_gym_environment_runs_in_a_run(tmp_path: Path) -> None:
    data = tmp_path / "sums.jsonl"
    data.write_text(
        "\n".join(
            json.dumps({"question": f"{a} + {a + 1} = ? End with ####", "answer": str(2 * a + 1)})
            for a in range(16)
        )
    )
    out = tmp_path / "run"
    cadence(
        "run",
        "configs/quickstart.toml",
        "--out",
        str(out),
        *SMALL,
        "--set",
        "periods=2",
        "--set",
        "task.name='file'",
        "--set",
        f"task.path='{data}'",
        "--set",
        "environment.name='skyrl:gsm8k_multi_turn'",
        "--set",
        "environment.kwargs={max_turns = 2}",
        "--set",
        "environment.max_turns=2",
        "--set",
        "environment.max_tokens=200",
        "--set",
        "environment.max_turn_tokens=8",
        "--set",
        "model.max_position=512",
        "--set",
        "monitor.samples_fraction=1.0",
    )
    rows = read_jsonl(out / "metrics.jsonl")
    assert len(rows) == 2 and all(r["turns_mean"] > 1.0 for r in rows)  # the environment asked again
    sample = json.loads((out / "samples" / "period-0.jsonl").read_text().splitlines()[0])
    messages = sample["responses"][0]["messages"]
    assert messages[2]["author"] == "environment"
    assert messages[2]["text"].startswith("Now provide only the final numeric answer")
