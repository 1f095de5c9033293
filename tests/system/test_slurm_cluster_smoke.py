"""The local Slurm cluster of `slurm_cluster.py` works: jobs run on the node asked for, with its
hostname and address, share files, are cancelled and requeued, and teardown leaves nothing behind."""

from __future__ import annotations

import contextlib
import subprocess
import time
from pathlib import Path

import pytest

from tests.system.helpers import wait_until
from tests.system.slurm_cluster import (
    SlurmCluster,
    process_alive,
    slurm_cluster,
    slurm_fixture,  # noqa: F401  (the `slurm` fixture)
    slurm_unavailable,
)

pytestmark = [pytest.mark.system, pytest.mark.timeout(300)]


def _netns_cmdlines(ns: str) -> dict[int, str]:
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=30).stdout
    cmdlines = {}
    for pid in (int(p) for p in out.split()):
        with contextlib.suppress(OSError):
            cmdlines[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    return cmdlines


def _running(slurm: SlurmCluster, ids: list[str]) -> bool:
    jobs = {j["id"]: j for j in slurm.squeue_jobs()}
    return all(jobs.get(i, {}).get("state") == "RUNNING" for i in ids)


def test_jobs_run_on_their_nodes_share_files_and_are_cancelled_and_requeued(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    probe = "hostname; ip -4 -o addr show eth0; sleep 1"
    ids = {
        node: slurm.sbatch("-N1", "-w", node, "-o", f"{out}/%j.out", "--wrap", probe) for node in ("n2", "n3")
    }
    slurm.wait_jobs_gone(120, list(ids.values()))
    for node, job in ids.items():
        assert slurm.job_state(job) == "COMPLETED"
        text = (out / f"{job}.out").read_text()
        assert text.splitlines()[0] == node, text
        assert f"inet {slurm.nodes[node]}/24" in text, text

    # a file a job on n1 writes, a job on n2 reads
    shared = out / "shared.txt"
    first = slurm.sbatch("-w", "n1", "-o", f"{out}/%j.out", "--wrap", f"hostname > {shared}")
    slurm.wait_jobs_gone(120, [first])
    second = slurm.sbatch("-w", "n2", "-o", f"{out}/%j.out", "--wrap", f"cat {shared}")
    slurm.wait_jobs_gone(120, [second])
    assert (out / f"{second}.out").read_text().strip() == "n1"

    # four jobs at once on a node of two CPUs (OverSubscribe=FORCE:4); scancel ends them and their processes
    sleepers = [slurm.sbatch("-w", "n1", "-o", "/dev/null", "--wrap", "sleep 300") for _ in range(4)]
    wait_until(lambda: _running(slurm, sleepers), 120, "four running sleepers on n1", interval_s=0.5)
    assert {j["node"] for j in slurm.squeue_jobs()} == {"n1"}
    slurm.run("scancel", *sleepers)
    slurm.wait_jobs_gone(120)
    assert slurm.squeue_jobs() == []
    ns = slurm.namespaces["n1"]
    wait_until(lambda: not any("sleep" in c for c in _netns_cmdlines(ns).values()), 60, "sleepers killed")

    # a requeued running job runs again
    counter = out / "runs.txt"
    script = tmp_path / "counted.sh"
    script.write_text(f"#!/bin/sh\nhostname >> {counter}\nexec sleep 300\n")
    job = slurm.sbatch("--requeue", "-o", f"{out}/%j.out", str(script))

    def runs() -> int:
        return len(counter.read_text().splitlines()) if counter.exists() else 0

    wait_until(lambda: runs() == 1 and _running(slurm, [job]), 120, "the first run", interval_s=0.5)
    slurm.run("scontrol", "requeue", job)
    wait_until(lambda: runs() == 2 and _running(slurm, [job]), 180, "the second run", interval_s=0.5)
    restarts = slurm.run("scontrol", "show", "job", "-o", job).stdout
    assert "Restarts=1" in restarts, restarts
    slurm.run("scancel", job)
    slurm.wait_jobs_gone(120)


def test_teardown_leaves_no_process_namespace_bridge_or_folder() -> None:
    reason = slurm_unavailable()
    if reason is not None:
        pytest.skip(reason)
    started = time.monotonic()
    with slurm_cluster() as slurm:
        up = time.monotonic()
        job = slurm.sbatch("-w", "n3", "-o", "/dev/null", "--wrap", "sleep 300")
        n3 = slurm.namespaces["n3"]
        wait_until(lambda: _running(slurm, [job]), 120, "a running job", interval_s=0.5)
        wait_until(lambda: any("sleep 300" in c for c in _netns_cmdlines(n3).values()), 60, "the job's sleep")
        pids = [p.pid for p in slurm.daemons.values()]
        pids += [pid for ns in slurm.namespaces.values() for pid in _netns_cmdlines(ns)]
        stopping = time.monotonic()
    done = time.monotonic()
    print(f"cluster up in {up - started:.1f} s, torn down in {done - stopping:.1f} s")
    assert not [pid for pid in pids if process_alive(pid)]
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30).stdout
    assert not any(ns in netns for ns in slurm.namespaces.values())
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, timeout=30).stdout
    assert slurm.bridge not in links
    assert not slurm.conf_dir.exists()
    assert all(p.poll() is not None for p in slurm.daemons.values())
