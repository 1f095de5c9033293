"""`cadence bench`'s peak memory: which process of which run is which actor, read from its command
line, and the peaks of a real child process measured from outside."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from cadence.bench.memory import PeakMemory, role_of

BASE = [sys.executable, "-m", "cadence"]


def test_a_command_line_names_its_actor_only_for_its_own_run() -> None:
    common = ["--config", "/r/config.toml", "--out", "/runs/a", "--log-level", "warning"]
    assert role_of([*BASE, "dispatcher", "--bind", "tcp://x:*", *common], "/runs/a") == "dispatcher"
    assert role_of([*BASE, "trainer", "--connect", "tcp://x:1", *common], "/runs/a") == "trainer"
    worker = [*BASE, "rollout", "--connect", "tcp://x:1", "--name", "rollout-1", *common]
    assert role_of(worker, "/runs/a") == "rollout-1"
    assert role_of(worker, "/runs/b") is None  # another run's worker
    assert role_of([*BASE, "bench", "e2e", "--out", "/runs/a"], "/runs/a") is None  # not an actor
    assert role_of([sys.executable, "-c", "pass", "/runs/a"], "/runs/a") is None
    assert role_of([], "/runs/a") is None


def test_a_running_actor_is_measured_from_outside(tmp_path: Path) -> None:
    # a stand-in with an actor's command line that holds 64 MiB until told to stop
    script = tmp_path / "cadence"
    script.mkdir()
    (script / "__main__.py").write_text(
        "import sys\nblock = bytearray(64 * 2**20)\nfor i in range(0, len(block), 4096): block[i] = 1\n"
        "print('ready', flush=True)\nsys.stdin.readline()\n"
    )
    args = [*BASE, "trainer", "--out", str(tmp_path / "run")]
    proc = subprocess.Popen(args, cwd=tmp_path, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        memory = PeakMemory(tmp_path / "run")
        memory.sample()
        peaks = memory.peaks()
    finally:
        proc.communicate("\n", timeout=60)
    assert set(peaks) == {"trainer"}
    assert peaks["trainer"]["rss_mib"] >= 64
