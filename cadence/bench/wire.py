"""`cadence bench wire`: what the codec costs a message, to encode and to decode with every check.

Three messages, each as its actor sends it: a `GroupResult` of `group_size` completions of
`tokens` tokens each, with their log-probs, rewards and two reward functions' parts (what a worker
pushes to the trainer once a group); a `WeightChunk` of `chunk_mib` MiB (what a publisher serves a
version in; its payload travels in a frame of its own); a `Heartbeat` (the envelope alone). Measured:
the microseconds to encode each into its frames and to decode those frames back, the median of
`rounds` rounds of calls, and the header frame's size.

Invariant: nothing is asserted; the figures are printed. Every decode timed is one that gives back
the message encoded. `load_avg` is the machine's load average at the end: other work on the cores
moves every figure.
"""

from __future__ import annotations

import os
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

from cadence.bench.report import report
from cadence.wire.messages import (
    PROTOCOL_VERSION,
    GroupResult,
    Heartbeat,
    Message,
    WeightChunk,
    decode_frames,
    encode_frames,
)


def _group(rng: random.Random, group_size: int, tokens: int, vocab: int = 49_152) -> GroupResult:
    """A scored group as a worker pushes it: no texts (those travel only with the groups kept as
    samples), a ticket, every number drawn."""
    return GroupResult(
        period=41,
        version=41,
        prompt_id=rng.randrange(1 << 20),
        prompt_tokens=[rng.randrange(vocab) for _ in range(64)],
        completions=[[rng.randrange(vocab) for _ in range(tokens)] for _ in range(group_size)],
        logprobs=[[-rng.expovariate(2.0) for _ in range(tokens)] for _ in range(group_size)],
        rewards=[rng.random() for _ in range(group_size)],
        correct=[float(rng.random() < 0.5) for _ in range(group_size)],
        gen_s=rng.uniform(1.0, 5.0),
        load_s=rng.uniform(0.0, 0.5),
        finished_at=1.7e9 + rng.random(),
        reward_parts={
            "correct": [rng.random() for _ in range(group_size)],
            "format": [rng.random() for _ in range(group_size)],
        },
        ticket=f"{rng.getrandbits(128):032x}",
        following=3,
    )


def _median_us(action: Callable[[], object], calls: int, rounds: int) -> float:
    """The median over `rounds` of the mean microseconds a call."""
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            action()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def _figures(msg: Message, calls: int, rounds: int) -> dict[str, float]:
    frames = encode_frames(msg, "rollout-0", "bench")
    if decode_frames(frames).message != msg:
        raise RuntimeError(f"{msg.TAG}: a message does not decode to itself")
    return {
        "header_bytes": len(frames[0]),
        "encode_us": round(_median_us(lambda: encode_frames(msg, "rollout-0", "bench"), calls, rounds), 2),
        "decode_us": round(_median_us(lambda: decode_frames(frames), calls, rounds), 2),
    }


def bench_wire(
    as_json: bool,
    group_size: int = 8,
    tokens: int = 200,
    chunk_mib: int = 4,
    calls: int = 500,
    rounds: int = 7,
) -> int:
    rng = random.Random(0)
    messages: dict[str, Message] = {
        "group_result": _group(rng, group_size, tokens),
        "weight_chunk": WeightChunk(version=41, index=7, data=os.urandom(chunk_mib << 20)),
        "heartbeat": Heartbeat("rollout"),
    }
    result: dict[str, Any] = {
        "bench": "wire",
        "protocol": PROTOCOL_VERSION,
        "group_size": group_size,
        "tokens": tokens,
        "chunk_bytes": chunk_mib << 20,
        "calls": calls,
        "rounds": rounds,
    }
    for tag, msg in messages.items():
        for name, value in _figures(msg, calls, rounds).items():
            result[f"{tag}_{name}"] = value
    result["load_avg"] = [round(x, 2) for x in os.getloadavg()]
    return report(result, as_json)
