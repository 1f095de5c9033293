"""The wire contract: every message type, its fields, and the one codec.

Invariant: a frame either decodes into exactly one declared message whose every field has its
declared type, or raises `DecodeError` saying what was wrong. Nothing else leaves `decode`.

A frame is a msgpack map ``{"type": tag, "proto": PROTOCOL_VERSION, "run": run id,
"sender": actor name, "body": {field: value}}``. Tensors never travel here as pickles: weights
are safetensors bytes inside `WeightChunk`. This module imports nothing of cadence.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar, get_args, get_origin

import msgpack

PROTOCOL_VERSION = 1
DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024


class DecodeError(ValueError):
    """A frame that is not a valid message; `reason` says what was wrong."""

    def __init__(self, reason: str, type_tag: str | None = None, sender: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.type_tag = type_tag
        self.sender = sender


class Message:
    """Base of all message types; subclasses are frozen dataclasses with a `TAG`."""

    TAG: ClassVar[str] = ""


M = TypeVar("M", bound=type[Message])
REGISTRY: dict[str, type[Message]] = {}


def message(tag: str) -> typing.Callable[[M], M]:
    """Declare a message type under `tag` (once)."""

    def register(cls: M) -> M:
        if tag in REGISTRY:
            raise ValueError(f"message tag {tag!r} declared twice")
        cls.TAG = tag
        REGISTRY[tag] = cls
        return cls

    return register


# ---------------------------------------------------------------- roster and liveness


@message("register")
@dataclass(frozen=True)
class Register(Message):
    """An actor announces itself to the dispatcher. `address` is where it serves, if it does."""

    role: str
    address: str = ""
    pid: int = 0
    host: str = ""


@message("welcome")
@dataclass(frozen=True)
class Welcome(Message):
    """The dispatcher's answer to a rollout worker: where the trainer and publisher are."""

    trainer_address: str
    publisher_address: str
    version: int


@message("heartbeat")
@dataclass(frozen=True)
class Heartbeat(Message):
    """I am alive. Sent every `transport.heartbeat_s` in both directions."""

    role: str = ""


@message("shutdown")
@dataclass(frozen=True)
class Shutdown(Message):
    """The run is over (or failed): stop after finishing nothing further."""

    reason: str


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
    """Generate `group_size` completions of one prompt with weights `version`."""

    period: int
    version: int
    prompt_id: int
    prompt: str
    answer: str
    group_size: int


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


@message("consumed")
@dataclass(frozen=True)
class Consumed(Message):
    """The trainer has taken these prompt groups of `period` into the gradient."""

    period: int
    prompt_ids: list[int]


@message("version_ready")
@dataclass(frozen=True)
class VersionReady(Message):
    """Weights `version` are published; period `version` may start. Carries the last period's metrics."""

    version: int
    sha256: str
    nbytes: int
    metrics: dict[str, Any] = field(default_factory=dict)


@message("run_done")
@dataclass(frozen=True)
class RunDone(Message):
    """The trainer has finished the last period and saved the final weights."""

    version: int
    sha256: str
    checkpoint: str


# ---------------------------------------------------------------- weights


@message("weight_query")
@dataclass(frozen=True)
class WeightQuery(Message):
    """Ask the publisher for the size and checksum of `version`."""

    version: int


@message("weight_meta")
@dataclass(frozen=True)
class WeightMeta(Message):
    """`available` False: the publisher does not hold that version (any more)."""

    version: int
    available: bool
    nbytes: int
    sha256: str
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
    version: int
    index: int
    data: bytes


@message("weight_upload")
@dataclass(frozen=True)
class WeightUpload(Message):
    """The trainer hands a version to a publisher in another process, chunk by chunk."""

    version: int
    index: int
    chunks: int
    sha256: str
    data: bytes


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


# ---------------------------------------------------------------- codec


@dataclass(frozen=True)
class Envelope:
    """A decoded message with who sent it and for which run."""

    message: Message
    sender: str
    run: str


def encode(msg: Message, sender: str, run: str = "") -> bytes:
    """One frame for `msg`."""
    body = {f.name: getattr(msg, f.name) for f in dataclasses.fields(msg)}  # type: ignore[arg-type]
    frame = {"type": msg.TAG, "proto": PROTOCOL_VERSION, "run": run, "sender": sender, "body": body}
    return msgpack.packb(frame, use_bin_type=True)


def decode(frame: bytes, max_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> Envelope:
    """The message in `frame`, or `DecodeError` with the reason."""
    if len(frame) > max_bytes:
        raise DecodeError(f"frame of {len(frame)} bytes exceeds the limit of {max_bytes}")
    try:
        raw = msgpack.unpackb(frame, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated exception types
        raise DecodeError(f"not msgpack: {type(exc).__name__}: {exc}") from None
    if not isinstance(raw, dict):
        raise DecodeError(f"frame is a msgpack {type(raw).__name__}, not a map")
    sender = raw.get("sender")
    sender = sender if isinstance(sender, str) else None
    tag = raw.get("type")
    if not isinstance(tag, str):
        raise DecodeError("frame has no string 'type'", sender=sender)
    proto = raw.get("proto")
    if type(proto) is not int or proto != PROTOCOL_VERSION:
        raise DecodeError(f"protocol version {raw.get('proto')!r}, expected {PROTOCOL_VERSION}", tag, sender)
    cls = REGISTRY.get(tag)
    if cls is None:
        raise DecodeError(f"unknown message type {tag!r}", tag, sender)
    if sender is None:
        raise DecodeError("frame has no string 'sender'", tag)
    run = raw.get("run")
    if not isinstance(run, str):
        raise DecodeError("frame has no string 'run'", tag, sender)
    body = raw.get("body")
    if not isinstance(body, dict):
        raise DecodeError("frame has no map 'body'", tag, sender)
    return Envelope(_build(cls, body, tag, sender), sender, run)


def _build(cls: type[Message], body: dict[str, Any], tag: str, sender: str) -> Message:
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name not in body:
            has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
            if has_default:
                continue
            raise DecodeError(f"{tag}: missing field {f.name!r}", tag, sender)
        value = body[f.name]
        if not _matches(value, hints[f.name]):
            raise DecodeError(
                f"{tag}: field {f.name!r} should be {_name(hints[f.name])}, got {type(value).__name__}",
                tag,
                sender,
            )
        kwargs[f.name] = float(value) if hints[f.name] is float else value
    extra = set(body) - {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    if extra:
        raise DecodeError(f"{tag}: unknown fields {sorted(map(str, extra))}", tag, sender)
    return cls(**kwargs)


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _matches(value: Any, hint: Any) -> bool:
    origin = get_origin(hint)
    if hint is Any:
        return True
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint in (str, bytes, bool):
        return isinstance(value, hint)
    if origin is list:
        (item,) = get_args(hint)
        return isinstance(value, list) and all(_matches(v, item) for v in value)
    if origin is dict:
        key, item = get_args(hint)
        return isinstance(value, dict) and all(
            _matches(k, key) and _matches(v, item) for k, v in value.items()
        )
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, a) for a in get_args(hint))
    if hint is type(None):
        return value is None
    raise TypeError(f"unsupported field type {hint!r}")


def _name(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint)
