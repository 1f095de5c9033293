"""The gloo weight broadcast in a whole run from the command line: a worker added mid-run pulls its first
version over ZeroMQ and is in the broadcasts from the next one; a worker killed mid-run is named by the
trainer, dropped from the group, and the run completes on the broadcast with the workers left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cadence.monitor.run_dir import read_jsonl
from tests.system.helpers import ROOT, events, start_run, summary, wait_until

pytestmark = [pytest.mark.system, pytest.mark.timeout(300)]

PERIODS = 600  # long enough for a worker started mid-run to join it on a loaded machine
B = 4  # task.prompts_per_period in SMALL


def _loads(run: Path, actor: str) -> list[dict[str, Any]]:
    path = run / "logs" / f"{actor}.jsonl"
    if not path.exists():
        return []
    return [e for e in events(run, actor) if e["event"] == "weights_loaded"]


def test_gloo_broadcast_through_hot_add_and_worker_loss(tmp_path: Path) -> None:
    out = tmp_path / "run"
    run = start_run(
        out,
        "--set",
        f"periods={PERIODS}",
        "--set",
        "weights.transport='gloo'",
        "--set",
        "weights.broadcast_timeout_s=5.0",  # a bound on a live member: generous on a loaded machine
        "--set",
        "transport.heartbeat_s=0.1",
        "--set",
        "transport.liveness=10",
    )
    added: subprocess.Popen[bytes] | None = None
    try:
        wait_until(
            lambda: all(any(e["source"] == "gloo" for e in _loads(out, f"rollout-{i}")) for i in (0, 1)),
            120,
            "two workers on the broadcast",
            run.proc,
            0.05,
        )
        address = (out / "dispatcher.addr").read_text().strip()
        added = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "cadence",
                "rollout",
                "--config",
                str(out / "config.json"),
                "--connect",
                address,
                "--out",
                str(out),
                "--name",
                "rollout-2",
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=(tmp_path / "rollout-2.stderr").open("w"),
        )
        wait_until(
            lambda: any(e["source"] == "gloo" for e in _loads(out, "rollout-2")),
            120,
            "the added worker on the broadcast",
            run.proc,
            0.05,
        )
        pid = int(events(out, "rollout-1")[0]["pid"])
        os.kill(pid, signal.SIGKILL)
        killed_at = len(read_jsonl(out / "metrics.jsonl"))
        code, stdout, stderr = run.finish(timeout=240)
        assert code == 0, stderr
    finally:
        run.kill()
        if added is not None:
            added.kill()
            added.wait()
    s = summary(out)
    assert s["periods"] == PERIODS and s["groups_trained"] == PERIODS * B and s["stale_dropped"] == 0

    trainer = events(out, "trainer")
    failed = [e for e in trainer if e["event"] == "broadcast_failed"]
    assert failed and "rollout-1" in failed[0]["missing"]
    broken = {e["version"] for e in failed}  # the workers left pulled those (or had them already)

    # the added worker: versions before the one its join was granted from pulled (shared memory on
    # this host), the rest broadcast
    joined = [e for e in events(out, "rollout-2") if e["event"] == "broadcast_joined"]
    loads = _loads(out, "rollout-2")
    assert joined and loads
    for e in loads:
        if e["version"] < joined[0]["from_version"]:
            assert e["source"] in ("shm", "zmq"), e  # pulled: mapped on this host, or over ZeroMQ
        elif e["version"] not in broken:
            assert e["source"] == "gloo", e
    sent = [e for e in trainer if e["event"] == "weights_broadcast"]
    rosters = [frozenset(e["members"]) for e in sent]  # in join order, which start-up decides
    assert {"rollout-0", "rollout-1"} in rosters
    assert {"rollout-0", "rollout-1", "rollout-2"} in rosters  # hot add: a new generation
    assert rosters[-1] == {"rollout-0", "rollout-2"}  # the killed worker is out of the group
    assert sent[-1]["version"] == PERIODS  # broadcasts went on to the last version
    # the workers left loaded the versions after the loss from the broadcast, bar the one that broke
    late = [e for e in _loads(out, "rollout-0") if e["version"] > max(broken)]
    assert late and all(e["source"] == "gloo" for e in late)
    assert killed_at < PERIODS
