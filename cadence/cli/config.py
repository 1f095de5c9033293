"""`cadence config`: the run configuration itself; `docs` writes its reference page."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cadence.cli.common import Subparsers


def add(sub: Subparsers) -> None:
    config = sub.add_parser("config", help="the run configuration: its reference page")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    docs = config_sub.add_parser(
        "docs", help="every section and key with its type, default, allowed values and description (Markdown)"
    )
    docs.add_argument(
        "-o", "--out", type=Path, default=None, help="file to write, e.g. docs/config.md (default: stdout)"
    )
    docs.set_defaults(handler=docs_handler)


def docs_handler(args: argparse.Namespace) -> int:
    from cadence.config.reference import reference

    page = reference()
    if args.out is None:
        sys.stdout.write(page)
        return 0
    args.out.write_text(page)
    print(f"cadence: wrote {args.out}")
    return 0
