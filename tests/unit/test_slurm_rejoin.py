"""A rollout task's worker, and what `status` and `stop` say, when the run's dispatcher is still
there, silent, or gone: a worker lost in a network blip rejoins the same dispatcher; a run that ended
stops a worker still waiting for first contact; a run that failed fails its rollout job; a stop of a
run whose control job waits requeued counts the periods its checkpoint holds. The worker is a real
process (a few lines of Python standing in for `cadence rollout`); Slurm's client is the fake."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import structlog

from cadence.launch.slurm.children import Signals
from cadence.launch.slurm.commands import status, stop
from cadence.launch.slurm.rollout import ControlWatch, Rejoins, RolloutTask
from cadence.launch.slurm.scripts import SubmitOptions
from cadence.launch.slurm.submit import submit
from tests.unit.fake_slurm import FakeSlurm
from tests.unit.test_slurm_faults import ROOT_CONFIG, Clock, dead_run, quiet

WORKER = """
import pathlib, sys, time
out, address = pathlib.Path(sys.argv[1]), sys.argv[2]
with (out / "starts").open("a") as f:
    f.write(address + "\\n")
starts = len((out / "starts").read_text().splitlines())
plan = (out / "plan").read_text().split()
what = plan[min(starts, len(plan)) - 1]
if what == "end-run":
    (out / "summary.json").write_text("{}")
    sys.exit(0)
if what == "wait":
    time.sleep(120)
