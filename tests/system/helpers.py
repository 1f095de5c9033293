"""Running the `cadence` command as a user would, in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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


def events(run_dir: Path, actor: str) -> list[dict[str, Any]]:
    path = run_dir / "logs" / f"{actor}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def summary(run_dir: Path) -> dict[str, Any]:
    return dict(json.loads((run_dir / "summary.json").read_text()))


def start_run(out: Path, *extra: str) -> subprocess.Popen[str]:
    """`cadence run` of the quick start, shrunk, in the background."""
    return subprocess.Popen(
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
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
