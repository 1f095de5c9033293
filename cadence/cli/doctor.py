"""`cadence doctor`: one screen on what this host offers a run, and whether a config can run here."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cadence.cli.common import Subparsers

if TYPE_CHECKING:
    from cadence.cli.host import Facts, Problem, Threads


def add(sub: Subparsers) -> None:
    doctor = sub.add_parser(
        "doctor", help="this host's python, torch, devices, backends, vLLM, cores and CURVE; can a config run"
    )
    doctor.add_argument(
        "--config", type=Path, default=None, help="check this run configuration against the host"
    )
    doctor.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    doctor.add_argument("--json", action="store_true", help="last line: the facts and problems as JSON")
    doctor.set_defaults(handler=doctor_handler)


def doctor_handler(args: argparse.Namespace) -> int:
    """Exit 0 when no config is given or it can run here; 1 with a line a missing thing otherwise."""
    from cadence.cli.host import gather, problems, thread_plan
    from cadence.config import load_config

    checked = args.config is not None or bool(args.overrides)
    cfg = load_config(args.config, args.overrides)  # a bad config stops here, before any probe
    facts = gather()
    threads = thread_plan(cfg, facts.cores)
    found = problems(cfg, facts) if checked else []
    label = str(args.config or "the defaults") + "".join(f" --set {o}" for o in args.overrides)
    print("\n".join(screen(facts, threads, label if checked else "", found)))
    for problem in found:
        print(f"cadence: {problem.line}", file=sys.stderr)
    if args.json:
        print(json.dumps(report(facts, threads, label if checked else None, found)))
    return 1 if found else 0


def screen(facts: Facts, threads: Threads, config: str, found: list[Problem]) -> list[str]:
    """The facts as aligned lines, one a subject; `config` empty: none was checked."""
    t, z = facts.torch, facts.zmq
    needs = ", ".join(
        f"{r.name} {r.installed or 'missing'}" + ("" if r.met else f" ({r.spec})") for r in facts.requirements
    )
    npu = f"torch_npu {t.npu}" if t.npu else f"torch_npu: {t.npu_error}" if t.npu_error else "no torch_npu"
    devices = [f"{d.kind}:{d.index} {d.name}, {d.memory_gib} GiB" for d in facts.devices] or ["none: the CPU"]
    extras = ", ".join(f"{m} {v or 'not installed'}" for m, v in facts.packages.items() if "vllm" not in m)
    curve = f"libzmq {z.libzmq}, pyzmq {z.pyzmq}, CURVE {'yes' if z.curve else 'no'}"
    rows = [
        ("python", f"{facts.python} ({facts.executable})"),
        ("requires", needs or "cadence is not installed (pip install --no-deps -e .)"),
        ("torch", f"{t.version} ({t.build} build), {npu}" if t.version else f"does not import: {t.error}"),
        *(("" if i else "devices", device) for i, device in enumerate(devices)),
        ("backends", ", ".join(f"{b} {'yes' if ok else 'no'}" for b, ok in facts.backends.items())),
        *((m, facts.packages[m] or "not installed") for m in ("vllm", "vllm_ascend")),
        ("extras", extras),
        ("cores", f"{facts.cores} (this process's CPU affinity)"),
        ("threads", _threads(threads)),
        ("zeromq", curve if z.pyzmq else "no pyzmq"),
        ("config", _verdict(config, found)),
    ]
    return [f"{name:<12} {value}".rstrip() for name, value in rows]


def _threads(t: Threads) -> str:
    alone = f" ({t.rollout_alone} with the trainer waiting, if alike)" if t.rollout_alone != t.rollout else ""
    line = (
        f"{t.workers} rollout workers of {t.rollout}{alone}, {t.ranks} trainer ranks of {t.trainer} while"
        f" they generate and {t.trainer_alone} after"
    )
    return line + (f" (automatic: {', '.join(f'{k} = 0' for k in t.automatic)})" if t.automatic else "")


def _verdict(config: str, found: list[Problem]) -> str:
    if not config:
        return "none checked (--config FILE, --set KEY=VALUE)"
    return (
        f"{config}: can run here"
        if not found
        else f"{config}: cannot run here, {len(found)} missing (stderr)"
    )


def report(facts: Facts, threads: Threads, config: str | None, found: list[Problem]) -> dict[str, Any]:
    """The facts, the threads and the problems as one JSON object."""
    data = dataclasses.asdict(facts)
    data["torch"]["build"] = facts.torch.build
    data["threads"] = dataclasses.asdict(threads)
    data["config"] = config
    data["problems"] = [dataclasses.asdict(p) for p in found]
    data["ok"] = not found
    return data