sys.exit(int(what))
"""


def a_run(tmp_path: Path, plan: str) -> tuple[FakeSlurm, Path]:
    """A run whose control job runs and whose dispatcher wrote its address; each worker started does
    what the next word of `plan` says: exit with that status, `wait` (for first contact), or `end-run`."""
    slurm, out = FakeSlurm(), tmp_path / "run"
    submit(ROOT_CONFIG, [], out, SubmitOptions(rollout_jobs=1), run=slurm, say=quiet)
    slurm.queue["101"] = "RUNNING"
    (out / "dispatcher.addr").write_text("tcp://10.0.0.1:5555\n")
    (out / "plan").write_text(plan)
    return slurm, out


def task(
    out: Path, slurm: FakeSlurm, clock: Clock, alive: Callable[[Path], bool], sleep: Callable[[float], None]
) -> RolloutTask:
    def worker(address: str) -> list[str]:
        return [sys.executable, "-c", WORKER, str(out), address]

    watch = ControlWatch(out, slurm, clock)
    return RolloutTask(out, "rollout-102", 1800, worker, {}, Signals(), watch, alive, clock, sleep)


def starts(out: Path) -> list[str]:
    return (out / "starts").read_text().splitlines()


def test_a_worker_lost_in_a_network_blip_rejoins_the_dispatcher_that_is_still_there(tmp_path: Path) -> None:
    slurm, out = a_run(tmp_path, "1 1 end-run")  # lost twice (the dispatcher silent to it), then on
    clock = Clock()
    with structlog.testing.capture_logs() as logs:
        assert task(out, slurm, clock, lambda _: True, clock.sleep).run() == 0
    assert starts(out) == ["tcp://10.0.0.1:5555"] * 3  # the same dispatcher, no new address waited for
    left = [e for e in logs if e["event"] == "worker_left_dispatcher"]
    assert [e["exit"] for e in left] == [1, 1] and all(e["again_in_s"] >= 5 for e in left)


def test_the_pause_before_a_worker_starts_again_grows_while_it_fails_at_once() -> None:
    rejoins = Rejoins()
    assert [rejoins.after(1.0) for _ in range(8)] == [5, 10, 20, 40, 80, 160, 300, 300]
    assert rejoins.after(600.0) == 5  # one that ran a while: a fresh start


def test_a_run_that_failed_fails_its_rollout_job_though_its_worker_was_told_to_stop(tmp_path: Path) -> None:
    slurm, out = a_run(tmp_path, "0 wait")  # Shutdown of a failed run: the worker exits 0
    clock = Clock()

    def control_job_fails(seconds: float) -> None:
        clock.sleep(seconds)
        if clock.now > 20 and "101" in slurm.queue:
            slurm.finish("101", "FAILED")

    alive = lambda _: clock.now < 10  # noqa: E731 - its dispatcher ended
    with structlog.testing.capture_logs() as logs:
        assert task(out, slurm, clock, alive, control_job_fails).run() == 1
    gone = [e for e in logs if e["event"] == "control_job_gone"]
    assert len(gone) == 1 and "101 has ended (FAILED)" in gone[0]["reason"]


def test_a_worker_still_waiting_for_first_contact_ends_with_the_run(tmp_path: Path) -> None:
    slurm, out = a_run(tmp_path, "wait")
    clock = Clock()

    def the_run_is_stopped(seconds: float) -> None:
        clock.sleep(seconds)
        if clock.now > 2 and (out / "starts").exists():
            (out / "summary.json").write_text("{}")

    run = task(out, slurm, clock, lambda _: True, the_run_is_stopped)
    assert run.run() == 0
    assert run.child[0].returncode is not None  # stopped, not left waiting its first_contact_s


def test_status_tells_a_silent_dispatcher_from_a_running_one_and_shows_no_stale_view(tmp_path: Path) -> None:
    slurm, out = a_run(tmp_path, "")
    slurm.queue["102"] = "RUNNING"
    (out / "logs").mkdir()
    (out / "logs" / "dispatcher.jsonl").write_text(
        json.dumps({"event": "peer_joined", "peer": "rollout-102", "role": "rollout", "ts": "t"}) + "\n"
    )
    going = status(out, slurm, alive=lambda _: 4.0)
    assert going["run"] == "going" and going["jobs"][1]["worker"] == "joined"
    silent = status(out, slurm, alive=lambda _: 160.0)  # its node died: Slurm says RUNNING for minutes
    assert silent["run"] == "silent" and silent["dispatcher_silent_s"] == 160
    assert silent["jobs"][1]["worker"] == "no dispatcher"
    dead_slurm, dead = dead_run(tmp_path / "dead")
    (dead / "logs").mkdir()
    (dead / "logs" / "dispatcher.jsonl").write_text(
        json.dumps({"event": "peer_joined", "peer": "rollout-102", "role": "rollout", "ts": "t"}) + "\n"
    )
    assert [j.get("worker") for j in status(dead, dead_slurm)["jobs"]] == [
        None,
        "no dispatcher",
        "no dispatcher",
    ]


def test_a_stop_of_a_run_whose_dispatcher_is_silent_cancels_its_jobs_at_once(tmp_path: Path) -> None:
    slurm, out = a_run(tmp_path, "")
    (out / "metrics.jsonl").write_text(
        "".join(json.dumps({"period": k, "groups": 1}) + "\n" for k in range(3))
    )
    said: list[str] = []
    summary = stop(out, timeout_s=30, run=slurm, say=said.append, alive=lambda _: 160.0)
    assert not (out / "slurm" / "stop").exists()  # nobody there to read it
    assert summary["periods"] == 3 and summary["control_job"] == "101 RUNNING, its dispatcher silent"
    assert slurm.queue == {}


def test_a_stop_while_the_control_job_waits_requeued_counts_the_periods_its_checkpoint_holds(
    tmp_path: Path,
) -> None:
    slurm, out = dead_run(tmp_path, periods=60)
    slurm.ended.pop("101")
    slurm.queue["101"] = "PENDING"  # requeued, waiting to start again
    (out / "checkpoints" / "resume").mkdir(parents=True)
    (out / "checkpoints" / "resume" / "state.json").write_text('{"version": 50}')
    said: list[str] = []
    summary = stop(out, timeout_s=30, run=slurm, say=said.append)
    assert summary["periods"] == 50 and summary["final_version"] == 50 and summary["after_checkpoint"] == 10
    assert "stopped after 50 periods; resume checkpoint at version 50" in said[-1]
