"""Actors on separate network hosts: Linux network namespaces joined by veth pairs to one bridge.

Host A runs the dispatcher and the trainer; hosts B and C one rollout worker each; mid-run the worker
on B is killed and a new one starts on host D. Each process is `cadence <actor> --connect` as a user
would start it on its own machine; they share only the dispatcher's address (and a folder for the
run's files). Needs root and `ip netns`; elsewhere the test is skipped with the reason.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cadence.monitor.run_dir import read_jsonl
from tests.system.helpers import ROOT, events, summary, wait_until

pytestmark = [pytest.mark.system, pytest.mark.timeout(300)]

HOSTS = {"a": "10.77.0.1", "b": "10.77.0.2", "c": "10.77.0.3", "d": "10.77.0.4"}
PERIODS = 300
B = 4


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def _namespaces_unavailable() -> str | None:
    if shutil.which("ip") is None:
        return "the `ip` command is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"cadprobe{os.getpid()}"
    try:
        _ip("netns", "add", probe)
        _ip("netns", "del", probe)
    except (subprocess.CalledProcessError, OSError) as exc:
        return f"this machine cannot make network namespaces: {exc}"
    return None


@pytest.fixture
def hosts() -> Iterator[dict[str, str]]:
    """Four namespaces on one bridge; the name of each namespace by host letter."""
    reason = _namespaces_unavailable()
    if reason is not None:
        print(f"skipped: {reason}")
        pytest.skip(reason)
    tag = f"{os.getpid() % 100000}"
    bridge = f"cbr{tag}"
    names = {h: f"cad{tag}{h}" for h in HOSTS}
    try:
        _ip("link", "add", bridge, "type", "bridge")
        _ip("link", "set", bridge, "up")
        for host, ns in names.items():
            veth = f"cv{tag}{host}"
            _ip("netns", "add", ns)
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", veth, "master", bridge, "up")
            _ip("-n", ns, "addr", "add", f"{HOSTS[host]}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield names
    finally:
        for ns in names.values():
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True, timeout=30)


class Actor:
    """One `cadence` actor process inside a namespace, its output in a file next to the run folder;
    it binds `host` and advertises `advertise` (the address the other hosts reach it at)."""

    def __init__(self, label: str, ns: str, host: str, out: Path, *args: str, advertise: str = "") -> None:
        config = ROOT / "configs" / "quickstart.toml"
        log = out.parent / f"{label}.out"
        with log.open("w") as sink:
            self.proc = subprocess.Popen(
                [
                    "ip", "netns", "exec", ns,
                    sys.executable, "-m", "cadence", *args,
                    "--config", str(config), "--out", str(out), "--set", f"transport.host='{host}'",
                    "--set", f"transport.advertise_host='{advertise}'",
                ],
                cwd=ROOT,
                env={**os.environ, "OMP_NUM_THREADS": "1"},
                stdout=sink,
                stderr=subprocess.STDOUT,
            )  # fmt: skip

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)


def _periods_done(out: Path) -> int:
    return len(read_jsonl(out / "metrics.jsonl"))


def _lost(out: Path) -> list[str]:
    """The workers the dispatcher has declared lost so far."""
    if not (out / "logs" / "dispatcher.jsonl").exists():
        return []
    return [e["peer"] for e in events(out, "dispatcher") if e["event"] == "worker_lost"]


def test_actors_on_four_hosts_survive_a_killed_worker_and_take_a_new_one(
    hosts: dict[str, str], tmp_path: Path
) -> None:
    out = tmp_path / "run"
    out.mkdir()
    overrides = [
        f"run_id='hosts{os.getpid()}'",
        f"periods={PERIODS}",
        f"task.prompts_per_period={B}",
        "rollout.group_size=4",
        "model.hidden_size=32",
        "model.intermediate_size=64",
        "transport.heartbeat_s=0.2",
        "transport.liveness=10",
    ]
    sets = [x for o in overrides for x in ("--set", o)]
    port = 5555
    actors: list[Actor] = []
    try:
        address = f"tcp://{HOSTS['a']}:{port}"
        dispatcher = Actor("dispatcher", hosts["a"], HOSTS["a"], out, "dispatcher", "--bind", address, *sets)
        actors.append(dispatcher)
        wait_until(lambda: (out / "dispatcher.addr").exists(), 120, "the dispatcher to bind", dispatcher.proc)
        # the trainer binds every interface on fixed ports and tells the others the address they reach
        fixed = ("--set", "transport.trainer_port=5601", "--set", "transport.publisher_port=5602")
        trainer = Actor("trainer", hosts["a"], "0.0.0.0", out, "trainer", "--connect", address, *sets, *fixed,
                        advertise=HOSTS["a"])  # fmt: skip
        actors.append(trainer)
        worker = ("rollout", "--connect", address, *sets, "--name")
        doomed = Actor("rollout-b", hosts["b"], HOSTS["b"], out, *worker, "rollout-b")
        actors.append(doomed)
        actors.append(Actor("rollout-c", hosts["c"], HOSTS["c"], out, *worker, "rollout-c"))
        wait_until(lambda: _periods_done(out) >= 40, 120, "40 periods", dispatcher.proc)
        doomed.kill()
        wait_until(lambda: _lost(out) == ["rollout-b"], 120, "rollout-b declared lost", dispatcher.proc)
        after = _periods_done(out)
        wait_until(
            lambda: _periods_done(out) >= after + 20,
            120,
            "20 more periods without rollout-b",
            dispatcher.proc,
        )
        actors.append(Actor("rollout-d", hosts["d"], HOSTS["d"], out, *worker, "rollout-d"))
        assert dispatcher.proc.wait(240) == 0
        for actor in actors[1:]:
            if actor is not doomed:
                assert actor.proc.wait(60) == 0
    finally:
        for actor in actors:
            actor.kill()
    result = summary(out)
    assert result["periods"] == PERIODS and result["final_version"] == PERIODS
    assert result["groups_trained"] == PERIODS * B
    assert result["stale_dropped"] == 0
    log = events(out, "dispatcher")
    joined = {e["peer"]: e["address"] for e in log if e["event"] == "peer_joined"}
    assert {"trainer", "rollout-b", "rollout-c", "rollout-d"} <= set(joined)
    assert (
        joined["trainer"] == f"tcp://{HOSTS['a']}:5601" and joined["publisher"] == f"tcp://{HOSTS['a']}:5602"
    )
    lost = [e for e in log if e["event"] == "worker_lost"]
    assert [e["peer"] for e in lost] == ["rollout-b"]
    late = [e for e in events(out, "rollout-d") if e["event"] == "worker_stopped"]
    assert late and late[0]["groups_sent"] > 0  # the added worker generated groups that were trained
    # the publisher shares its versions, but with workers on its own host only: these pulled them
    assert [e["event"] for e in events(out, "trainer")].count("weights_shared") == 1
    for name in ("rollout-b", "rollout-c", "rollout-d"):
        said = events(out, name)
        assert {e["source"] for e in said if e["event"] == "weights_loaded"} == {"zmq"}, name
        fallback = [e for e in said if e["event"] == "shared_memory_fallback"]
        assert len(fallback) == 1 and "another host" in fallback[0]["reason"], name
    rows = read_jsonl(out / "metrics.jsonl")
    # the periods after the loss (recorded once rollout-b was gone) had one worker, the last ones two
    assert (
        max(r["workers"] for r in rows[-20:]) == 2
        and min(r["workers"] for r in rows[after : after + 20]) == 1
    )
