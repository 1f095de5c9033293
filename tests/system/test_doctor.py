"""`cadence doctor` on this machine: the facts as JSON, a config that runs here, one that cannot."""

from __future__ import annotations

import json

import pytest
import torch

from tests.system.helpers import cadence

pytestmark = [pytest.mark.system, pytest.mark.timeout(120)]


def test_doctor_prints_this_hosts_facts_as_json() -> None:
    facts = json.loads(cadence("doctor", "--json").stdout.strip().splitlines()[-1])
    for key in ("python", "torch", "devices", "backends", "packages", "cores", "threads", "zmq", "problems"):
        assert key in facts, key
    assert facts["torch"]["version"] == torch.__version__
    assert facts["backends"]["gloo"] is torch.distributed.is_gloo_available()
    assert facts["cores"] >= 1 and facts["threads"]["rollout"] >= 1
    assert facts["config"] is None and facts["ok"] is True


def test_the_quickstart_can_run_here() -> None:
    proc = cadence("doctor", "--config", "configs/quickstart.toml")
    assert "configs/quickstart.toml: can run here" in proc.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="this host has a CUDA device")
def test_a_cuda_trainer_cannot_run_on_a_host_without_one() -> None:
    proc = cadence(
        "doctor", "--config", "configs/quickstart.toml", "--set", "trainer.device='cuda'", check=False
    )
    assert proc.returncode == 1, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith('cadence: trainer.device = "cuda" needs a CUDA (or ROCm) device; torch ')
    assert torch.__version__ in line and line.endswith("sees none")
