"""`cadence logs` against real runs: the merged folder view and a live follow through the dispatcher."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.system.gate import GATE_ENV, GATE_SETTINGS
from tests.system.helpers import ROOT, cadence, start_run, wait_until

pytestmark = pytest.mark.timeout(240)


def test_follow_a_live_two_worker_run_through_the_dispatcher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out, gate, followed = tmp_path / "live", tmp_path / "gate", tmp_path / "followed.jsonl"
    monkeypatch.setenv(GATE_ENV, str(gate))  # the run scores nothing until the follower is in
    run = start_run(out, "--set", "periods=60", "--set", "rollout.workers=2", *GATE_SETTINGS)
    follow: subprocess.Popen[bytes] | None = None
    try:
        ready = (out / "dispatcher.addr", out / "config.json")
        wait_until(lambda: all(p.exists() for p in ready), 120, "dispatcher address and config", run.proc)
        address = (out / "dispatcher.addr").read_text().strip()
        with followed.open("w") as sink:
            follow = subprocess.Popen(
                [sys.executable, "-m", "cadence", "logs", "-f", "--connect", address]
                + ["--config", str(out / "config.json"), "--json"],
                cwd=ROOT,
                stdout=sink,
            )
        wait_until(lambda: followed.stat().st_size > 0, 120, "the follower's first event", follow)
        gate.touch()
        code, _, _ = run.finish(120)
        assert follow.wait(120) == 0
    finally:
        if follow is not None:
            follow.kill()
        run.kill()
    assert code == 0
    events = [json.loads(line) for line in followed.read_text().splitlines()]
    assert {"dispatcher", "trainer", "rollout-0", "rollout-1"} <= {e["actor"] for e in events}
    times = [e["time"] for e in events]
    assert times == sorted(times)
    names = {e["event"] for e in events}
    assert {"period_done", "weights_loaded", "run_done"} <= names
    assert "span" not in names  # debug events stay out unless asked for
    # a filtered follow of the finished run's folder agrees with what the files hold
    steps = cadence("logs", str(out), "--actor", "trainer", "--event", "optimizer_step", "--json").stdout
    assert [json.loads(x)["period"] for x in steps.splitlines()] == list(range(60))


def test_connect_without_a_run_id_is_refused_with_a_reason() -> None:
    proc = cadence("logs", "--connect", "tcp://127.0.0.1:9", check=False)
    assert proc.returncode == 2 and "--run-id" in proc.stderr
