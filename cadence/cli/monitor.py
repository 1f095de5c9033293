"""`cadence logs|timeline|plot`: look at a run, finished or live: its merged logs and its pictures."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from cadence.cli.common import Subparsers, refuse

if TYPE_CHECKING:
    from cadence.monitor.logview import Filter


def add(sub: Subparsers) -> None:
    _add_logs(sub)
    timeline = sub.add_parser("timeline", help="draw who works when: a row per actor, a bar per span")
    timeline.add_argument("dir", type=Path, help="a run folder")
    timeline.add_argument("-o", "--out", type=Path, required=True, help="picture file, .png or .svg")
    timeline.add_argument(
        "--periods",
        type=_periods,
        default=None,
        metavar="A:B",
        help="show periods A to B, or A alone (default: 4 periods from the middle of the run)",
    )
    timeline.set_defaults(handler=timeline_handler)
    plot = sub.add_parser(
        "plot",
        help="draw reward, accuracy, response length, throughput (and episodes' figures) a period;"
        " several runs: side by side",
    )
    plot.add_argument(
        "dir", type=Path, nargs="+", help="a run folder; several: their eval accuracy, reward and tool calls"
    )
    plot.add_argument("-o", "--out", type=Path, required=True, help="picture file, .png or .svg")
    plot.add_argument(
        "--x",
        choices=["period", "seconds"],
        default="period",
        help="several runs: against the period, or the wall-clock seconds since each run's start",
    )
    plot.set_defaults(handler=plot_handler)


def _add_logs(sub: Subparsers) -> None:
    logs = sub.add_parser("logs", help="the merged structured logs of every actor of a run")
    logs.add_argument("dir", type=Path, nargs="?", help="a run folder (or use --connect)")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing events as they come")
    logs.add_argument("--connect", default=None, help="follow a live run through its dispatcher's address")
    logs.add_argument("--run-id", default=None, help="with --connect: the run's id (or give --config)")
    logs.add_argument(
        "--config", type=Path, default=None, help="with --connect: the run's config (its run_id)"
    )
    logs.add_argument("--actor", action="append", default=[], help="only actors named so (a prefix)")
    logs.add_argument("--event", action="append", default=[], help="only these events (glob patterns)")
    logs.add_argument("--period", default=None, help="only events of period N, or A:B")
    logs.add_argument("--level", default="info", choices=["debug", "info", "warning", "error"])
    logs.add_argument("--json", action="store_true", help="one JSON object a line")
    logs.add_argument(
        "--backlog", type=int, default=1000, help="with --connect: earlier events to show first"
    )
    logs.add_argument(
        "--keys", type=Path, default=None, help="with --connect: the run's keys folder (or its --config's)"
    )
    logs.set_defaults(handler=logs_handler)


def _periods(text: str) -> tuple[int, int]:
    from cadence.monitor.pictures.spans import parse_periods

    try:
        return parse_periods(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def logs_handler(args: argparse.Namespace) -> int:
    from cadence.monitor.logview import Filter, parse_periods, show_logs

    try:
        periods = parse_periods(args.period) if args.period is not None else None
    except ValueError as err:
        return refuse(str(err))
    where = Filter(tuple(args.actor), tuple(args.event), periods, args.level)
    if args.connect is not None:
        return _follow_remote(args, where)
    if args.dir is None:
        return refuse("logs wants a run folder or --connect ADDRESS")
    return show_logs(args.dir, args.follow, where=where, as_json=args.json)


def _follow_remote(args: argparse.Namespace, where: Filter) -> int:
    """`logs --connect`: a live run's events through its dispatcher."""
    import asyncio

    from cadence.config import load_config
    from cadence.monitor.logview import follow_remote
    from cadence.transport.keys import KeysError

    run_id = args.run_id
    keys: Path | None = args.keys
    if args.config is not None:
        cfg = load_config(args.config)
        run_id = run_id or cfg.run_id
        keys = keys or (Path(cfg.transport.keys) if cfg.transport.keys else None)
    if not run_id:
        return refuse("--connect needs the run's id: --run-id ID or --config FILE")
    if args.backlog < 0:
        return refuse(f"--backlog is a number of earlier events, 0 or more, got {args.backlog}")
    try:
        return asyncio.run(
            follow_remote(
                args.connect, run_id, args.follow, where, args.json, backlog=args.backlog, keys=keys
            )
        )
    except KeysError as err:
        return refuse(str(err))


def timeline_handler(args: argparse.Namespace) -> int:
    from cadence.monitor.pictures import write_picture
    from cadence.monitor.pictures.timeline import draw_timeline

    return write_picture(lambda: draw_timeline(args.dir, args.out, args.periods))


def plot_handler(args: argparse.Namespace) -> int:
    from cadence.monitor.pictures import write_picture
    from cadence.monitor.pictures.compare import draw_compare
    from cadence.monitor.pictures.plot import draw_plot

    if len(args.dir) > 1:
        return write_picture(lambda: draw_compare(args.dir, args.out, args.x == "seconds"))
    return write_picture(lambda: draw_plot(args.dir[0], args.out))
