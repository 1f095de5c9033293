"""The wire contract: every message type and its fields; the codec they travel by is `cadence.wire.codec`,
re-exported here so that actors and tests import the whole contract from one place.

Invariant: every type here is a frozen msgspec struct declared once under its wire tag
(`class Name(Message, tag="name")`), its fields typed, and ranged where their values have a range by
nature (a version, a count, a size, an index: never negative), so that the codec refuses anything
else; tensors never travel as pickles: weights are safetensors bytes in `WeightChunk` payloads, or
broadcast tensors laid out by `BroadcastPlan`. This module imports nothing of cadence but the codec and
the slots a `WeightMeta` names (`cadence.wire.slots`).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

import msgspec
from msgspec import Meta, field

from cadence.wire.codec import (
    DEFAULT_MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    REGISTRY,
    DecodeError,
    Envelope,
    Message,
    Payload,
    Peek,
    decode,
    decode_frames,
    encode,
    encode_frames,
    peek,
)
from cadence.wire.slots import DeviceSlot as DeviceSlot
from cadence.wire.slots import SharedSlot as SharedSlot

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES",
    "PROTOCOL_VERSION",
    "REGISTRY",
    "DecodeError",
    "Envelope",
    "Message",
    "Payload",
    "Peek",
    "decode",
    "decode_frames",
    "encode",
    "encode_frames",
    "peek",
]

Version = Annotated[int, Meta(ge=0)]
"""A version of the weights, or a period (version k = period k): 0 up to the run's periods."""
Count = Annotated[int, Meta(ge=0)]
"""How many of something, a size in bytes, a position among others: never negative."""
AtLeastOne = Annotated[int, Meta(ge=1)]
"""How many of something there is at least one of."""
TokenId = Annotated[int, Meta(ge=0)]
"""A position in the vocabulary (whose size the trainer checks: `cadence.wire.meaning`)."""
Port = Annotated[int, Meta(ge=0, le=65535)]
"""A TCP port."""


# ---------------------------------------------------------------- roster and liveness


class Register(Message, tag="register"):
    """An actor announces itself to the dispatcher. `address` is where it serves, if it does; `key`:
        the trainer's key, which the dispatcher makes assignment tickets with and checks the trainer's
        signed messages against (`cadence.wire.roles`); `proof`: a secret of this session, new at every
        start, which a registration under the same name must show to take this one's place while this
        one's connection is still there. `secret`: the run's secret, which a trainer or publisher shows
    (`cadence.launch.secret`)."""

    role: str
    address: str = ""
    pid: Count = 0
    host: str = ""
    key: str = ""
    local: str = ""  # an ipc:// address it also serves at, for peers on its own host
    proof: str = ""  # the session's random secret: only a registration showing it again takes its place
    secret: str = ""  # a trainer's or publisher's: the run's secret (`run.secret`), where the run has one


class Welcome(Message, tag="welcome"):
    """The dispatcher's answer to a rollout worker: where the trainer and publisher are;
    `publisher_local`: the publisher's ipc:// address, for a worker on `publisher_host` (a version's
    bytes through a Unix socket instead of TCP loopback)."""

    trainer_address: str
    publisher_address: str
    version: Version
    publisher_local: str = ""
    publisher_host: str = ""


class TrainerKey(Message, tag="trainer_key"):
    """The dispatcher tells the publisher the key of the registered trainer: only a `WeightUpload`
    whose ticket was made with it is taken."""

    key: str


class Heartbeat(Message, tag="heartbeat"):
    """I am alive. Sent every `transport.heartbeat_s` in both directions."""

    role: str = ""


class Shutdown(Message, tag="shutdown"):
    """The run is over (or failed): stop after finishing nothing further. `stopped`: its user ended it
    before its last period (`cadence slurm stop`): no failure, and the trainer ends cleanly.
    `refused`: the registration it answers was refused (`reason` says why): the actor fails."""

    reason: str
    stopped: bool = False
    refused: bool = False


# ---------------------------------------------------------------- logs


class LogBatch(Message, tag="log_batch"):
    """Log events of one actor, each a JSON object text, sent to the dispatcher and on to followers.
    `path` is the file the actor writes them to itself; `dropped` counts events lost to a full buffer."""

    actor: str
    host: str
    path: str
    lines: list[str]
    dropped: Count = 0


class Subscribe(Message, tag="subscribe"):
    """A follower asks the dispatcher for the run's log events (the last `backlog` first); sent again
    every heartbeat to stay subscribed."""

    backlog: Count = 0


# ---------------------------------------------------------------- work


class WorkRequest(Message, tag="work_request"):
    """A rollout worker grants the dispatcher `credits` more prompt groups."""

    credits: Count


