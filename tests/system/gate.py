"""A reward function that holds a run's scoring until its test opens a gate: a system test whose checks
need the run still going makes the run wait for them, rather than racing a run that may end first.

`rewards.modules = ['tests.system.gate']` and `rewards.weights = {test_gate = 1.0}`; the gate is the
file named by the environment variable `GATE_ENV` (the run's processes inherit it), open once it exists.
Every response scores 0.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from cadence.rewards.base import Sample, reward

GATE_ENV = "CADENCE_TEST_GATE"
GATE_SETTINGS = [
    "--set",
    "rewards.modules=['tests.system.gate']",
    "--set",
    "rewards.weights={test_gate = 1.0}",
    "--set",
    "rewards.timeout_s=600",  # longer than any test waits before it opens the gate
]


@reward("test_gate")
def wait_for_the_gate(sample: Sample) -> float:
    path = Path(os.environ[GATE_ENV])
    deadline = time.monotonic() + 600
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return 0.0
