"""What this host offers a run, and what a run's config asks of it that it lacks: what `cadence doctor`
(`doctor.py`) prints.

```
 probes, each on its own, each catching its own failure         a config (optional)
   python, cadence's requirements, torch and its build               │
   devices (CUDA or ROCm, Ascend), collective backends               ▼
   optional packages (vllm, vllm_ascend, the extras)  ──► Facts ──► problems(cfg, facts)
   cores, libzmq and its CURVE                                         [] : the config can run here
                                                                       else one Problem a missing thing,
                                                                       naming the key that asks for it
```

Invariant: gathering facts never raises, and torch, torch_npu, zmq and the optional packages are
imported inside the probes only (so `cadence doctor --help` is instant), an optional package only when
its version cannot be read from its metadata; `problems` is a pure function of a config and facts, so a
test can ask it about any host.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import platform
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Literal

from cadence.config import RunConfig
from cadence.config.devices import BACKENDS, DEVICES
from cadence.launch.threads import (
    host_cores,
    rollout_threads,
    rollout_threads_alone,
    trainer_threads,
    trainer_threads_alone,
)

OPTIONAL = ("vllm", "vllm_ascend", "tensorboard", "wandb", "reasoning_gym", "pyarrow")  # modules probed
PIP_NAMES = {"vllm_ascend": "vllm-ascend", "reasoning_gym": "reasoning-gym", "torch_npu": "torch-npu"}


@dataclass(frozen=True)
class Requirement:
    """One of cadence's runtime requirements (`torch>=2.8`) and the version installed (None: none)."""

    name: str
    spec: str  # as the package's metadata states it
    minimum: str  # its lowest version ("": any)
    installed: str | None

    @property
    def met(self) -> bool:
        return self.installed is not None and release(self.installed) >= release(self.minimum)


@dataclass(frozen=True)
class TorchBuild:
    """The torch this process imports and what it was built for."""

    version: str = ""  # "" when torch does not import
    cuda: str | None = None  # torch.version.cuda
    hip: str | None = None  # torch.version.hip: a ROCm build (its devices are torch.cuda's)
    npu: str | None = None  # torch_npu's version, when it imports
    error: str = ""  # why torch did not import
    npu_error: str = ""  # why torch_npu, found, did not import

    @property
    def build(self) -> str:
        if not self.version:
            return "none"
        return f"ROCm {self.hip}" if self.hip else f"CUDA {self.cuda}" if self.cuda else "CPU"


@dataclass(frozen=True)
class Device:
    kind: Literal["cuda", "npu"]
    index: int
    name: str
    memory_gib: float


@dataclass(frozen=True)
class ZeroMQ:
    pyzmq: str = ""  # "" when pyzmq does not import
    libzmq: str = ""
    curve: bool = False  # libzmq built with CURVE (transport.keys)


@dataclass(frozen=True)
class Facts:
    """What this host offers a run."""

    python: str
    executable: str
    requirements: tuple[Requirement, ...]
    torch: TorchBuild
    devices: tuple[Device, ...]
    backends: dict[str, bool]  # each collective backend of config/devices.py: can this torch use it
    packages: dict[str, str | None]  # each OPTIONAL module: its version ("?": unknown), None: absent
    cores: int  # this process's affinity
    zmq: ZeroMQ

    def count(self, kind: str) -> int:
        return sum(1 for d in self.devices if d.kind == kind)


@dataclass(frozen=True)
class Threads:
    """The torch threads each actor of a config computes with on this host (launch/threads.py)."""

    cores: int
    workers: int
    rollout: int  # each worker's
    rollout_alone: int  # each worker's while the trainer waits (sync), where its engine computes alike
    ranks: int
    trainer: int  # each trainer rank's while the workers generate
    trainer_alone: int  # once the period's last group is in
    automatic: tuple[str, ...]  # the keys left at 0, shared out of the cores


@dataclass(frozen=True)
class Problem:
    """A thing a config asks for that this host lacks: the key asking (empty: any run) and one line."""

    key: str
    line: str


def release(version: str) -> tuple[int, ...]:
    """The release numbers a version begins with: `2.8.0a0+git1` -> (2, 8, 0)."""
    return tuple(int(n) for n in re.findall(r"\d+", version.split("+")[0])[:3])


