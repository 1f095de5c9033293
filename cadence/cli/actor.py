"""`cadence dispatcher|trainer|publisher|rollout`: one actor in this process, for runs spread over
machines. The dispatcher binds; the others connect to it.

Invariant: the config is loaded and the trainer's ranks found before logging starts, so a bad config
exits 2 with its message; once the actor runs, its exit status is the actor's (0 done, 1 failed).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from cadence.cli.common import Subparsers, config_args, refuse

if TYPE_CHECKING:
    from cadence.config import RunConfig
    from cadence.log import LogStream
    from cadence.training.ranks import Ranks


def add(sub: Subparsers) -> None:
    d = sub.add_parser("dispatcher", help="run the prompt dispatcher (binds)")
    config_args(d)
    d.add_argument(
        "--bind", default=None, help="address to bind, e.g. tcp://0.0.0.0:5555 (default: a free port)"
    )
    d.add_argument("--resume", action="store_true", help="continue the metrics.jsonl of --out")
    d.set_defaults(handler=actor_handler)
    for name, text in (
        ("trainer", "the trainer"),
        ("publisher", "the weight publisher"),
        ("rollout", "a rollout worker"),
    ):
        a = sub.add_parser(name, help=f"run {text}, connecting to the dispatcher")
        config_args(a)
        a.add_argument("--connect", required=True, help="the dispatcher's address, e.g. tcp://10.0.0.1:5555")
        if name == "trainer":
            a.add_argument("--publisher", default=None, help="a publisher's address (default: host one here)")
            a.add_argument(
                "--resume", action="store_true", help="continue from the resume checkpoint under --out"
            )
        if name == "rollout":
            a.add_argument("--name", default=None, help="this worker's name (default: rollout-HOST-PID)")
        a.set_defaults(handler=actor_handler)


def actor_handler(args: argparse.Namespace) -> int:
    from cadence.launch.threads import wait_as_launched

    wait_as_launched(os.environ, sys.modules)  # before torch loads OpenMP (launch/threads.py)
    from cadence.config import load_config
    from cadence.launch import processes
    from cadence.log import LogStream, configure_logging

    cfg = load_config(args.config, args.overrides)
    ranks = _ranks(args.command, cfg)
    out: Path = args.out
    if out.exists() and not out.is_dir():
        return refuse(f"--out {out} is a file, not a folder")
    if args.command == "dispatcher" and not args.resume:
        from cadence.monitor.run_dir import RunDirError, check_fresh

        try:
            check_fresh(out)
        except RunDirError as err:
            return refuse(str(err))
    out.mkdir(parents=True, exist_ok=True)
    name = args.command if args.command != "rollout" else (args.name or processes.default_name("rollout"))
    if not ranks.leader:
        configure_logging(ranks.name, out / "logs", args.log_level, None)
        processes.end_rank(processes.follower_main(cfg, ranks))
    own_file = (out / "logs" / f"{name}.jsonl").resolve()
    stream = LogStream(name, str(own_file)) if cfg.monitor.stream_logs else None
    configure_logging(name, out / "logs", args.log_level, stream)
    status = _start(args, cfg, name, out, stream, ranks)
    if ranks.world > 1:
        processes.end_rank(status)
    return status


def _start(
    args: argparse.Namespace, cfg: RunConfig, name: str, out: Path, stream: LogStream | None, ranks: Ranks
) -> int:
    """Run the actor the command names on an event loop; its exit status."""
    from cadence.launch import processes

    if args.command == "dispatcher":
        from cadence.transport.zmq_socket import listen_address

        t = cfg.transport
        bind = args.bind or listen_address(t.listen, t.host, 0, t.advertise_host)
        return processes.run_async(lambda: processes.dispatcher_main(cfg, bind, out, stream, args.resume))
    if args.command == "trainer":
        return processes.run_async(
            lambda: processes.trainer_main(cfg, args.connect, out, args.publisher, stream, args.resume, ranks)
        )
    if args.command == "publisher":
        return processes.run_async(lambda: processes.publisher_main(cfg, args.connect, out, stream))
    return processes.run_async(lambda: processes.rollout_main(cfg, args.connect, name, stream))


def _ranks(command: str, cfg: RunConfig) -> Ranks:
    """The trainer's place among torchrun's processes (alone elsewhere); under torchrun it dies with it."""
    from cadence.launch.torchrun import die_with_parent
    from cadence.training.ranks import Ranks, ranks_from_env

    if command != "trainer":
        return Ranks()
    ranks = ranks_from_env(cfg.trainer)
    if ranks.world > 1:
        die_with_parent()
    return ranks
