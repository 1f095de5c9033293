"""The typed period row: the same `metrics.jsonl` line as ever, and rows of older runs still read."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import msgspec

from cadence.monitor.metrics import PeriodStats
from cadence.monitor.period_metrics import PeriodMetrics
from cadence.monitor.run_dir import RunRecorder, read_jsonl
from tests.conftest import scored


def _metrics() -> PeriodMetrics:
    stats = PeriodStats(period=3, start=100.0)
    stats.arrived(
        102.0, "w1", scored(7, [[1, 2], [3]], [1.0, 0.0], [1.0, 0.0], 1.5, 0.2, {"shape": [1.0, 0.5]})
    )
    stats.arrived(105.0, "w2", scored(8, [[4, 5, 6]], [0.5], [0.0], 2.5, 0.4, {"shape": [0.0]}))
    stats.spans = [(102.5, 104.0), (105.0, 106.0)]
    return stats.finish(end=108.0, publish_s=1.0)


def test_the_row_has_every_field_under_its_old_key() -> None:
    row = _metrics().to_row()
    declared = {f.name for f in dataclasses.fields(PeriodMetrics)}
    episodes = {
        "turns_mean",
        "tool_calls",
        "tool_errors",
        "env_timeouts",
        "env_s",
        "env_wall_s",
        "env_tokens",
        "turn_reward_mean",
        "endings",
        "sequences_mean",  # agent episodes'
        "sequences_max",
        "rewrites",
        "rewrite_share",
        "call_tokens_mean",
        "call_s_mean",
    }
    sampling = {"prompts_issued", "groups_stopped", "groups_arrived", "groups_filtered", "tokens_filtered"}
    sampling |= {"reward_kept_mean", "filtered"}  # an over-sampled run's
    mismatch = {
        f.name for f in dataclasses.fields(PeriodMetrics) if f.name.startswith(("mismatch_", "correction_"))
    }
    not_keys = {"reward_functions", "extra", "workers", "reassigned"} | episodes | sampling | mismatch
    not_keys |= {"weights_from"}  # no worker said how its version came
    assert set(row) == declared - not_keys | {"reward_shape"}
    assert row["reward_shape"] == 0.5 and row["group_arrival_s"] == [2.0, 5.0]
    assert isinstance(row["micro_batch_train_s"], list) and row["micro_batches"] == 2
    assert json.loads(json.dumps(row)) == row


def test_the_row_says_how_each_workers_version_came() -> None:
    stats = PeriodStats(period=1, start=0.0)
    first = msgspec.structs.replace(scored(1, [[1]], [1.0], [1.0], 1.0, 0.2, {}), weights_from="shm")
    stats.arrived(1.0, "rollout-1", first)
    stats.arrived(1.5, "rollout-1", scored(2, [[2]], [0.0], [0.0], 1.0, 0.0, {}))  # the batch's second
    stats.arrived(2.0, "rollout-0", msgspec.structs.replace(first, prompt_id=3, weights_from="zmq"))
    row = stats.finish(end=3.0, publish_s=0.1).to_row()
    assert row["weights_from"] == {"rollout-0": "zmq", "rollout-1": "shm"}
    assert PeriodMetrics.from_row(row).to_row() == row


def test_round_trip() -> None:
    metrics = _metrics()
    row = metrics.to_row()
    assert PeriodMetrics.from_row(row) == metrics
    assert PeriodMetrics.from_row(row).to_row() == row
    recorded = dataclasses.replace(metrics, workers=2, reassigned=1)
    again = recorded.to_row()
    assert (again["workers"], again["reassigned"]) == (2, 1)
    assert PeriodMetrics.from_row(again) == recorded


def test_an_older_row_gets_defaults_and_keeps_unknown_keys() -> None:
    old = {"period": 4, "groups": 4, "samples": 16, "reward_mean": 0.5, "reward_format": 1.0, "gone": "x"}
    metrics = PeriodMetrics.from_row(old)
    assert (metrics.period, metrics.version, metrics.groups, metrics.reward_mean) == (4, 4, 4, 0.5)
    assert (metrics.step_s, metrics.micro_batch_train_s, metrics.samples_sha256) == (0.0, (), "")
    assert metrics.workers is None and metrics.reward_functions == {"format": 1.0}
    assert metrics.extra == {"gone": "x"}
    row = metrics.to_row()
    assert {k: row[k] for k in old} == old and row["step_s"] == 0.0
    assert PeriodMetrics.from_row({}) == PeriodMetrics()


def test_the_recorder_writes_the_row_and_reads_it_back_on_resume(tmp_path: Path) -> None:
    metrics = dataclasses.replace(_metrics(), workers=2, reassigned=0)
    recorder = RunRecorder(tmp_path, "periodic")
    recorder.period(metrics)
    recorder.finish(1.0, 4, "sha")
    (line,) = read_jsonl(tmp_path / "metrics.jsonl")
    assert line == json.loads(json.dumps(metrics.to_row()))
    resumed = RunRecorder(tmp_path, "periodic", resume=True)
    assert resumed.rows == [metrics]
    resumed.finish(2.0, 4, "sha")


def test_an_over_sampled_row_round_trips_with_its_filter_reasons() -> None:
    metrics = dataclasses.replace(
        _metrics(),
        prompts_issued=9,
        groups_stopped=2,
        groups_arrived=8,
        groups_filtered=3,
        tokens_filtered=40,
        reward_kept_mean=0.5,
        filtered={"zero_variance": 2, "my.module:fn": 1},
    )
    row = metrics.to_row()
    assert row["filtered_zero_variance"] == 2 and row["filtered_my.module:fn"] == 1 and "filtered" not in row
    assert (row["prompts_issued"], row["groups_stopped"], row["groups_filtered"]) == (9, 2, 3)
    assert PeriodMetrics.from_row(row) == metrics and PeriodMetrics.from_row(row).to_row() == row
