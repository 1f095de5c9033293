"""`cadence bench NAME`: the measurements of docs/benchmarks.md."""

from __future__ import annotations

import argparse
from pathlib import Path

from cadence.cli.common import Subparsers


def add(sub: Subparsers) -> None:
    bench = sub.add_parser("bench", help="measurements printed as text or JSON (docs/benchmarks.md)")
    bench.add_argument(
        "name",
        choices=[
            "pipeline",
            "packing",
            "learner",
            "logs",
            "weights",
            "e2e",
            "tail",
            "signing",
            "wire",
            "mismatch",
            "agents",
            "generate",
            "strangers",
        ],
    )
    bench.add_argument("--json", action="store_true", help="last line: the figures as JSON")
    bench.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    bench.add_argument("--out", type=Path, default=Path("runs/bench"))
    bench.add_argument(
        "--mbytes",
        type=float,
        default=None,
        help="weights: megabytes to publish (default: SmolLM2-135M fp32)",
    )
    bench.add_argument(
        "--config", type=Path, default=None, help="e2e, tail, mismatch: the run's config (default: SmolLM2's)"
    )
    bench.add_argument(
        "--engines",
        default="float32,bfloat16",
        help="mismatch: comma-separated sampling engines: float32, bfloat16 (the built-in one's"
        " rollout.dtype), vllm (in a Python with vLLM)",
    )
    bench.add_argument(
        "--precisions", default="fp32,bf16", help="mismatch: comma-separated trainer.precision values"
    )
    bench.add_argument("--prompts", type=int, default=4, help="mismatch: prompts sampled (each a group)")
    bench.add_argument(
        "--periods",
        type=int,
        default=6,
        help="e2e: periods a mode, the first 2 left out; tail: periods a run, the first left out",
    )
    bench.add_argument(
        "--variants",
        default=None,
        help="tail: [sampling] variants, e.g. base,over25,over50+zv,over50+zv@prompt (overNN: oversample"
        " NN/100; zv: zero_variance; rr: reward_range; @prompt: order); learner: dense,blocks,recompute",
    )
    _generate_arguments(bench)
    _learner_options(bench)
    bench.add_argument(
        "--rounds", type=int, default=2, help="tail: rounds of the variants, every other one reversed"
    )
    bench.set_defaults(handler=bench_handler)


def _learner_options(bench: argparse.ArgumentParser) -> None:
    bench.add_argument("--tokens", default="1024,4096,16384", help="learner: comma-separated token budgets")
    bench.add_argument("--layers", type=int, default=2, help="learner: SmolLM2-135M's blocks to run (of 30)")


def bench_handler(args: argparse.Namespace) -> int:
    if args.name == "strangers":
        from cadence.bench.strangers import bench_strangers

        return bench_strangers(args.json)
    if args.name == "logs":
        from cadence.bench.logs import bench_logs

        return bench_logs(args.json)
    if args.name == "generate":
        return _generate(args)
    if args.name == "weights":
        from cadence.bench.weights import bench_weights

        return bench_weights(args.json, args.mbytes)
    if args.name == "e2e":
        from cadence.bench.e2e import bench_e2e

        return bench_e2e(args.config, args.overrides, args.periods, args.json)
    if args.name == "tail":
        from cadence.bench.tail import bench_tail

        return bench_tail(
            args.config, args.overrides, args.periods, args.json, args.out, args.variants, args.rounds
        )
    if args.name == "mismatch":
        from cadence.bench.mismatch import bench_mismatch

        engines, precisions = args.engines.split(","), args.precisions.split(",")
        return bench_mismatch(args.config, args.overrides, engines, precisions, args.prompts, args.json)
    if args.name == "agents":
        from cadence.bench.agents import bench_agents

        return bench_agents(args.json)
    if args.name == "signing":
        from cadence.bench.signing import bench_signing

        return bench_signing(args.json)
    if args.name == "wire":
        from cadence.bench.wire import bench_wire

        return bench_wire(args.json)
    if args.name == "learner":
        from cadence.bench.learner import bench_learner

        budgets = [int(t) for t in args.tokens.split(",")]
        variants = args.variants.split(",") if args.variants else ("dense", "blocks")
        return bench_learner(args.json, budgets, args.layers, args.repeats, variants, args.device)
    if args.name == "packing":
        from cadence.bench.packing import bench_packing

        return bench_packing(args.json)
    from cadence.bench.pipeline import bench_pipeline

    return bench_pipeline(args.overrides, args.out, args.json)


def _generate_arguments(bench: argparse.ArgumentParser) -> None:
    bench.add_argument("--models", default="tiny,smollm2", help="generate: tiny, smollm2 (comma-separated)")
    bench.add_argument(
        "--rows", default="8,32,128", help="generate: samples decoded together (comma-separated)"
    )
    bench.add_argument("--dtypes", default="float32,bfloat16", help="generate: the engines' dtypes")
    bench.add_argument("--new-tokens", default="64,256", help="generate: token limits (comma-separated)")
    bench.add_argument(
        "--gen-engines",
        default="eager,compiled,transformers,vllm",
        help="generate: eager, compiled (the built-in engine), transformers, vllm (from .venv-vllm)",
    )
    bench.add_argument("--device", default="cpu", help="generate, learner: cpu or cuda")
    bench.add_argument(
        "--repeats",
        type=int,
        default=2,
        help="generate: timed calls a case; learner: timed steps after a warm-up",
    )
    bench.add_argument("--threads", type=int, default=0, help="generate: torch threads (0: torch's own)")
    bench.add_argument(
        "--full-length",
        action="store_true",
        help="generate: every sample exactly --new-tokens long (eos not a stop): every engine the same work",
    )


def _generate(args: argparse.Namespace) -> int:
    from cadence.bench.generate import bench_generate

    return bench_generate(
        args.json,
        args.models.split(","),
        [int(n) for n in args.rows.split(",")],
        args.dtypes.split(","),
        [int(n) for n in args.new_tokens.split(",")],
        args.gen_engines.split(","),
        args.device,
        args.repeats,
        args.threads,
        args.full_length,
    )
