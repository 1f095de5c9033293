"""A hostile peer in a process of its own: sends garbage to one address at full speed, no pause.

`python -m tests.system.flooder ADDRESS SECONDS RUN_ID` prints how many frames it handed to ZeroMQ.
"""

from __future__ import annotations

import random
import sys
import time

import msgpack
import zmq

from cadence.wire.messages import PROTOCOL_VERSION, Consumed, GroupResult, WorkRequest, encode


def frames(run_id: str) -> list[list[bytes]]:
    """Random bytes, truncated msgpack, wrong shapes, another run's message (refused by the codec),
    and well-formed messages of this run from a stranger (refused by the actors)."""
    rng = random.Random(7)
    good = encode(WorkRequest(3), "stranger", run_id)
    bad = [[bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300)))] for _ in range(20)]
    bad += [[good[:cut]] for cut in (1, 5, len(good) // 2)]
    bad += [[msgpack.packb({"type": "heartbeat", "proto": PROTOCOL_VERSION + 1, "body": {}})]]
    bad += [[encode(WorkRequest(3), "stranger", "another-run")]]
    forged = GroupResult(0, 0, 1, [1], [[1]], [[0.0]], [1.0], [1.0], 0.0, 0.0, 0.0)
    bad += [[good], [encode(Consumed(0, [0]), "stranger", run_id)], [encode(forged, "stranger", run_id)]]
    return bad


def main(address: str, seconds: float, run_id: str) -> int:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 100_000)
    sock.connect(address)
    garbage = frames(run_id)
    sent = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for parts in garbage:
            try:
                sock.send_multipart(parts, flags=zmq.NOBLOCK)
                sent += 1
            except zmq.Again:
                pass
    sock.close()
    ctx.term()
    print(sent)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], float(sys.argv[2]), sys.argv[3]))
