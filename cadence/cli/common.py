"""What several commands share: the config arguments and the one way a command refuses."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TypeAlias

# what `add_subparsers` returns (argparse names its class privately)
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def config_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--config", type=Path, required=required, help="TOML (or resolved JSON) run configuration")
    p.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override a key"
    )
    p.add_argument(
        "--out", type=Path, default=Path("runs/actor"), help="run directory (logs, metrics, checkpoints)"
    )
    p.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"], help="console level"
    )


def refuse(message: str) -> int:
    """Say why a command cannot go on, on stderr; the exit status 2."""
    print(f"cadence: {message}", file=sys.stderr)
    return 2
