"""A run with `transport.keys`: real processes on loopback, every socket CURVE-encrypted.

The run's own worker is started as a user would start one on another machine (`cadence rollout
--config config.json`, the keys folder named there) and joins; a worker started without keys while the
run goes on is refused (and named in the dispatcher's log), and the run completes with every group
trained.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.system.gate import GATE_ENV, GATE_SETTINGS
from tests.system.helpers import ROOT, cadence, events, start_run, summary, wait_until

pytestmark = [pytest.mark.system, pytest.mark.timeout(300)]

PERIODS = 40
B = 4  # task.prompts_per_period in SMALL
NO_KEYS_REASON = re.compile("no CURVE key|left during the handshake")


def _rollout(run: Path, address: str, name: str, out: Path, *extra: str) -> subprocess.Popen[bytes]:
    """`cadence rollout` as a user would start it on another machine, its output to files."""
    out.mkdir(parents=True)
    with (out / "stdout").open("w") as stdout, (out / "stderr").open("w") as stderr:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "cadence",
                "rollout",
                "--config",
                str(run / "config.json"),
                "--connect",
                address,
                "--out",
                str(out),
                "--name",
                name,
                *extra,
            ],
            cwd=ROOT,
            stdout=stdout,
            stderr=stderr,
        )


def test_a_keyed_run_completes_and_a_worker_without_keys_never_joins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys, out, gate = tmp_path / "keys", tmp_path / "run", tmp_path / "gate"
    cadence("keys", str(keys))
    monkeypatch.setenv(GATE_ENV, str(gate))  # the run scores nothing until the live checks are done
    run = start_run(
        out,
        "--set",
        f"periods={PERIODS}",
        "--set",
        "rollout.workers=1",
        "--set",
        f"transport.keys='{keys}'",
        *GATE_SETTINGS,
    )
    workers: list[subprocess.Popen[bytes]] = []
    try:
        wait_until(lambda: (out / "dispatcher.addr").exists(), 90, "dispatcher address", run.proc)
        address = (out / "dispatcher.addr").read_text().strip()

        def refused() -> list[dict[str, object]]:
            return [e for e in events(out, "dispatcher") if e["event"] == "peer_refused"]

        intruder = _rollout(out, address, "intruder", tmp_path / "intruder", "--set", "transport.keys=''")
        workers.append(intruder)
        wait_until(refused, 90, "refusal of the worker without keys", run.proc)
        # the live run's log, followed with the keys named in its config
        backlog = cadence("logs", "--connect", address, "--config", str(out / "config.json"), "--json")
        assert "peer_refused" in {json.loads(line)["event"] for line in backlog.stdout.splitlines()}
        gate.touch()
        code, stdout, stderr = run.finish(timeout=180)
        assert intruder.poll() is None  # still outside, still waiting
    finally:
        for proc in workers:
            proc.kill()
            proc.wait()
        run.kill()
    assert code == 0, (stdout, stderr)
    s = summary(out)
    assert s["periods"] == PERIODS and s["groups_trained"] == PERIODS * B
    joined = {e["peer"] for e in events(out, "dispatcher") if e["event"] == "peer_joined"}
    assert "rollout-0" in joined and "intruder" not in joined
    event = refused()[0]
    assert event["channel"] == "dispatcher" and NO_KEYS_REASON.search(str(event["reason"]))
    assert event["endpoint"] == address
