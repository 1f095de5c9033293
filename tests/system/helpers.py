"""Running the `cadence` command as a user would, in a subprocess."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SMALL = [
    "--set",
    "task.prompts_per_period=4",
    "--set",
    "rollout.group_size=4",
    "--set",
    "model.hidden_size=32",
    "--set",
    "model.intermediate_size=64",
]


def cadence(*args: str, timeout: float = 240, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "cadence", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"cadence {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def wait_until(
    ready: Callable[[], object],
    timeout_s: float,
    what: str,
    alive: subprocess.Popen[Any] | None = None,
    interval_s: float = 0.1,
) -> None:
    """Poll `ready` until it holds; fail naming `what` after `timeout_s`, or as soon as `alive` exits.

    A bound on waiting for something that should happen, never a timing claim: on a loaded machine
    it may take long, so `timeout_s` is generous."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        assert alive is None or alive.poll() is None, (
            f"the process exited (status {alive.poll()}) before {what}"
        )
        assert time.monotonic() < deadline, f"no {what} within {timeout_s:.0f} s"
        time.sleep(interval_s)


def events(run_dir: Path, actor: str) -> list[dict[str, Any]]:
    path = run_dir / "logs" / f"{actor}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def summary(run_dir: Path) -> dict[str, Any]:
    return dict(json.loads((run_dir / "summary.json").read_text()))


class Launched:
    """`cadence run` in the background; its output goes to files, so no pipe can fill or stay open."""

    def __init__(self, out: Path, *extra: str) -> None:
        self.out = out
        self.stdout_path = out.with_name(out.name + ".stdout")
        self.stderr_path = out.with_name(out.name + ".stderr")
        with self.stdout_path.open("w") as stdout, self.stderr_path.open("w") as stderr:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "cadence",
                    "run",
                    "configs/quickstart.toml",
                    "--out",
                    str(out),
                    *SMALL,
                    *extra,
                ],
                cwd=ROOT,
                stdout=stdout,
                stderr=stderr,
                text=True,
            )

    def finish(self, timeout: float) -> tuple[int, str, str]:
        """Wait for the launcher; its exit status, stdout and stderr."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        return code, self.stdout_path.read_text(), self.stderr_path.read_text()

    def kill(self) -> None:
        """The launcher and every process of this run, whatever state the test left them in."""
        self.proc.kill()
        self.proc.wait()
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                if str(self.out) in cmdline.read_bytes().decode(errors="replace"):
                    os.kill(int(cmdline.parent.name), signal.SIGKILL)
            except (OSError, ValueError):
                continue


def start_run(out: Path, *extra: str) -> Launched:
    return Launched(out, *extra)
