"""The `cadence` command: a subcommand a function, grouped by what it is for.

Each command module has `add(subparsers)`, which declares its commands' arguments and sets a
`handler(args) -> int` on each; `main` only parses and calls the handler. Invariant: nothing heavy
(torch, transformers, matplotlib, the actors) is imported before a handler runs, so `--help` and
config errors are instant; a `ConfigError` from any handler exits 2 with the message.
"""

from __future__ import annotations

import argparse
import errno
import sys

from cadence.cli import actor, bench, config, doctor, evaluate, monitor, prepare, run, slurm


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(
        prog="cadence", description="Periodic-asynchronous on-policy RL for language models."
    )
    sub = root.add_subparsers(dest="command", required=True)
    for module in (run, actor, bench, prepare, monitor, evaluate, slurm, doctor, config):
        module.add(sub)
    return root


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    from cadence.config import ConfigError

    try:
        code: int = args.handler(args)
    except ConfigError as err:
        print(f"cadence: configuration error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        if err.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        where = f": {err.filename}" if err.filename else ""
        print(
            f"cadence: the disk is full ({err.strerror}){where}: free some room and run it again",
            file=sys.stderr,
        )
        return 1
    return code


__all__ = ["main", "parser"]
