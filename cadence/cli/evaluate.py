"""`cadence eval CHECKPOINT --config C`: a saved checkpoint's figures on the run's held-out eval set."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from cadence.cli.common import Subparsers, refuse


def add(sub: Subparsers) -> None:
    p = sub.add_parser("eval", help="evaluate a saved checkpoint on the run's held-out eval set (JSON out)")
    p.add_argument(
        "checkpoint", type=Path, help="a Hugging Face checkpoint folder, e.g. RUN/checkpoints/final"
    )
    p.add_argument(
        "--config", type=Path, required=True, help="the run's configuration (e.g. RUN/config.json)"
    )
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument(
        "--version",
        type=int,
        default=None,
        help="the version the samples are seeded as (default: periods, the final checkpoint's)",
    )
    p.set_defaults(handler=eval_handler)


def eval_handler(args: argparse.Namespace) -> int:
    from cadence.config import load_config

    cfg = load_config(args.config, args.overrides)
    from cadence.launch.evaluate import evaluate_checkpoint
    from cadence.log import configure_logging

    configure_logging("eval", None, "warning")  # events to stderr: stdout holds the figures alone

    version = cfg.periods if args.version is None else args.version
    try:
        figures = evaluate_checkpoint(cfg, args.checkpoint, version)
    except ValueError as err:
        return refuse(str(err))
    print(json.dumps(figures, sort_keys=True))
    return 0
