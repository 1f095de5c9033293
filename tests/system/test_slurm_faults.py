"""`cadence slurm` when things go wrong, on the real Slurm cluster of `slurm_cluster.py`: a refused
submission leaves nothing and the same command then works; a rollout job whose control job is
cancelled before it ever ran gives up instead of holding its node; a control job requeued without a
resume checkpoint refuses to count the run's periods twice, and `status`, `add-workers` and `stop`
say what is true of the dead run; a worker cut off by a network blip rejoins its dispatcher, and the
dispatcher's view of a worker on a dead node beside Slurm's.
All share one cluster; the test that kills a node comes last (its teardown removes the rest)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cadence.monitor.run_dir import read_jsonl
from tests.system.helpers import ROOT, events, wait_until
from tests.system.slurm_cluster import (
    SlurmCluster,
    _ip,
    _kill_netns,
    slurm_cluster,
    slurm_unavailable,
)

pytestmark = [pytest.mark.system, pytest.mark.timeout(600)]

QUICK = ["transport.heartbeat_s=0.2", "transport.liveness=10", "rollout.wait_for_workers_s=600"]
CONFIG = str(ROOT / "configs" / "quickstart.toml")


@pytest.fixture(scope="module")
def shared() -> Iterator[SlurmCluster]:
    """One cluster for the tests that leave it whole."""
    reason = slurm_unavailable()
    if reason is not None:
        pytest.skip(reason)
    with slurm_cluster() as cluster:
        yield cluster


def cadence_slurm(cluster: SlurmCluster, *args: str) -> subprocess.CompletedProcess[str]:
    """`cadence slurm ARGS` from the root namespace (the cluster's login node), whatever it exits with."""
    return subprocess.run(
        [sys.executable, "-m", "cadence", "slurm", *args],
        cwd=ROOT,
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, f"{proc.args}: {proc.stdout}\n{proc.stderr}"
    return proc.stdout


def refused(proc: subprocess.CompletedProcess[str], *words: str) -> None:
    """Exit 2, one line on stderr holding `words`."""
    assert proc.returncode == 2, f"{proc.args}: {proc.stdout}\n{proc.stderr}"
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and all(w in lines[0] for w in words), proc.stderr


def sets(*extra: str) -> list[str]:
    return [x for s in [*QUICK, *extra] for x in ("--set", s)]


def jobs(out: Path) -> list[dict[str, str]]:
    return list(json.loads((out / "slurm" / "jobs.json").read_text())["jobs"])


def rows(out: Path) -> list[dict[str, Any]]:
    return read_jsonl(out / "metrics.jsonl") if (out / "metrics.jsonl").exists() else []


def task_events(out: Path, role: str, job: str, event: str) -> list[dict[str, Any]]:
    name = f"slurm-{role}-{job}-0"
    path = out / "logs" / f"{name}.jsonl"
    return [e for e in events(out, name) if e["event"] == event] if path.exists() else []


def listed(cluster: SlurmCluster, job: str) -> str:
    return next((j["state"] for j in cluster.squeue_jobs() if j["id"] == job), "")


def test_a_refused_submission_leaves_nothing_and_a_rollout_job_never_outwaits_its_control_job(
    shared: SlurmCluster, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    refused(
        cadence_slurm(shared, "submit", CONFIG, "--out", str(out), "--rollout-partition", "nope"),
        "--rollout-partition: partition 'nope' is not one of this cluster's: main",
    )
    refused(
        cadence_slurm(shared, "submit", CONFIG, "--out", str(out), "--time", "banana"),
        "Slurm refuses the control job",
        "Invalid --time specification",
    )
    assert shared.squeue_jobs() == [] and not out.exists()  # no job, nothing written
    # the same --out, submitted held: the rollout job is let go alone, its control job never runs
    ok(cadence_slurm(shared, "submit", CONFIG, "--out", str(out), "--sbatch-arg=--hold", *sets()))
    control, worker = (j["id"] for j in jobs(out))
    shared.run("scontrol", "update", f"jobid={worker}", "dependency=")
    shared.run("scontrol", "release", worker)
    wait_until(lambda: listed(shared, worker) == "RUNNING", 120, "the rollout job running alone")
    assert listed(shared, control) == "PENDING" and not (out / "dispatcher.addr").exists()
    shared.run("scancel", control)
    shared.wait_jobs_gone(120, [worker])  # it gives up by itself, within a look at Slurm
    (gone,) = task_events(out, "rollout", worker, "control_job_gone")
    assert f"control job {control} has ended (CANCELLED)" in gone["reason"]
    assert shared.job_state(worker) == "FAILED"
    state = json.loads(ok(cadence_slurm(shared, "status", str(out), "--json")))
    assert state["run"] == "dead" and state["control"] == {"id": control, "state": "CANCELLED"}
    refused(cadence_slurm(shared, "add-workers", str(out)), f"control job {control} has ended (CANCELLED)")
    said = ok(cadence_slurm(shared, "stop", str(out)))
    assert "stopped after 0 periods" in said and json.loads((out / "summary.json").read_text())["stopped"]


def test_a_control_job_requeued_without_a_checkpoint_never_counts_a_period_twice(
    shared: SlurmCluster, tmp_path: Path
) -> None:
    """trainer.checkpoint_every = 0 (the default) and a requeue that is no time-limit signal (a node
    failure, an admin's scontrol requeue): the requeued job refuses to start the run over."""
    out = tmp_path / "run"
    ok(cadence_slurm(shared, "submit", CONFIG, "--out", str(out), "--sbatch-arg=--exclusive",
                     *sets("periods=100000")))  # fmt: skip
    control, worker = (j["id"] for j in jobs(out))
    wait_until(lambda: len(rows(out)) >= 3, 300, "3 periods on the cluster")
    shared.run("scontrol", "requeue", control)
    wait_until(lambda: task_events(out, "control", control, "control_cannot_resume"), 300, "the refusal")
    shared.wait_jobs_gone(120, [control, worker])  # the rollout job ends with its control job
    assert shared.job_state(control) == "FAILED"
    assert not task_events(out, "control", control, "dispatcher_killed")  # the requeue's SIGTERM: no error
    recorded = [r["period"] for r in rows(out)]
    assert recorded == list(range(len(recorded))) and len(recorded) >= 3  # each period once
    assert task_events(out, "rollout", worker, "control_job_gone")
    state = json.loads(ok(cadence_slurm(shared, "status", str(out), "--json")))
    assert state["run"] == "dead" and state["periods"] == len(recorded)
    text = ok(cadence_slurm(shared, "status", str(out)))
    assert (
        f"run dead: its control job {control} is FAILED" in text and f"holds {len(recorded)} periods" in text
    )
    refused(cadence_slurm(shared, "add-workers", str(out)), "(FAILED) without ending the run")
    said = ok(cadence_slurm(shared, "stop", str(out)))
    assert f"stopped after {len(recorded)} periods" in said
    assert json.loads((out / "summary.json").read_text())["periods"] == len(recorded)


def test_a_worker_cut_off_by_a_blip_rejoins_and_one_on_a_dead_node_is_lost_before_slurm_knows(
    shared: SlurmCluster, tmp_path: Path
) -> None:
    """A rollout node's link down past the liveness: its worker is declared lost and ends; its task
    starts it again against the same dispatcher, which takes it back once the link is up. Then that
    node dies: `status` shows its worker lost while Slurm says RUNNING. Last in this module: the node
    it kills stays dead until the cluster is torn down."""
    slurm, out = shared, tmp_path / "run"
    ok(cadence_slurm(slurm, "submit", CONFIG, "--out", str(out), "--rollout-jobs", "2",
                     "--sbatch-arg=--exclusive", *sets("periods=100000")))  # fmt: skip
    _, first, second = (j["id"] for j in jobs(out))
    wait_until(lambda: any(r["workers"] == 2 for r in rows(out)), 300, "a period with 2 workers")
    node = next(j["node"] for j in slurm.squeue_jobs() if j["id"] == second)
    link = f"slv{slurm.bridge.removeprefix('slbr')}{node}"
    _ip("link", "set", link, "down")
    try:  # the link back once the task has started its worker again, which then waits for first contact
        wait_until(
            lambda: len(task_events(out, "rollout", second, "rollout_task_joins")) >= 2, 60, "a rejoin"
        )
    finally:
        _ip("link", "set", link, "up")
    assert task_events(out, "rollout", second, "worker_left_dispatcher")
    joins = task_events(out, "rollout", second, "rollout_task_joins")
    assert len({e["dispatcher"] for e in joins}) == 1  # the same dispatcher, no new address waited for
    before = len(rows(out))
    wait_until(lambda: any(r["workers"] == 2 for r in rows(out)[before:]), 300, "2 workers again")
    _kill_netns(slurm.namespaces[node])  # the node dies: its slurmd and every process on it

    def lost() -> dict[str, Any] | None:
        state = json.loads(ok(cadence_slurm(slurm, "status", str(out), "--json")))
        found = {j["id"]: j for j in state["jobs"]}
        return found if found[second]["worker"] == "lost" else None

    wait_until(lost, 120, f"the dispatcher's view of rollout-{second} on the dead node")
    found = lost()
    assert found is not None and found[first]["worker"] == "joined"
    assert found[second]["state"] == "RUNNING"  # Slurm notices only after SlurmdTimeout (300 s)
    text = ok(cadence_slurm(slurm, "status", str(out)))
    assert any(second in line and "dispatcher: lost" in line for line in text.splitlines())
