"""What a run shows its watchers: per-function rewards, idle times, kept samples, metric writers."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from cadence.config import ConfigError, load_config
from cadence.monitor.metrics import PeriodStats
from cadence.monitor.period_metrics import PeriodMetrics
from cadence.monitor.run_dir import RunRecorder
from cadence.monitor.samples import SampleWriter, is_sampled
from cadence.monitor.writers import TensorBoardWriter, make_writers, scalars
from tests.conftest import scored


def test_reward_functions_and_inference_idle_per_period() -> None:
    stats = PeriodStats(period=0, start=100.0)
    parts = {"math": [1.0, 0.0], "format": [1.0, 1.0]}
    stats.arrived(
        101.0, "w1", scored(0, [[1], [2]], [1.2, 0.2], [1.0, 0.0], gen_s=1.0, load_s=0.5, parts=parts)
    )
    stats.arrived(
        103.0, "w1", scored(1, [[1], [2]], [0.0, 0.2], [0.0, 0.0], gen_s=2.0, load_s=0.0, parts=parts)
    )
    stats.arrived(104.0, "w2", scored(2, [[1, 2], [3]], [0.2, 0.2], [0.0, 0.0], gen_s=1.0, load_s=0.0))
    row = stats.finish(end=110.0, publish_s=0.5).to_row()
    assert row["reward_math"] == pytest.approx(0.5) and row["reward_format"] == pytest.approx(1.0)
    # w1 busy 3.5 s, w2 1 s, of a 10 s period: idle 6.5 and 9, mean 7.75
    assert row["inference_idle_s"] == pytest.approx(7.75)
    assert row["response_len_max"] == 2


def test_kept_samples_are_a_stable_share_of_prompts() -> None:
    kept = [p for p in range(4000) if is_sampled(7, p, 0.25)]
    assert 900 < len(kept) < 1100
    assert kept == [p for p in range(4000) if is_sampled(7, p, 0.25)]
    assert kept != [p for p in range(4000) if is_sampled(8, p, 0.25)]
    assert not any(is_sampled(7, p, 0.0) for p in range(100))
    assert all(is_sampled(7, p, 1.0) for p in range(100))


def test_sample_writer_one_file_a_period(tmp_path: Path) -> None:
    writer = SampleWriter(tmp_path / "samples")
    writer.write(3, {"prompt": "53", "responses": [{"text": "5"}]})
    writer.write(3, {"prompt": "71", "responses": []})
    writer.write(4, {"prompt": "é"})
    lines = (tmp_path / "samples" / "period-3.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(x)["prompt"] for x in lines] == ["53", "71"]
    assert json.loads((tmp_path / "samples" / "period-4.jsonl").read_text(encoding="utf-8"))["prompt"] == "é"


def test_samples_fraction_out_of_range_names_the_key() -> None:
    with pytest.raises(ConfigError, match="monitor.samples_fraction"):
        load_config(None, ["monitor.samples_fraction=1.5"])


def test_tensorboard_gets_every_numeric_metric_by_period(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = load_config(None, ["monitor.tensorboard=true"])
    writers = make_writers(cfg, tmp_path)
    assert len(writers) == 1 and isinstance(writers[0], TensorBoardWriter)
    recorder = RunRecorder(tmp_path, "periodic", writers)
    rows = [
        {"period": period, "reward_mean": period / 10, "samples_sha256": "x", "group_arrival_s": [1.0]}
        for period in range(3)
    ]
    for row in rows:
        recorder.period(PeriodMetrics.from_row(row))
    for w in writers:
        w.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    numeric = scalars(PeriodMetrics.from_row(rows[0]).to_row())
    assert "cadence/reward_mean" in events.Tags()["scalars"]
    assert set(events.Tags()["scalars"]) == {f"cadence/{key}" for key in numeric}
    assert "samples_sha256" not in numeric and "group_arrival_s" not in numeric
    rewards = events.Scalars("cadence/reward_mean")
    assert [e.step for e in rewards] == [0, 1, 2]
    assert [round(e.value, 6) for e in rewards] == [0.0, 0.1, 0.2]


def test_a_writer_asked_for_but_not_installed_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ConfigError, match=r"cadence\[wandb\]"):
        make_writers(load_config(None, ["monitor.wandb=true"]), tmp_path)
    assert make_writers(load_config(None, []), tmp_path) == []


def test_scalars_leave_out_lists_strings_and_booleans() -> None:
    assert scalars({"a": 1, "b": 2.5, "c": "x", "d": [1], "e": True}) == {"a": 1.0, "b": 2.5}
