"""`cadence logs` against real runs: the merged folder view and a live follow through the dispatcher."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.system.helpers import cadence, start_run, wait_until

pytestmark = pytest.mark.timeout(240)


def test_follow_a_live_two_worker_run_through_the_dispatcher(tmp_path: Path) -> None:
    out = tmp_path / "live"
    run = start_run(out, "--set", "periods=60", "--set", "rollout.workers=2")
    try:
        ready = (out / "dispatcher.addr", out / "config.json")
        wait_until(lambda: all(p.exists() for p in ready), 120, "dispatcher address and config", run.proc)
        address = (out / "dispatcher.addr").read_text().strip()
        follow = cadence(
            "logs", "-f", "--connect", address, "--config", str(out / "config.json"), "--json", timeout=180
        )
        code, _, _ = run.finish(120)
    finally:
        run.kill()
    assert code == 0
    events = [json.loads(line) for line in follow.stdout.splitlines()]
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
