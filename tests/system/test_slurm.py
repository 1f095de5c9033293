"""`cadence slurm` on a real Slurm cluster of three nodes on this machine (network namespaces on one
bridge, each node its own address and hostname; `tests/system/slurm_cluster.py`): a run submitted from
the root namespace as from a login node, grown, shrunk, requeued and stopped, and one whose control job
is requeued by its time-limit signal and finishes from its resume checkpoint. Skipped with the reason
where Slurm or namespaces are missing; `.ci/run` installs Slurm so that CI runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file

from cadence.monitor.run_dir import read_jsonl
from tests.system.helpers import ROOT, SMALL, events, wait_until
from tests.system.slurm_cluster import SlurmCluster, slurm_fixture

pytestmark = [pytest.mark.system, pytest.mark.timeout(900)]

slurm = slurm_fixture  # the cluster, started for each test and torn down after it

QUICK = ["transport.heartbeat_s=0.2", "transport.liveness=10", "rollout.wait_for_workers_s=600"]
SAME_RANKS = ["trainer.micro_batch_tokens=0", "seed=3", *(s for s in SMALL if s != "--set")]


def cadence_slurm(cluster: SlurmCluster, *args: str) -> subprocess.CompletedProcess[str]:
    """`cadence slurm ARGS` from the root namespace (the cluster's login node)."""
    proc = subprocess.run(
        [sys.executable, "-m", "cadence", "slurm", *args],
        cwd=ROOT,
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"cadence slurm {' '.join(args)}: {proc.stdout}\n{proc.stderr}"
    return proc


def jobs(out: Path) -> list[dict[str, str]]:
    return list(json.loads((out / "slurm" / "jobs.json").read_text())["jobs"])


def rows(out: Path) -> list[dict[str, Any]]:
    return read_jsonl(out / "metrics.jsonl") if (out / "metrics.jsonl").exists() else []


def node_of(cluster: SlurmCluster, job: str) -> str:
    running = [j for j in cluster.squeue_jobs() if j["id"] == job and j["state"] == "RUNNING"]
    return running[0]["node"] if running else ""


def cadence_processes(out: Path) -> list[str]:
    """The command lines of processes still running for the run in `out`, on any node."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "cadence" in cmdline and str(out) in cmdline:
            found.append(cmdline)
    return found


def dispatcher_events(out: Path, event: str) -> list[dict[str, Any]]:
    path = out / "logs" / "dispatcher.jsonl"
    return [e for e in events(out, "dispatcher") if e["event"] == event] if path.exists() else []


@pytest.fixture
def out(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "run"


def test_a_run_is_submitted_grown_shrunk_requeued_and_stopped(slurm: SlurmCluster, out: Path) -> None:
    sets = [x for s in [*QUICK, "periods=100000"] for x in ("--set", s)]
    config = str(ROOT / "configs" / "quickstart.toml")
    cadence_slurm(
        slurm, "submit", config, "--out", str(out), "--rollout-jobs", "1", "--sbatch-arg=--exclusive", *sets
    )
    control, first = (j["id"] for j in jobs(out))
    wait_until(lambda: len(rows(out)) >= 5, 300, "5 periods on the cluster")
    assert (
        node_of(slurm, control) and node_of(slurm, first) and node_of(slurm, control) != node_of(slurm, first)
    )
    address = (out / "dispatcher.addr").read_text().strip()
    bridge = slurm.bridge_ip.rsplit(".", 1)[0]
    assert address.startswith(f"tcp://{bridge}.") and not address.startswith("tcp://127.")
    joined = {e["peer"]: e["address"] for e in dispatcher_events(out, "peer_joined")}
    assert joined["trainer"].startswith(f"tcp://{bridge}.") and joined["publisher"].startswith(
        f"tcp://{bridge}."
    )
    # keyed with no step of the user's: its own keys, named in the config every job reads
    keys = json.loads((out / "config.json").read_text())["transport"]["keys"]
    assert keys == str(out / "keys") and (out / "keys" / "server.key_secret").stat().st_mode & 0o777 == 0o600
    assert dispatcher_events(out, "unencrypted_bind") == []

    cadence_slurm(slurm, "add-workers", str(out), "--count", "1")
    added = jobs(out)[-1]["id"]
    wait_until(lambda: any(r["workers"] == 2 for r in rows(out)), 300, "a period with 2 workers")
    assert len({node_of(slurm, j) for j in (control, first, added)} - {""}) == 3  # the third node

    slurm.run("scontrol", "requeue", added)  # preempted and requeued: it rejoins under its name
    name = f"rollout-{added}"
    wait_until(
        lambda: [e["peer"] for e in dispatcher_events(out, "peer_joined")].count(name) == 2, 300, "rejoin"
    )
    slurm.run("scancel", first)  # cancelled: a lost worker, the run goes on
    lost = f"rollout-{first}"
    wait_until(lambda: any(e["peer"] == lost for e in dispatcher_events(out, "worker_lost")), 300, "lost")
    then = len(rows(out))
    wait_until(lambda: len(rows(out)) >= then + 5, 300, "5 periods after the loss")
    status = json.loads(cadence_slurm(slurm, "status", str(out), "--json").stdout)
    states = {j["id"]: (j["state"], j.get("worker")) for j in status["jobs"]}
    assert states[control] == ("RUNNING", None) and states[first] == ("CANCELLED", "lost")
    assert states[added] == ("RUNNING", "joined") and status["run"] == "going"

    stopped = cadence_slurm(slurm, "stop", str(out))
    assert "no job of it is left" in stopped.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stopped"] and summary["periods"] >= then + 5
    assert slurm.squeue_jobs() == []
    # every job that was running ends by itself, none killed; the summary is the checkpoint's version
    assert {j: slurm.job_state(j) for j in (control, added)} == {control: "COMPLETED", added: "COMPLETED"}
    state = json.loads((out / "checkpoints" / "resume" / "state.json").read_text())
    assert state["version"] == summary["final_version"] == summary["periods"]
    assert [r["period"] for r in rows(out)] == list(range(summary["periods"]))
    assert f"stopped after {summary['periods']} periods" in stopped.stdout
    assert dispatcher_events(out, "message_failed") == []
    assert not [e for e in events(out, f"slurm-control-{control}-0") if e["level"] == "error"]
    wait_until(lambda: not cadence_processes(out), 60, "no cadence process of the run left")


def test_a_control_job_requeued_before_its_time_limit_finishes_from_its_checkpoint(
    slurm: SlurmCluster, out: Path
) -> None:
    periods = 120  # 100 left once the stop is sent: the run cannot end before its requeue
    sets = [x for s in [*QUICK, f"periods={periods}"] for x in ("--set", s)]
    config = str(ROOT / "configs" / "quickstart.toml")
    cadence_slurm(
        slurm, "submit", config, "--out", str(out), "--rollout-jobs", "1", "--sbatch-arg=--exclusive", *sets
    )
    control = jobs(out)[0]["id"]
    wait_until(lambda: len(rows(out)) >= 20, 300, "20 periods")
    slurm.run("scancel", "--signal=USR1", control)  # what Slurm sends 120 s before the time limit
    wait_until(lambda: (out / "summary.json").exists(), 600, "the run to finish after its requeue")
    slurm.wait_jobs_gone(120)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["final_version"] == periods and summary["periods"] == periods and "stopped" not in summary
    resumed = [e for e in events(out, "trainer") if e["event"] == "resumed"]
    assert resumed and 20 <= resumed[0]["version"] < periods
    assert [r["period"] for r in rows(out)] == list(range(periods))  # each period once
    joined = [e["peer"] for e in dispatcher_events(out, "peer_joined")]
    assert joined.count(f"rollout-{jobs(out)[1]['id']}") >= 1
    wait_until(lambda: not cadence_processes(out), 60, "no cadence process of the run left")
    assert os.path.exists(out / "checkpoints" / "final")


def test_a_trainer_on_two_nodes_ends_with_the_weights_of_one_rank(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """`--trainer-nodes 2`: torchrun on both nodes of the control job (gloo over their own network),
    the same data and the same final weights as one rank on one machine, within the rank tests' 1e-5."""
    same = [*SAME_RANKS, "periods=4", "trainer.kl_beta=0.05", *QUICK]
    sets = [x for s in same for x in ("--set", s)]
    config = str(ROOT / "configs" / "quickstart.toml")
    reference = tmp_path / "one"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "cadence",
            "run",
            config,
            "--out",
            str(reference),
            *sets,
            "--set",
            "rollout.workers=1",
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=600,
    )
    out = tmp_path / "two"
    cadence_slurm(
        slurm, "submit", config, "--out", str(out), "--trainer-nodes", "2", "--sbatch-arg=--exclusive", *sets
    )
    wait_until(lambda: (out / "summary.json").exists(), 600, "the two-node run to finish")
    slurm.wait_jobs_gone(120)
    assert json.loads((out / "config.json").read_text())["trainer"]["ranks"] == 2
    follower = events(out, "trainer.rank1")
    assert [e["event"] for e in follower] == ["follower_ready", "follower_stopped"]
    assert follower[0]["host"] != events(out, "trainer")[0]["host"]  # the ranks ran on two nodes
    data = [[r["samples_sha256"] for r in rows(run)] for run in (reference, out)]
    assert data[0] == data[1] and len(set(data[0])) == 4
    one, two = (
        load_file(str(run / "checkpoints" / "final" / "model.safetensors")) for run in (reference, out)
    )
    assert max(float((one[k] - two[k]).abs().max()) for k in one) <= 1e-5
    wait_until(lambda: not cadence_processes(out), 60, "no cadence process of the run left")
