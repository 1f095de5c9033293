"""The wire contract: every message type and its fields; the codec they travel by is `cadence.wire.codec`,
re-exported here so that actors and tests import the whole contract from one place.

Invariant: every type here is a frozen dataclass declared once under its tag (`@message`), its fields
typed so the codec can check them; tensors never travel as pickles: weights are safetensors bytes in
`WeightChunk` payloads, or broadcast tensors laid out by `BroadcastPlan`. This module imports nothing
of cadence but the codec.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from cadence.wire.codec import (
    DEFAULT_MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    REGISTRY,
    DecodeError,
    Envelope,
    Message,
    Payload,
    decode,
    decode_frames,
    encode,
    encode_frames,
    message,
)

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES",
    "PROTOCOL_VERSION",
    "REGISTRY",
    "DecodeError",
    "Envelope",
    "Message",
    "Payload",
    "decode",
    "decode_frames",
    "encode",
    "encode_frames",
    "message",
]


# ---------------------------------------------------------------- roster and liveness


@message("register")
@dataclass(frozen=True)
class Register(Message):
    """An actor announces itself to the dispatcher. `address` is where it serves, if it does; `key`:
    the trainer's key, which the dispatcher makes assignment tickets with and checks the trainer's
    signed messages against (`cadence.wire.roles`); `proof`: a secret of this session, new at every
    start, which a registration under the same name must show to take this one's place while this
    one's connection is still there."""

    role: str
    address: str = ""
    pid: int = 0
    host: str = ""
    key: str = ""
    local: str = ""  # an ipc:// address it also serves at, for peers on its own host
    proof: str = ""  # the session's random secret: only a registration showing it again takes its place


@message("welcome")
@dataclass(frozen=True)
class Welcome(Message):
    """The dispatcher's answer to a rollout worker: where the trainer and publisher are;
    `publisher_local`: the publisher's ipc:// address, for a worker on `publisher_host` (a version's
    bytes through a Unix socket instead of TCP loopback)."""

    trainer_address: str
    publisher_address: str
    version: int
    publisher_local: str = ""
    publisher_host: str = ""


@message("trainer_key")
@dataclass(frozen=True)
class TrainerKey(Message):
    """The dispatcher tells the publisher the key of the registered trainer: only a `WeightUpload`
    whose ticket was made with it is taken."""

    key: str


@message("heartbeat")
@dataclass(frozen=True)
class Heartbeat(Message):
    """I am alive. Sent every `transport.heartbeat_s` in both directions."""

    role: str = ""


@message("shutdown")
@dataclass(frozen=True)
class Shutdown(Message):
    """The run is over (or failed): stop after finishing nothing further. `stopped`: its user ended it
    before its last period (`cadence slurm stop`): no failure, and the trainer ends cleanly.
    `refused`: the registration it answers was refused (`reason` says why): the actor fails."""

    reason: str
    stopped: bool = False
    refused: bool = False


# ---------------------------------------------------------------- logs


@message("log_batch")
@dataclass(frozen=True)
class LogBatch(Message):
    """Log events of one actor, each a JSON object text, sent to the dispatcher and on to followers.
    `path` is the file the actor writes them to itself; `dropped` counts events lost to a full buffer."""

    actor: str
    host: str
    path: str
    lines: list[str]
    dropped: int = 0


@message("subscribe")
@dataclass(frozen=True)
class Subscribe(Message):
    """A follower asks the dispatcher for the run's log events (the last `backlog` first); sent again
    every heartbeat to stay subscribed."""

    backlog: int = 0


# ---------------------------------------------------------------- work


@message("work_request")
@dataclass(frozen=True)
class WorkRequest(Message):
    """A rollout worker grants the dispatcher `credits` more prompt groups."""

    credits: int


@message("assignment")
@dataclass(frozen=True)
class Assignment(Message):
    """Generate `group_size` completions of one prompt with weights `version`. `ticket`: the
    dispatcher's proof of this assignment to this worker, which its `GroupResult` shows the trainer.
    `batch`: how many assignments the dispatcher sent this worker together, this one among them
    (generated together). `eval`: a held-out prompt (negative id) of the eval round of `version`
    (`period` = `version`): generated with the eval sampling settings and answered to the dispatcher
    with an `EvalResult`, never to the trainer; a batch is all eval or all training."""

    period: int
    version: int
    prompt_id: int
    prompt: str
    answer: str
    group_size: int
    ticket: str = ""
    batch: int = 1
    eval: bool = False


@message("eval_result")
@dataclass(frozen=True)
class EvalResult(Message):
    """A worker's answer to an eval assignment, sent to the dispatcher (never trained): the prompt's
    samples with their rewards and correctness from the run's reward functions, and their texts."""

    version: int
    prompt_id: int
    rewards: list[float]
    correct: list[float]
    responses: list[str]
    tokens: list[int]  # each sample's completion length in tokens
    gen_s: float = 0.0


