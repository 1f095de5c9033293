"""LoRA runs from the command line: adapters trained and published alone, sync and periodic alike,
and a killed run resumed ending like the uninterrupted one."""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors.torch import load_file

from cadence.monitor.run_dir import read_jsonl
from tests.system.helpers import SMALL, cadence, events
from tests.system.test_resume import SAME, killed_and_resumed

pytestmark = [pytest.mark.system, pytest.mark.timeout(300)]

LORA = ["--set", "trainer.lora.rank=4", "--set", "trainer.lora.alpha=8.0", "--set", "trainer.lr=0.01"]


def test_sync_and_periodic_lora_runs_agree_and_publish_the_adapters_alone(tmp_path: Path) -> None:
    rows, adapters, lines = {}, {}, {}
    for mode in ("sync", "periodic"):
        out = tmp_path / mode
        done = cadence(
            "run",
            "configs/quickstart.toml",
            "--out",
            str(out),
            *("--set", f"mode={mode}", "--set", "periods=4", "--set", "rollout.workers=1", "--set", "seed=3"),
            *SMALL,
            *LORA,
        )
        lines[mode] = done.stdout.splitlines()[0]
        rows[mode] = read_jsonl(out / "metrics.jsonl")
        adapters[mode] = load_file(str(out / "checkpoints" / "final" / "adapter_model.safetensors"))
        assert (out / "checkpoints" / "final" / "adapter_config.json").is_file()
    shas = {mode: [r["samples_sha256"] for r in rows[mode]] for mode in rows}
    assert shas["sync"] == shas["periodic"] and len(set(shas["sync"])) == 4
    diff = max(float((adapters["sync"][k] - adapters["periodic"][k]).abs().max()) for k in adapters["sync"])
    assert diff <= 1e-5
    assert any(float(t.abs().max()) > 0 for k, t in adapters["sync"].items() if "lora_B" in k)  # trained
    payload = sum(t.numel() for t in adapters["sync"].values()) * 4
    trainable = {r["trainable_params"] for r in rows["periodic"]}
    assert trainable == {payload // 4} and "LoRA rank 4:" in lines["periodic"]
    assert all(payload < r["version_bytes"] < payload + 8192 for r in rows["periodic"])
    loaded = [
        e["nbytes"] for e in events(tmp_path / "periodic", "rollout-0") if e["event"] == "weights_loaded"
    ]
    assert loaded and all(payload < n < payload + 8192 for n in loaded)


def test_a_killed_lora_run_resumed_ends_like_the_uninterrupted_one(tmp_path: Path) -> None:
    killed_and_resumed(tmp_path, [*SAME, *LORA])
