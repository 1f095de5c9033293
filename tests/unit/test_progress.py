"""What `cadence run` prints: plain lines without a terminal, one redrawn status line on one."""

from __future__ import annotations

import io
import json
from pathlib import Path

from cadence.monitor.period_metrics import PeriodMetrics
from cadence.monitor.progress import Progress, period_line, status_line

ROW = {
    "reward_mean": 0.5,
    "accuracy": 0.25,
    "period_s": 0.1,
    "overlap_s": 0.05,
    "weight_sync_s": 0.003,
    "tokens_per_s": 1234.0,
    "workers_active": 2,
}


def add(path: Path, *events: dict[str, object]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.writelines(json.dumps(e) + "\n" for e in events)


def test_status_line_counts_groups_and_estimates_time_left() -> None:
    line = status_line(
        period=10, periods=40, groups=3, batch=8, last=PeriodMetrics.from_row(ROW), elapsed=20.0
    )
    assert "period   11/40" in line and "groups   3/8" in line
    assert "reward 0.500" in line and "1234 tok/s" in line
    assert "elapsed 0:20" in line and "left 1:00" in line  # 2 s a period, 30 to go
    assert "left ?" in status_line(period=0, periods=40, groups=0, batch=8, last=None, elapsed=1.0)


def test_without_a_terminal_every_period_is_one_plain_line(tmp_path: Path) -> None:
    out = io.StringIO()
    progress = Progress(tmp_path, periods=3, batch=8, stream=out, live=False)
    add(tmp_path / "metrics.jsonl", {**ROW, "period": 0}, {**ROW, "period": 1})
    progress.poll()
    progress.close()
    lines = out.getvalue().splitlines()
    assert [line.split()[1] for line in lines] == ["1/3", "2/3"]
    assert "\r" not in out.getvalue()


def test_a_periods_line_says_how_the_workers_versions_came() -> None:
    row = PeriodMetrics.from_row({**ROW, "weights_from": {"rollout-0": "shm", "rollout-1": "zmq"}})
    assert "sync 3ms (shm, zmq)  1234 tok/s" in period_line(row, 3)
    assert "sync 3ms  1234 tok/s" in period_line(PeriodMetrics.from_row(ROW), 3)


def test_on_a_terminal_one_line_is_redrawn_with_groups_of_the_current_period(tmp_path: Path) -> None:
    out = io.StringIO()
    progress = Progress(tmp_path, periods=40, batch=8, stream=out, live=True)
    trainer = tmp_path / "logs" / "trainer.jsonl"
    add(trainer, {"event": "span", "kind": "train", "period": 0, "groups": 3})
    add(
        trainer,
        {"event": "span", "kind": "step", "period": 0},
        {"event": "span", "kind": "train", "period": 0},
    )
    progress.poll()
    assert out.getvalue().endswith("groups   4/8  elapsed 0:00  left ?")
    assert out.getvalue().count("\n") == 0
    add(tmp_path / "metrics.jsonl", {**ROW, "period": 0}, {**ROW, "period": 1})  # every 2nd is kept
    add(trainer, {"event": "span", "kind": "train", "period": 2, "groups": 5})
    progress.poll()
    progress.close()
    text = out.getvalue()
    kept = [line for line in text.split("\n")[:-1]]
    assert len(kept) == 1 and kept[0].endswith(period_line_end())
    assert "period    3/40  groups   5/8  reward 0.500" in text
    assert text.endswith("\r\x1b[2K")  # the live line is cleared at the end


def period_line_end() -> str:
    return "1234 tok/s  workers 2"


def test_an_over_sampled_row_says_what_was_issued_kept_filtered_and_stopped() -> None:
    from cadence.monitor.progress import period_line

    row = PeriodMetrics(
        period=2,
        groups=4,
        prompts_issued=9,
        groups_filtered=3,
        groups_stopped=2,
        filtered={"zero_variance": 3},
        tail_s=1.25,
    )
    line = period_line(row, 10)
    assert "issued 9  kept 4  filtered 3 (zero_variance 3)  stopped 2  tail 1.25s" in line
    assert "issued" not in period_line(PeriodMetrics(period=2, groups=4), 10)  # a run without sampling


def test_the_engine_learner_gap_is_shown_only_above_its_level() -> None:
    from cadence.monitor.progress import MISMATCH_SHOWN, period_line

    gap = dict(mismatch_ratio_min=0.25, mismatch_ratio_max=3.5, mismatch_beyond_token_share=0.0125)
    line = period_line(PeriodMetrics(period=2, mismatch_kl=0.02, **gap), 10)  # type: ignore[arg-type]
    assert "mismatch kl 0.02 ratio [0.25, 3.5] beyond 1.25%" in line
    quiet = PeriodMetrics(period=2, mismatch_kl=MISMATCH_SHOWN / 2, **gap)  # type: ignore[arg-type]
    assert "mismatch" not in period_line(quiet, 10)
    assert "mismatch" not in period_line(PeriodMetrics(period=2), 10)  # not measured
