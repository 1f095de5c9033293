"""`cadence slurm` when things go wrong, by faking what Slurm's client commands answer: a refused
submission leaves nothing behind, a dead control job is named by every command, a stop lets the jobs
end on their own, and a rollout task never waits for a dispatcher without end or in silence."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest
import structlog

from cadence.launch.slurm.allocation import SlurmError
from cadence.launch.slurm.children import Signals
from cadence.launch.slurm.commands import add_workers, status, stop
from cadence.launch.slurm.rollout import ControlWatch, next_dispatcher
from cadence.launch.slurm.scripts import SubmitOptions
from cadence.launch.slurm.submit import submit
from tests.unit.fake_slurm import FakeSlurm

ROOT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "quickstart.toml"


def quiet(_: str) -> None:
    pass


def test_a_bad_rollout_partition_is_refused_before_any_job_is_submitted(tmp_path: Path) -> None:
    slurm = FakeSlurm()
    opts = SubmitOptions(rollout_jobs=2, rollout_partition="gpux")
    with pytest.raises(
        SlurmError, match="--rollout-partition: partition 'gpux' is not one of this cluster's"
    ):
        submit(ROOT_CONFIG, [], tmp_path / "run", opts, run=slurm, say=quiet)
    assert slurm.submitted() == [] and not (tmp_path / "run").exists()


def test_a_submission_slurm_refuses_leaves_nothing_and_the_same_command_then_works(tmp_path: Path) -> None:
    slurm, out = FakeSlurm(), tmp_path / "run"
    slurm.refuse["--time=banana"] = "Invalid time limit specification"
    with pytest.raises(SlurmError, match="Slurm refuses the control job: .*Invalid time limit"):
        submit(ROOT_CONFIG, [], out, SubmitOptions(time="banana"), run=slurm, say=quiet)
    assert slurm.submitted() == [] and not out.exists()
    out.mkdir()
    (out / "notes.txt").write_text("mine")  # a folder of the user's: kept, and only that
    with pytest.raises(SlurmError, match="Invalid time limit"):
        submit(ROOT_CONFIG, [], out, SubmitOptions(time="banana"), run=slurm, say=quiet)
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    jobs = submit(ROOT_CONFIG, [], out, SubmitOptions(time="1:00:00"), run=slurm, say=quiet)
    assert [j["role"] for j in jobs] == ["control", "rollout"]


def test_a_later_refusal_cancels_the_jobs_already_submitted_and_removes_what_was_written(
    tmp_path: Path,
) -> None:
    slurm, out, said = FakeSlurm(), tmp_path / "run", list[str]()
    slurm.refuse["--dependency=after:101"] = "Batch job submission failed: QOSMaxSubmitJobPerUserLimit"
    with pytest.raises(SlurmError, match="QOSMaxSubmitJobPerUserLimit.*nothing of this submission is left"):
        submit(ROOT_CONFIG, [], out, SubmitOptions(rollout_jobs=2), run=slurm, say=said.append)
    assert ["scancel", "101"] in slurm.calls and slurm.queue == {} and not out.exists()
    assert any("cancelled 101" in s for s in said)


def dead_run(tmp_path: Path, periods: int = 11) -> tuple[FakeSlurm, Path]:
    """A run whose control job failed after `periods` periods, its two rollout jobs still running."""
    slurm, out = FakeSlurm(), tmp_path / "run"
    submit(ROOT_CONFIG, [], out, SubmitOptions(rollout_jobs=2), run=slurm, say=quiet)
    row = {"period": 0, "groups": 4, "samples": 16, "reward_mean": 0.5}
    text = "".join(json.dumps({**row, "period": k}) + "\n" for k in range(periods))
    (out / "metrics.jsonl").write_text(text)
    slurm.queue.update({"102": "RUNNING", "103": "RUNNING"})
    slurm.finish("101", "FAILED")
    return slurm, out


def test_every_command_says_what_is_true_of_a_run_whose_control_job_died(tmp_path: Path) -> None:
    slurm, out = dead_run(tmp_path)
    state = status(out, run=slurm)
    assert state["run"] == "dead" and state["control"] == {"id": "101", "state": "FAILED"}
    assert state["periods"] == 11 and state["jobs"][0]["state"] == "FAILED"
    with pytest.raises(SlurmError, match="control job 101 has ended \\(FAILED\\) without ending the run"):
        add_workers(out, 1, run=slurm, say=quiet)
    assert len(slurm.submitted()) == 3  # none added
    said: list[str] = []
    summary = stop(out, timeout_s=30, run=slurm, say=said.append)
    assert summary["periods"] == 11 and summary["stopped"] and summary["control_job"] == "101 FAILED"
    assert json.loads((out / "summary.json").read_text())["periods"] == 11
    assert "stopped after 11 periods" in said[-1] and "101 FAILED" in said[-1] and slurm.queue == {}


def test_a_stop_lets_the_running_jobs_end_on_their_own_and_cancels_only_those_never_started(
    tmp_path: Path,
) -> None:
    slurm, out = FakeSlurm(), tmp_path / "run"
    submit(ROOT_CONFIG, [], out, SubmitOptions(rollout_jobs=2), run=slurm, say=quiet)
    slurm.queue.update({"101": "RUNNING", "102": "RUNNING"})  # 103 still pending
    answer = slurm.__call__

    def control_task_ends_the_run(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
        if (out / "slurm" / "stop").exists() and not (out / "summary.json").exists():
            (out / "summary.json").write_text(json.dumps({"periods": 5, "stopped": True}))
            slurm.finish("101", "COMPLETED")
            slurm.finish("102", "COMPLETED")
        return answer(args)

    said: list[str] = []
    summary = stop(out, timeout_s=30, run=control_task_ends_the_run, say=said.append)
    cancelled = [c for c in slurm.calls if c[0] == "scancel"]
    assert summary["periods"] == 5 and cancelled == [["scancel", "103"]]
    assert "101 COMPLETED, 102 COMPLETED, 103 CANCELLED" in said[-1]


def test_status_shows_the_dispatchers_view_of_each_worker_beside_slurms(tmp_path: Path) -> None:
    slurm, out = FakeSlurm(), tmp_path / "run"
    submit(ROOT_CONFIG, [], out, SubmitOptions(rollout_jobs=3), run=slurm, say=quiet)
    slurm.queue.update({"101": "RUNNING", "102": "RUNNING", "103": "RUNNING", "104": "RUNNING"})
    events = [
        {
            "event": "peer_joined",
            "peer": "rollout-102",
            "role": "rollout",
            "ts": "t0",
        },  # an earlier dispatcher
        {"event": "dispatcher_started", "ts": "t1"},
        {"event": "peer_joined", "peer": "rollout-102", "role": "rollout", "ts": "t2"},
        {"event": "peer_joined", "peer": "rollout-103", "role": "rollout", "ts": "t3"},
        {"event": "worker_lost", "peer": "rollout-103", "reason": "silent", "ts": "t4"},
    ]
    (out / "logs").mkdir()
    text = "".join(json.dumps(e) + "\n" for e in events) + '{"event": "peer_jo'  # one being written
    (out / "logs" / "dispatcher.jsonl").write_text(text)
    state = status(out, run=slurm)
    assert [(j["id"], j["state"], j.get("worker")) for j in state["jobs"]] == [
        ("101", "RUNNING", None),
        ("102", "RUNNING", "joined"),
        ("103", "RUNNING", "lost"),  # its node died: Slurm does not know yet, the dispatcher does
        ("104", "RUNNING", "not seen"),
    ]
    assert state["run"] == "going"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def waiting(tmp_path: Path) -> tuple[FakeSlurm, Path, Clock]:
    slurm, out = FakeSlurm(), tmp_path / "run"
    submit(ROOT_CONFIG, [], out, SubmitOptions(rollout_jobs=1), run=slurm, say=quiet)
    return slurm, out, Clock()


def test_a_rollout_task_gives_up_when_its_control_job_has_ended(tmp_path: Path) -> None:
    slurm, out, clock = waiting(tmp_path)
    watch = ControlWatch(out, slurm, clock)
    slurm.queue["101"] = "PENDING"

    def cancel_after_a_minute(seconds: float) -> None:
        clock.sleep(seconds)
        if clock.now >= 60 and "101" in slurm.queue:
            slurm.finish("101", "CANCELLED")

    with pytest.raises(SlurmError, match="control job 101 has ended \\(CANCELLED\\) without ending the run"):
        next_dispatcher(out, None, watch, 1800, Signals(), clock, cancel_after_a_minute)
    assert 60 <= clock.now <= 60 + watch.every_s + 1  # within one look at Slurm


def test_a_rollout_task_waits_for_a_pending_control_job_saying_so_and_within_its_bound(
    tmp_path: Path,
) -> None:
    slurm, out, clock = waiting(tmp_path)
    slurm.queue["101"] = "PENDING"
    with (
        structlog.testing.capture_logs() as logs,
        pytest.raises(SlurmError, match="wait_for_dispatcher_s = 300"),
    ):
        next_dispatcher(out, None, ControlWatch(out, slurm, clock), 300, Signals(), clock, clock.sleep)
    said = [e for e in logs if e["event"] == "waiting_for_dispatcher"]
    assert 9 <= len(said) <= 10 and said[0]["control"] == "101"  # every 30 s, not every poll


def test_a_rollout_task_takes_a_new_address_and_ends_with_the_run(tmp_path: Path) -> None:
    slurm, out, clock = waiting(tmp_path)
    slurm.queue["101"] = "RUNNING"
    watch = ControlWatch(out, slurm, clock)

    def dispatcher_binds(seconds: float) -> None:
        clock.sleep(seconds)
        if clock.now >= 10:
            (out / "dispatcher.addr").write_text("tcp://10.0.0.1:5555\n")

    address, seen = next_dispatcher(out, None, watch, 60, Signals(), clock, dispatcher_binds) or ("", 0)
    assert address == "tcp://10.0.0.1:5555"
    (out / "summary.json").write_text("{}")
    assert next_dispatcher(out, seen, watch, 60, Signals(), clock, clock.sleep) is None