def gather() -> Facts:
    """Every probe, on this host, in this process."""
    build = probe_torch()
    owners = metadata.packages_distributions()
    return Facts(
        python=platform.python_version(),
        executable=sys.executable,
        requirements=probe_requirements(),
        torch=build,
        devices=probe_devices(build),
        backends=probe_backends(build),
        packages={module: probe_package(module, owners) for module in OPTIONAL},
        cores=host_cores(),
        zmq=probe_zmq(),
    )


def probe_requirements() -> tuple[Requirement, ...]:
    """cadence's runtime requirements as installed (none when cadence runs from its source alone)."""
    try:
        specs = metadata.requires("cadence") or []
    except metadata.PackageNotFoundError:
        return ()
    found = []
    for spec in specs:
        name = re.match(r"[A-Za-z0-9_.-]+", spec)
        if name is None or "extra ==" in spec:
            continue
        lowest = re.search(r"(?:>=|==|~=)\s*([0-9][\w.]*)", spec)
        found.append(Requirement(name[0], spec, lowest[1] if lowest else "", _installed(name[0])))
    return tuple(found)


def probe_torch() -> TorchBuild:
    try:
        import torch
    except Exception as err:  # a missing or broken torch is a fact to report
        return TorchBuild(error=_why(err))
    npu, npu_error = None, ""
    if _found("torch_npu"):
        try:
            import torch_npu  # type: ignore[import-not-found]

            npu = str(getattr(torch_npu, "__version__", "?"))
        except Exception as err:
            npu_error = _why(err)
    hip = getattr(torch.version, "hip", None)
    return TorchBuild(torch.__version__, torch.version.cuda, hip, npu=npu, npu_error=npu_error)


def probe_devices(build: TorchBuild) -> tuple[Device, ...]:
    """CUDA (or ROCm) devices, and Ascend NPUs when torch_npu imports."""
    if not build.version:
        return ()
    return _devices("cuda") + (_devices("npu") if build.npu else ())


def _devices(kind: Literal["cuda", "npu"]) -> tuple[Device, ...]:
    import torch

    try:
        backend = getattr(torch, kind)
        if not backend.is_available():
            return ()
        properties = [backend.get_device_properties(i) for i in range(backend.device_count())]
    except Exception:  # a driver torch cannot talk to: no device this process can use
        return ()
    return tuple(
        Device(kind, i, str(p.name), round(p.total_memory / 2**30, 1)) for i, p in enumerate(properties)
    )


def probe_backends(build: TorchBuild) -> dict[str, bool]:
    found = dict.fromkeys(DEVICES, False)
    if not build.version:
        return found
    with contextlib.suppress(Exception):
        import torch.distributed as dist

        if dist.is_available():
            found["gloo"] = bool(dist.is_gloo_available())
            found["nccl"] = bool(dist.is_nccl_available())
    if build.npu is not None:
        with contextlib.suppress(Exception):
            from torch_npu._C._distributed_c10d import ProcessGroupHCCL  # type: ignore[import-not-found]  # noqa: F401

            found["hccl"] = True  # what transport/process_groups.py builds an hccl group with
    return found


def probe_package(module: str, owners: Mapping[str, list[str]]) -> str | None:
    """`module`'s version if it can be found ("?": no version known), None if not; it is imported
    only when no distribution that ships it names its version (importing vllm takes seconds)."""
    if not _found(module):
        return None
    for owner in owners.get(module, []):
        version = _installed(owner)
        if version is not None:
            return version
    try:
        return str(getattr(importlib.import_module(module), "__version__", "?"))
    except Exception:
        return "?"


def probe_zmq() -> ZeroMQ:
    try:
        import zmq
    except Exception:
        return ZeroMQ()
    return ZeroMQ(zmq.__version__, zmq.zmq_version(), bool(zmq.has("curve")))


def thread_plan(cfg: RunConfig, cores: int) -> Threads:
    automatic = tuple(
        k
        for k, n in (("rollout.threads", cfg.rollout.threads), ("trainer.threads", cfg.trainer.threads))
        if n == 0
    )
    return Threads(
        cores,
        cfg.rollout.workers,
        rollout_threads(cfg, cores),
        rollout_threads_alone(cfg, cores),
        cfg.trainer.ranks,
        trainer_threads(cfg, cores),
        trainer_threads_alone(cfg, cores),
        automatic,
    )