class Assignment(Message, tag="assignment"):
    """Generate `group_size` completions of one prompt with weights `version`. `ticket`: the
    dispatcher's proof of this assignment to this worker, which its `GroupResult` shows the trainer.
    `batch`: how many assignments the dispatcher sent this worker together, this one among them
    (generated together). `eval`: a held-out prompt (negative id) of the eval round of `version`
    (`period` = `version`): generated with the eval sampling settings and answered to the dispatcher
    with an `EvalResult`, never to the trainer; a batch is all eval or all training."""

    period: Version
    version: Version
    prompt_id: int
    prompt: str
    answer: str
    group_size: AtLeastOne
    ticket: str = ""
    batch: AtLeastOne = 1
    eval: bool = False


class EpisodeFigures(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """A group's episodes beyond their token ids, one entry a sample: declared once, carried by both
    `GroupResult` and `EvalResult` (`episodes`; absent for a single-turn group). Each list is empty or
    one a sample (`cadence.wire.meaning`); fields at their default are left out on the wire."""

    turns: list[Count] = field(default_factory=list)  # each episode's model turns
    tool_calls: list[Count] = field(default_factory=list)  # each episode's tool calls
    tool_errors: list[Count] = field(default_factory=list)  # of which answered with an error
    env_timeouts: list[Count] = field(default_factory=list)  # environment calls cut at their timeout
    env_s: list[float] = field(default_factory=list)  # seconds spent in the environment's calls
    env_tokens: list[Count] = field(default_factory=list)  # the environment's tokens (its mask's zeros)
    endings: list[str] = field(default_factory=list)  # why each episode ended (done, max_turns, ...)
    transcripts: list[list[str]] = field(default_factory=list)  # kept groups and eval answers: each
    # episode's messages, the first message, then the model's turn and the environment's answer
    # alternating (even: the environment's, odd: the model's)
    turn_rewards: list[list[float | None]] = field(default_factory=list)  # each episode's answered turns'
    # own rewards (`Reply.reward`; None: that turn got none), recorded beside the score, never trained
    # on; empty when no turn of the group got one
    sequences: list[Count] = field(default_factory=list)  # agent episodes: each episode's sequences (more
    # than one: the agent rewrote its history or branched; each a row of the group, `episode_of`)
    call_tokens: list[Count] = field(default_factory=list)  # agent episodes: tokens its calls sampled
    call_s: list[float] = field(default_factory=list)  # agent episodes: seconds inside its calls
    env_wall_s: float = 0.0  # the group's share (by its episodes) of the wall seconds in which any
    # environment call of its worker's batch ran: the episodes' env_s overlap, these do not


class EvalResult(Message, tag="eval_result", omit_defaults=True):
    """A worker's answer to an eval assignment, sent to the dispatcher (never trained): the prompt's
    samples with their rewards and correctness from the run's reward functions, and their texts; a
    multi-turn episode's figures and messages in `episodes`. Fields at their default are left out on
    the wire, so a single-turn answer carries no byte of them."""

    version: Version
    prompt_id: int
    rewards: list[float]
    correct: list[float]
    responses: list[str]
    tokens: list[Count]  # each sample's completion length in tokens
    gen_s: float = 0.0
    episodes: EpisodeFigures | None = None


class GroupResult(Message, tag="group_result", omit_defaults=True):
    """A finished, scored group, pushed to the trainer as soon as it is done.

    Multi-turn episodes (`environment.name`): a completion is everything after the prompt, the model's
    turns and the environment's messages in order; `masks` says which is which (1: sampled by the
    model, with its log-prob; 0: the environment's, log-prob 0.0), and `episodes` holds the figures,
    one a sample. A single-turn group leaves both empty: every token sampled. Fields at their default
    are left out on the wire (`omit_defaults`), so a single-turn group carries no byte of them.

    Rows and samples: `completions`, `logprobs`, `masks` and `truncated` are one a row; `rewards`,
    `correct`, `reward_parts`, `responses` and `episodes` one a sample. A row is a sample unless
    `episode_of` says otherwise: an agent's episode of several token sequences (it rewrote its history)
    is one sample of several rows, `episode_of[i]` the sample of row i, in order, every sample with a
    row (`cadence.wire.rows`)."""

    PROOF: ClassVar[tuple[str, ...]] = ("period", "prompt_id", "ticket")  # what its ticket is checked on

    period: Version
    version: Version
    prompt_id: int
    prompt_tokens: list[TokenId]
    completions: list[list[TokenId]]
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
    following: Count = (
        0  # groups of the same batch sent right after this one (the trainer trains them together)
    )
    masks: list[list[Count]] = field(default_factory=list)  # 1 sampled, 0 the environment's; empty: all 1
    episodes: EpisodeFigures | None = None  # the episodes' figures; None: a single-turn group
    truncated: list[bool] = field(default_factory=list)  # each sample cut at its token limit rather
    # than ended (eos, or an episode's own end); empty: none was
    episode_of: list[Count] = field(default_factory=list)  # each row's sample (episode), in order;
    # empty: row i is sample i
    weights_from: str = ""  # how the worker's version came (shm, zmq, gloo...): a batch's first group


class Consumed(Message, tag="consumed"):
    """The trainer has taken these prompt groups of `period` (`prompt_ids`: they are never handed out
    again). `filtered`: groups of the period a filter threw away (`sampling.filters`), never trained:
    the dispatcher may draw other prompts in their place. `closed`: the period has its B kept groups,
    or has run out of prompts: whatever of it is still queued or generated is stopped."""

    period: Version
    prompt_ids: list[int]
    mac: str = ""  # under the trainer's key (`cadence.wire.roles.sign`)
    filtered: list[int] = field(default_factory=list)
    closed: bool = False


class StopPeriod(Message, tag="stop_period"):
    """The dispatcher tells a rollout worker that period `period` is closed: drop every assignment of
    it, queued or being generated (the built-in engine's rows leave the batch, vLLM's requests are
    aborted), and send nothing of it."""

    period: Version


class VersionReady(Message, tag="version_ready"):
    """Weights `version` are published; period `version` may start. Carries the last period's metrics
    as a plain map (the trainer's `PeriodMetrics.to_row()`; empty for the first version of a run).
    `digest`: the version's bytes' digest (`wire/digest.py`), the one every pull is verified against;
    empty when it was announced from the trainer's GPU before its host bytes were stored."""

    version: Version
    digest: str
    nbytes: Count
    metrics: dict[str, Any] = field(default_factory=dict)
    mac: str = ""  # under the trainer's key (`cadence.wire.roles.sign`)


class RunDone(Message, tag="run_done"):
    """The trainer has finished the last period and saved the final weights."""

    version: Version
    sha256: str
    checkpoint: str
    mac: str = ""  # under the trainer's key (`cadence.wire.roles.sign`)


# ---------------------------------------------------------------- weights


class WeightQuery(Message, tag="weight_query"):
    """Ask the publisher for the size and checksum of `version`. `device`: the asker may take it from
    the publisher's device buffer alone (a worker on a GPU): a version announced before its host
    bytes are stored is then answered at once; otherwise once they are."""

    version: Version
    device: bool = False


class WeightMeta(Message, tag="weight_meta"):
    """`available` False: the publisher does not hold that version (any more), or, with `device`, not
    yet in host memory. `digest`: the bytes' digest (`wire/digest.py`), which a puller checks the whole
    against. `shared`: where a worker on the publisher's host maps the same bytes instead of pulling
    them; None where the publisher does not share. `device`: where a worker on the publisher's GPU
    finds the version in that device's memory."""

    version: Version
    available: bool
    nbytes: Count
    digest: str
    chunk_bytes: Count
    chunks: Count
    shared: SharedSlot | None = None
    device: DeviceSlot | None = None


class WeightChunkRequest(Message, tag="weight_chunk_request"):
    version: Version
    index: Count


class WeightChunk(Message, tag="weight_chunk"):
    """Chunk `index` of `version`; `data` travels as the payload frame."""

    PAYLOAD: ClassVar[str] = "data"

    version: Version
    index: Count
    data: Payload


class WeightUpload(Message, tag="weight_upload"):
    """The trainer hands a version to a publisher in another process, chunk by chunk; `data` travels
    as the payload frame."""

    PAYLOAD: ClassVar[str] = "data"

    version: Version
    index: Count
    chunks: Count
    digest: str  # the whole version's digest (wire/digest.py)
    data: Payload
    ticket: str = ""  # made with the trainer's key: without the right one the publisher refuses the chunk


class BroadcastJoin(Message, tag="broadcast_join"):
    """A worker asks the publisher to take it into the weight broadcasts (again, after a failure)."""

    worker: str  # the worker's name (its broadcast channel has a name of its own)


class BroadcastJoined(Message, tag="broadcast_joined"):
    """The publisher's answer: broadcasts reach the worker from `from_version` on; earlier ones it pulls."""

    from_version: Version


class BroadcastDropped(Message, tag="broadcast_dropped"):
    """The publisher took the worker out of the broadcasts at `version` (it did not confirm in time):
    it pulls until it has joined again."""

    version: Version


class BroadcastPlan(Message, tag="broadcast_plan"):
    """Version `version` is about to be broadcast in group `generation` (formed anew when it is new):
    join it at `store_host:store_port` as `rank` of `world` and receive the buckets laid out here."""

    version: Version
    generation: Count
    rank: Count
    world: AtLeastOne
    backend: str
    store_host: str
    store_port: Port
    prefix: str
    timeout_s: float
    names: list[str]
    dtypes: list[str]
    shapes: list[list[Count]]
    buckets: list[Count]
    offsets: list[Count]
    sizes: list[Count]
