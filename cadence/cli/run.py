"""`cadence run`: the whole system on this machine, a new run or one continued from its folder."""

from __future__ import annotations

import argparse
from pathlib import Path

from cadence.cli.common import Subparsers, refuse


def add(sub: Subparsers) -> None:
    run = sub.add_parser("run", help="the whole system on this machine, each actor its own process")
    run.add_argument("config", type=Path, nargs="?", help="TOML run configuration (with --resume: optional)")
    run.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    run.add_argument("--out", type=Path, default=None, help="run directory (default: runs/latest)")
    run.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the run already in --out (its checkpoints, logs and samples are deleted)",
    )
    run.add_argument(
        "--resume",
        type=Path,
        default=None,
        metavar="DIR",
        help="continue the run in DIR from its last resume checkpoint (its config.json, unless CONFIG)",
    )
    run.set_defaults(handler=run_handler)


def run_handler(args: argparse.Namespace) -> int:
    from cadence.config import load_config
    from cadence.launch.launcher import LaunchError, check_out, resume_config, run_command

    if args.resume is not None:
        if args.out is not None and args.out.resolve() != args.resume.resolve():
            return refuse("--resume DIR continues in DIR; leave out --out")
        cfg = resume_config(args.resume, args.config, args.overrides)
        return run_command(cfg, args.resume, resume=True)
    if args.config is None:
        return refuse("run wants a CONFIG file (or --resume DIR)")
    cfg = load_config(args.config, args.overrides)
    out = args.out or Path("runs/latest")
    try:
        check_out(out, args.overwrite)  # before anything starts: nothing is deleted
    except LaunchError as err:
        return refuse(str(err))
    return run_command(cfg, out, overwrite=args.overwrite)
