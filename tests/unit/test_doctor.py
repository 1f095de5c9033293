"""`cadence doctor`'s verdict: a config against made-up hosts, each missing thing named by its key."""

from __future__ import annotations

import dataclasses

import pytest

from cadence.cli.host import (
    Device,
    Facts,
    Requirement,
    TorchBuild,
    ZeroMQ,
    problems,
    release,
    thread_plan,
)
from cadence.config import load_config


def cpu_host(**changes: object) -> Facts:
    """A host with a CPU build of torch, gloo, pyzmq with CURVE, and no optional package."""
    facts = Facts(
        python="3.12.3",
        executable="/usr/bin/python3",
        requirements=(Requirement("torch", "torch>=2.8", "2.8", "2.11.0+cpu"),),
        torch=TorchBuild(version="2.11.0+cpu"),
        devices=(),
        backends={"gloo": True, "nccl": False, "hccl": False},
        packages={"vllm": None, "vllm_ascend": None, "tensorboard": None, "wandb": None},
        cores=8,
        zmq=ZeroMQ("27.1.0", "4.3.5", curve=True),
    )
    return dataclasses.replace(facts, **changes)  # type: ignore[arg-type]


def cuda_host() -> Facts:
    return cpu_host(
        torch=TorchBuild(version="2.11.0+cu128", cuda="12.8"),
        devices=(Device("cuda", 0, "NVIDIA H100", 79.1), Device("cuda", 1, "NVIDIA H100", 79.1)),
        backends={"gloo": True, "nccl": True, "hccl": False},
        packages={"vllm": "0.11.0", "vllm_ascend": None},
    )


def keys(cfg_overrides: list[str], facts: Facts) -> list[str]:
    return [p.key for p in problems(load_config(None, cfg_overrides), facts)]


def test_a_cpu_config_on_a_cpu_host_has_no_problem() -> None:
    assert problems(load_config(None), cpu_host()) == []


def test_a_cuda_config_on_a_cpu_only_host_names_the_key() -> None:
    found = problems(load_config(None, ["trainer.device='cuda'"]), cpu_host())
    assert [p.key for p in found] == ["trainer.device"]
    assert found[0].line.startswith('trainer.device = "cuda" needs a CUDA')
    assert "2.11.0+cpu" in found[0].line


def test_a_cuda_config_with_ranks_and_nccl_runs_on_a_cuda_host() -> None:
    overrides = [
        "trainer.device='cuda'",
        "trainer.ranks=2",
        "weights.transport='nccl'",
        "rollout.engine='vllm'",
    ]
    assert keys(overrides, cuda_host()) == []


def test_a_vllm_config_without_vllm_names_rollout_engine() -> None:
    found = problems(load_config(None, ["rollout.engine='vllm'"]), cpu_host())
    assert [p.key for p in found] == ["rollout.engine"]
    assert "vllm" in found[0].line and "pip install vllm" in found[0].line


def test_keys_without_curve_name_transport_keys() -> None:
    host = cpu_host(zmq=ZeroMQ("27.1.0", "4.3.5", curve=False))
    found = problems(load_config(None, ["transport.keys='/etc/cadence/keys'"]), host)
    assert [p.key for p in found] == ["transport.keys"]
    assert "CURVE" in found[0].line and "/etc/cadence/keys" in found[0].line
    assert keys(["transport.keys='/etc/cadence/keys'"], cpu_host()) == []


def test_a_broadcast_over_nccl_needs_the_backend_and_a_cuda_device() -> None:
    assert keys(["weights.transport='nccl'"], cpu_host()) == ["weights.transport", "weights.transport"]
    assert keys(["weights.transport='gloo'"], cpu_host()) == []


def test_ranks_on_cuda_need_nccl_and_gloo() -> None:
    host = dataclasses.replace(cuda_host(), backends={"gloo": True, "nccl": False, "hccl": False})
    assert keys(["trainer.device='cuda'", "trainer.ranks=2"], host) == ["trainer.ranks"]
    assert keys(["trainer.device='cuda'"], host) == []  # one rank: no collective


def test_npu_needs_torch_npu_then_a_device() -> None:
    assert keys(["trainer.device='npu'"], cpu_host()) == ["trainer.device"]
    no_device = cpu_host(torch=TorchBuild(version="2.8.0", npu="2.8.0"))
    found = problems(load_config(None, ["trainer.device='npu'"]), no_device)
    assert "Ascend NPU" in found[0].line


def test_a_cuda_rollout_device_on_a_cpu_only_host_names_rollout_device() -> None:
    assert keys(["rollout.device='cuda'"], cpu_host()) == ["rollout.device"]
    assert keys(["rollout.device='cuda'", "trainer.device='cuda'"], cuda_host()) == []


def test_missing_and_old_requirements_and_extras_are_named() -> None:
    host = cpu_host(
        requirements=(
            Requirement("torch", "torch>=2.8", "2.8", "2.7.1+cu126"),
            Requirement("pyzmq", "pyzmq>=26", "26", None),
        )
    )
    lines = [p.line for p in problems(load_config(None, ["monitor.tensorboard=true"]), host)]
    assert lines[0] == "torch 2.7.1+cu126 is older than cadence needs (torch>=2.8)"
    assert lines[1] == "pyzmq is not installed; cadence needs pyzmq>=26"
    assert lines[2].startswith("monitor.tensorboard = true needs tensorboard")


@pytest.mark.parametrize(
    ("version", "parts"),
    [("2.8.0a0+gitabc", (2, 8, 0)), ("2.13.0+cpu", (2, 13, 0)), ("2.8", (2, 8)), ("", ())],
)
def test_release_reads_the_leading_numbers(version: str, parts: tuple[int, ...]) -> None:
    assert release(version) == parts


def test_the_thread_plan_is_threads_py_on_the_host_cores() -> None:
    plan = thread_plan(load_config(None, ["rollout.workers=3", "trainer.threads=2"]), cores=16)
    assert (plan.rollout, plan.trainer, plan.automatic) == (4, 2, ("rollout.threads",))
    assert plan.rollout_alone == 5  # the cores the workers share while the trainer waits