@message("group_result")
@dataclass(frozen=True)
class GroupResult(Message):
    """A finished, scored group, pushed to the trainer as soon as it is done."""

    period: int
    version: int
    prompt_id: int
    prompt_tokens: list[int]
    completions: list[list[int]]
    logprobs: list[list[float]]
    rewards: list[float]
    correct: list[float]
    gen_s: float
    load_s: float
    finished_at: float
    reward_parts: dict[str, list[float]] = field(default_factory=dict)  # each reward function's values
    prompt: str = ""  # text of a group kept as a sample (rollout samples), else empty
    answer: str = ""
    responses: list[str] = field(default_factory=list)
    ticket: str = ""  # the assignment's ticket: without the right one the trainer refuses the group
    following: int = (
        0  # groups of the same batch sent right after this one (the trainer trains them together)
    )


@message("consumed")
@dataclass(frozen=True)
class Consumed(Message):
    """The trainer has taken these prompt groups of `period` into the gradient."""

    period: int
    prompt_ids: list[int]
    mac: str = ""  # under the trainer's key (`cadence.wire.roles.sign`)


@message("version_ready")
@dataclass(frozen=True)
class VersionReady(Message):
    """Weights `version` are published; period `version` may start. Carries the last period's metrics
    as a plain map (the trainer's `PeriodMetrics.to_row()`; empty for the first version of a run).
    `digest`: the xxh3-128 of the version's bytes, the one every pull is verified against."""

    version: int
    digest: str
    nbytes: int
    metrics: dict[str, Any] = field(default_factory=dict)
    mac: str = ""  # under the trainer's key (`cadence.wire.roles.sign`)


@message("run_done")
@dataclass(frozen=True)
class RunDone(Message):
    """The trainer has finished the last period and saved the final weights."""

    version: int
    sha256: str
    checkpoint: str
    mac: str = ""  # under the trainer's key (`cadence.wire.roles.sign`)


# ---------------------------------------------------------------- weights


@message("weight_query")
@dataclass(frozen=True)
class WeightQuery(Message):
    """Ask the publisher for the size and checksum of `version`."""

    version: int


@message("weight_meta")
@dataclass(frozen=True)
class WeightMeta(Message):
    """`available` False: the publisher does not hold that version (any more). `digest`: the bytes'
    xxh3-128, which a puller checks the whole against."""

    version: int
    available: bool
    nbytes: int
    digest: str
    chunk_bytes: int
    chunks: int


@message("weight_chunk_request")
@dataclass(frozen=True)
class WeightChunkRequest(Message):
    version: int
    index: int


@message("weight_chunk")
@dataclass(frozen=True)
class WeightChunk(Message):
    """Chunk `index` of `version`; `data` travels as the payload frame."""

    PAYLOAD: ClassVar[str] = "data"

    version: int
    index: int
    data: Payload


@message("weight_upload")
@dataclass(frozen=True)
class WeightUpload(Message):
    """The trainer hands a version to a publisher in another process, chunk by chunk; `data` travels
    as the payload frame."""

    PAYLOAD: ClassVar[str] = "data"

    version: int
    index: int
    chunks: int
    digest: str  # xxh3-128 of the whole version
    data: Payload
    ticket: str = ""  # made with the trainer's key: without the right one the publisher refuses the chunk


@message("broadcast_join")
@dataclass(frozen=True)
class BroadcastJoin(Message):
    """A worker asks the publisher to take it into the weight broadcasts (again, after a failure)."""

    worker: str  # the worker's name (its broadcast channel has a name of its own)


@message("broadcast_joined")
@dataclass(frozen=True)
class BroadcastJoined(Message):
    """The publisher's answer: broadcasts reach the worker from `from_version` on; earlier ones it pulls."""

    from_version: int


@message("broadcast_dropped")
@dataclass(frozen=True)
class BroadcastDropped(Message):
    """The publisher took the worker out of the broadcasts at `version` (it did not confirm in time):
    it pulls until it has joined again."""

    version: int


@message("broadcast_plan")
@dataclass(frozen=True)
class BroadcastPlan(Message):
    """Version `version` is about to be broadcast in group `generation` (formed anew when it is new):
    join it at `store_host:store_port` as `rank` of `world` and receive the buckets laid out here."""

    version: int
    generation: int
    rank: int
    world: int
    backend: str
    store_host: str
    store_port: int
    prefix: str
    timeout_s: float
    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    buckets: list[int]
    offsets: list[int]
    sizes: list[int]
