"""`cadence run configs/vllm-digits.toml`: vLLM workers learn the digits task like the built-in engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.system.helpers import cadence, events, summary
from tests.vllm.helpers import VLLM_MARKS

pytestmark = [*VLLM_MARKS, pytest.mark.system, pytest.mark.timeout(900)]

CONFIG = "configs/vllm-digits.toml"


def test_vllm_workers_learn_like_the_builtin_engine(tmp_path: Path) -> None:
    vllm_out, torch_out = tmp_path / "vllm", tmp_path / "torch"
    cadence("run", CONFIG, "--out", str(vllm_out), timeout=600)
    cadence("run", CONFIG, "--out", str(torch_out), "--set", "rollout.engine='torch'", timeout=300)
    got, twin = summary(vllm_out), summary(torch_out)
    periods = got["periods"]
    assert got["groups_trained"] == twin["groups_trained"] and got["stale_dropped"] == 0
    for worker in ("rollout-0", "rollout-1"):  # both workers served, each version loaded in place
        loaded = [e["version"] for e in events(vllm_out, worker) if e["event"] == "weights_loaded"]
        assert loaded and loaded == sorted(set(loaded)) and loaded[-1] >= periods - 5
    # from a random start near 0.05 both reach about 0.75. The config trains in prompt order, so each
    # engine's run is the same run every time on one machine (an Intel Xeon: 0.780 vLLM, 0.7305
    # built-in, two runs each); another CPU's kernels round otherwise and take another trajectory, and
    # in arrival order, where runs parted, ten ended at 0.72-0.84 and one at 0.39: the bounds leave
    # that spread room, and a run that does not learn (0.05 -> 0.05) still fails
    for s in (got, twin):
        assert s["reward_mean_last"] - s["reward_mean_first"] > 0.3, (got, twin)
    assert abs(got["reward_mean_last"] - twin["reward_mean_last"]) < 0.4, (got, twin)
