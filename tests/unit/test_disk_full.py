"""A full disk under a run's folder: log lines are dropped and counted, never raised into an actor; a
metrics row is kept whole from the recorder's reserve and the run then ends naming the disk; a file
written whole leaves no temporary file behind. The disk's refusals are the kernel's own (`/dev/full`
answers every write with ENOSPC) or, where a disk with a little room left is needed, an `os.write`
that refuses while the reserve takes that room."""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import structlog

from cadence.launch.slurm.allocation import SlurmError
from cadence.launch.slurm.commands import stop
from cadence.log import FileSink, configure_logging, dropped_note
from cadence.monitor.period_metrics import PeriodMetrics
from cadence.monitor.run_dir import DiskFull, RunRecorder, write_json
from tests.unit.test_slurm_faults import dead_run

ROW = {"period": 0, "groups": 4, "samples": 16, "reward_mean": 0.5}


def full_disk() -> int:
    return os.open("/dev/full", os.O_WRONLY)


def test_a_log_file_on_a_full_disk_drops_lines_counts_them_and_says_how_many_once_it_can(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "dispatcher.jsonl"
    sink = FileSink(path, dropped_note({"actor": "dispatcher", "host": "h", "pid": 1}))
    assert sink.write('{"event": "before"}')
    room, sink.fd = sink.fd, full_disk()
    assert not any([sink.write(f'{{"event": "lost{i}"}}') for i in range(3)])
    assert sink.dropped == 3
    os.close(sink.fd)
    sink.fd = room  # room again
    assert sink.write('{"event": "after"}')
    sink.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [e["event"] for e in lines] == ["before", "log_lines_dropped", "after"]
    assert lines[1]["dropped"] == 3 and lines[1]["actor"] == "dispatcher" and lines[1]["level"] == "warning"
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 1 and "No space left on device" in said[0] and str(path) in said[0]


def test_an_actor_logging_to_a_full_disk_goes_on(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "dispatcher.jsonl").symlink_to("/dev/full")
    configure_logging("dispatcher", logs, "warning")
    try:
        for i in range(20):
            structlog.get_logger().info("period_done", period=i)  # raised ENOSPC into the actor before
    finally:
        structlog.reset_defaults()
    said = [line for line in capsys.readouterr().err.splitlines() if "cannot write" in line]
    assert len(said) == 1 and "log lines are dropped and counted" in said[0]


class ReserveTakesTheRoom:
    """An `os.write` to the metrics file that the disk refuses while the recorder's reserve is there:
    the first call writes half its bytes, then ENOSPC (a row torn on its way)."""

    def __init__(self, recorder: RunRecorder, write: Callable[[int, bytes], int]) -> None:
        self.recorder, self.write, self.calls = recorder, write, 0

    def __call__(self, fd: int, data: bytes) -> int:
        if fd == self.recorder._metrics and self.recorder.reserve.exists():
            self.calls += 1
            if self.calls == 1:
                return self.write(fd, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self.write(fd, data)


def test_the_row_a_full_disk_refuses_is_kept_whole_from_the_reserve_then_the_run_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder = RunRecorder(tmp_path, "periodic")
    recorder.period(PeriodMetrics.from_row(ROW))
    assert recorder.reserve.stat().st_size > 0
    monkeypatch.setattr(os, "write", ReserveTakesTheRoom(recorder, os.write))
    with pytest.raises(DiskFull, match=f"the disk of {tmp_path} is full: the run ends after period 1"):
        recorder.period(PeriodMetrics.from_row({**ROW, "period": 1}))
    monkeypatch.undo()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["period"] for r in rows] == [0, 1]  # each whole, each once
    assert not recorder.reserve.exists()
    summary = recorder.finish(10.0, 2, "")
    assert summary["periods"] == 2 and json.loads((tmp_path / "summary.json").read_text())["periods"] == 2


def test_a_row_the_disk_refuses_even_without_the_reserve_ends_the_run_naming_it(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").symlink_to("/dev/full")
    recorder = RunRecorder(tmp_path, "periodic")
    with pytest.raises(DiskFull, match="is full \\(No space left on device\\): the row of period 0 is not"):
        recorder.period(PeriodMetrics.from_row(ROW))
    recorder.close()


def test_a_file_written_whole_on_a_full_disk_leaves_no_temporary_file(tmp_path: Path) -> None:
    (tmp_path / f".summary.json.{os.getpid()}.tmp").symlink_to("/dev/full")  # where its bytes would go
    with pytest.raises(OSError, match="No space left"):
        write_json(tmp_path / "summary.json", {"periods": 3})
    assert list(tmp_path.iterdir()) == []


def test_stop_on_a_full_disk_says_so_in_one_line_leaves_nothing_half_written_and_works_once_there_is_room(
    tmp_path: Path,
) -> None:
    slurm, out = dead_run(tmp_path)  # its dispatcher died of the full disk: control job FAILED
    tmp = out / f".summary.json.{os.getpid()}.tmp"
    tmp.symlink_to("/dev/full")
    with pytest.raises(SlurmError) as refused:
        stop(out, timeout_s=30, run=slurm, say=lambda _: None)
    assert "summary.json not written" in str(refused.value) and "No space left on device" in str(
        refused.value
    )
    assert "\n" not in str(refused.value) and "run `cadence slurm stop" in str(refused.value)
    assert not tmp.exists() and not (out / "summary.json").exists() and slurm.queue == {}
    said: list[str] = []
    assert stop(out, timeout_s=30, run=slurm, say=said.append)["periods"] == 11  # room again
    assert "stopped after 11 periods" in said[-1]


def test_a_sample_the_disk_refuses_is_dropped_and_counted_never_raised_into_the_trainer(
    tmp_path: Path,
) -> None:
    from cadence.monitor.samples import SampleWriter

    writer = SampleWriter(tmp_path / "samples")
    writer.write(0, {"prompt": "kept"})
    (tmp_path / "samples" / "period-1.jsonl").symlink_to("/dev/full")
    with structlog.testing.capture_logs() as logs:
        writer.write(1, {"prompt": "refused"})
        writer.write(1, {"prompt": "refused again"})
    assert writer.dropped == 2 and [e["event"] for e in logs] == ["samples_dropped"]  # said once
    assert json.loads((tmp_path / "samples" / "period-0.jsonl").read_text()) == {"prompt": "kept"}


def test_a_command_that_meets_a_full_disk_says_so_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from cadence.cli import main

    (tmp_path / "metrics.jsonl").write_text(json.dumps({**ROW, "period_s": 1.0}) + "\n")
    (tmp_path / "plot.png").symlink_to("/dev/full")
    assert main(["plot", str(tmp_path), "-o", str(tmp_path / "plot.png")]) == 1
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and said[0].startswith("cadence: the disk is full (No space left on device)")
