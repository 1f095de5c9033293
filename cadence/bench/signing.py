"""`cadence bench signing`: what the MAC on the trainer's word costs (`cadence.wire.roles.sign`).

The trainer signs one `Consumed` a group, one `VersionReady` (with the period's metrics row) and, at
the end, one `RunDone`; the dispatcher checks each after decoding it. Measured: the microseconds to
sign and to check each, a message decoded from the wire as the dispatcher sees it, and what one
period of `prompts_per_period` groups costs both sides together.

Invariant: nothing is asserted; the figures are printed. Every check timed is a check that holds.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

from cadence.bench.report import report
from cadence.monitor.period_metrics import PeriodMetrics
from cadence.wire.messages import Consumed, Message, RunDone, VersionReady, decode_frames, encode_frames
from cadence.wire.roles import new_key, sign, signed


def _metrics_row(rng: random.Random) -> dict[str, Any]:
    """A period's row with every number filled, as a trainer sends it."""
    row = PeriodMetrics().to_row()
    for name, value in row.items():
        if isinstance(value, float):
            row[name] = rng.random() * 100
        elif isinstance(value, int) and not isinstance(value, bool):
            row[name] = rng.randrange(1, 10_000)
    return row


def _per_call_us(action: Callable[[], object], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        action()
    return (time.perf_counter() - start) / calls * 1e6


def _figures(key: str, msg: Message, calls: int) -> dict[str, float]:
    good = sign(key, msg)
    received = decode_frames(encode_frames(good, "trainer", "bench")).message
    if not signed(key, received):
        raise RuntimeError(f"{msg.TAG}: a signed message does not check")
    return {
        "sign_us": round(_per_call_us(lambda: sign(key, msg), calls), 2),
        "check_us": round(_per_call_us(lambda: signed(key, received), calls), 2),
    }


def bench_signing(as_json: bool, prompts_per_period: int = 64, calls: int = 20_000) -> int:
    rng = random.Random(0)
    key = new_key()
    messages: dict[str, Message] = {
        "consumed": Consumed(12, [rng.randrange(1 << 20)]),
        "version_ready": VersionReady(13, "d" * 32, 538_000_000, _metrics_row(rng)),
        "run_done": RunDone(200, "s" * 64, "/runs/a/checkpoints/final"),
    }
    result: dict[str, Any] = {"bench": "signing", "calls": calls}
    for tag, msg in messages.items():
        for name, value in _figures(key, msg, calls).items():
            result[f"{tag}_{name}"] = value
    per_message = {tag: result[f"{tag}_sign_us"] + result[f"{tag}_check_us"] for tag in messages}
    result["prompts_per_period"] = prompts_per_period
    result["period_us"] = round(
        prompts_per_period * per_message["consumed"] + per_message["version_ready"], 1
    )
    return report(result, as_json)