def problems(cfg: RunConfig, facts: Facts) -> list[Problem]:
    """Everything `cfg` asks of this host that `facts` say it lacks, one `Problem` each."""
    found = _requirement_problems(facts)
    for section in ("trainer", "rollout"):  # a section without a device key computes on the CPU
        device = getattr(getattr(cfg, section), "device", "cpu")
        found += _device_problems(f"{section}.device", device, facts)
    found += _backend_problems(cfg, facts)
    found += _package_problems(cfg, facts)
    if cfg.transport.keys and not facts.zmq.curve:
        found.append(
            Problem(
                "transport.keys",
                f"transport.keys = {json.dumps(cfg.transport.keys)} needs a libzmq with CURVE; this one"
                f" ({facts.zmq.libzmq or 'none'}, pyzmq {facts.zmq.pyzmq or 'none'}) has none: pyzmq's own"
                " wheels bundle one with it",
            )
        )
    return found


def _requirement_problems(facts: Facts) -> list[Problem]:
    found = []
    for r in facts.requirements:
        if r.installed is None:
            found.append(Problem("", f"{r.name} is not installed; cadence needs {r.spec}"))
        elif not r.met:
            found.append(Problem("", f"{r.name} {r.installed} is older than cadence needs ({r.spec})"))
    if facts.torch.error and not any(r.name == "torch" and r.installed is None for r in facts.requirements):
        found.append(Problem("", f"torch does not import: {facts.torch.error}"))
    return found


def _device_problems(key: str, device: str, facts: Facts) -> list[Problem]:
    torch = f"torch {facts.torch.version or '(none)'} ({facts.torch.build} build)"
    if device == "cuda" and not facts.count("cuda"):
        return [Problem(key, f'{key} = "cuda" needs a CUDA (or ROCm) device; {torch} sees none')]
    if device == "npu" and facts.torch.npu is None:
        why = f": {facts.torch.npu_error}" if facts.torch.npu_error else " (pip install torch-npu)"
        return [Problem(key, f'{key} = "npu" needs torch_npu, which does not import here{why}')]
    if device == "npu" and not facts.count("npu"):
        return [Problem(key, f'{key} = "npu" needs an Ascend NPU; torch_npu {facts.torch.npu} sees none')]
    return []


def _backend_problems(cfg: RunConfig, facts: Facts) -> list[Problem]:
    """The trainer's collectives (gloo beside the device's own backend) and the weights' broadcast."""
    found = []
    ranks, device = cfg.trainer.ranks, cfg.trainer.device
    for backend in sorted({"gloo", BACKENDS[device]}) if ranks > 1 else []:
        if not facts.backends.get(backend):
            line = f'trainer.ranks = {ranks} with trainer.device = "{device}" needs the {backend} backend'
            found.append(Problem("trainer.ranks", f"{line}, which torch {facts.torch.version} lacks"))
    transport = cfg.weights.transport
    if transport in DEVICES and not facts.backends.get(transport):
        line = f'weights.transport = "{transport}" needs the {transport} backend'
        found.append(Problem("weights.transport", f"{line}, which torch {facts.torch.version} lacks"))
    kind = DEVICES.get(transport, "cpu")
    if kind != "cpu" and not facts.count(kind):
        line = f'weights.transport = "{transport}" broadcasts between {kind} devices'
        found.append(Problem("weights.transport", f"{line}; this host has none"))
    return found


def _package_problems(cfg: RunConfig, facts: Facts) -> list[Problem]:
    asks: list[tuple[str, Any, str]] = []  # key, its value, the module it needs
    asks += [("rollout.engine", "vllm", "vllm")] if cfg.rollout.engine == "vllm" else []
    asks += [("monitor.tensorboard", True, "tensorboard")] if cfg.monitor.tensorboard else []
    asks += [("monitor.wandb", True, "wandb")] if cfg.monitor.wandb else []
    asks += [("task.name", "reasoning_gym", "reasoning_gym")] if cfg.task.name == "reasoning_gym" else []
    paths = (("task.path", cfg.task.path if cfg.task.name == "file" else ""), ("eval.path", cfg.eval.path))
    asks += [(key, path, "pyarrow") for key, path in paths if path.endswith(".parquet")]
    return [
        Problem(
            key,
            f"{key} = {json.dumps(value)} needs {module}, which is not installed here"
            f" (pip install {PIP_NAMES.get(module, module)})",
        )
        for key, value, module in asks
        if facts.packages.get(module) is None
    ]


def _found(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _installed(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _why(err: BaseException) -> str:
    first = (str(err).strip().splitlines() or [""])[0][:200]
    return f"{type(err).__name__}: {first}" if first else type(err).__name__
