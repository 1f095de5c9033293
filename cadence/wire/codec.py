"""The codec of the wire: the message base, the registry of types, and frames to messages and back.

Invariant: a frame either decodes into exactly one declared message whose every field has its
declared type and lies in its declared range, or raises `DecodeError` saying what was wrong. Nothing
else leaves `decode`.

A message type is a msgspec struct: frozen, tagged with its wire name, refusing unknown fields, with
the range a field's values have by their nature declared on the field (`Annotated[int, Meta(ge=0)]`).
Declaring it registers it under its tag: `class WorkRequest(Message, tag="work_request")`.

A message is one header frame, a msgpack map ``{"type": tag, "proto": PROTOCOL_VERSION, "run": run
id, "sender": actor name, "body": {"type": tag, field: value, …}}``, and for a type that declares a
`PAYLOAD` field (weight chunks) a second, raw frame holding that field's bytes: the header then says
``"payload": n`` and leaves the field out of its body, the second frame must have exactly n bytes,
and both frames are bounded by the same limit. The payload is never copied by the codec: it is sent
from the caller's buffer and decoded as a view of the received frame.

Decoding reads the envelope first, key by key, so that each fault has a reason of its own that names
the type and the sender as soon as they are known; the body, still undecoded, then goes to its type's
typed decoder, which checks every field and every item of every list in one pass in C and names the
first one wrong: "work_request: Expected `int` >= 0 - at `$.credits`". A body over `QUIET_GC_BYTES` is
decoded with the cyclic collector paused: its objects are fresh lists, numbers and strings without a
cycle, and collections started by their allocation would walk them again and again (a 63 MiB group:
1.6-1.9 s with the collector, 0.55 s without, here).

`peek` reads a frame's envelope and the few fields its type declares as its `PROOF` (a group's
period, prompt id and ticket) and skips the rest unread, without building it: a server sizes a frame
by it before it decodes the frame (`cadence.transport.admission`). The message types themselves
are declared in `cadence.wire.messages`, which is where everyone imports both from. This module imports
nothing of cadence.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar, TypeAlias, dataclass_transform

import msgspec

PROTOCOL_VERSION = 8
DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024
QUIET_GC_BYTES = 1 << 20
"""A body larger than this is decoded with the cyclic garbage collector paused."""

Payload: TypeAlias = bytes | memoryview
"""The bytes of an out-of-band field: what the sender hands over (often a view of a larger buffer),
and after decoding a read-only view of the received frame."""


class DecodeError(ValueError):
    """A frame that is not a valid message; `reason` says what was wrong."""

    def __init__(self, reason: str, type_tag: str | None = None, sender: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.type_tag = type_tag
        self.sender = sender


REGISTRY: dict[str, type[Message]] = {}
_BODIES: dict[str, msgspec.msgpack.Decoder[Any]] = {}
"""Each type's body decoder: of the type itself, or of its fields but its payload."""
_PROOFS: dict[str, msgspec.msgpack.Decoder[Any]] = {}
"""Each type's decoder of its `PROOF` fields alone, the others skipped (types that declare some)."""


@dataclass_transform(frozen_default=True, field_specifiers=(msgspec.field,))
class _Declared(msgspec.StructMeta):
    """The metaclass of messages: a struct declared with a `tag` is registered under it."""

    def __new__(
        mcls, name: str, bases: tuple[type, ...], namespace: dict[str, Any], /, **kwargs: Any
    ) -> _Declared:
        cls = super().__new__(mcls, name, bases, namespace, **kwargs)
        if "tag" in kwargs:
            _register(cls, kwargs["tag"])
        return cls


class Message(msgspec.Struct, metaclass=_Declared, frozen=True, forbid_unknown_fields=True, tag_field="type"):
    """Base of all message types: `class Name(Message, tag="name")` declares one under its wire tag.
    A subclass whose `PAYLOAD` names one of its fields (typed `Payload`) carries that field as a frame
    of its own; its `PROOF` names the fields that prove its sender may send it (`peek` reads them)."""

    TAG: ClassVar[str] = ""
    PAYLOAD: ClassVar[str] = ""
    PROOF: ClassVar[tuple[str, ...]] = ()


def _register(cls: Any, tag: object) -> None:
    if not isinstance(tag, str):
        raise TypeError(f"{cls.__name__}: a message's tag is its wire name, a str, not {tag!r}")
    if tag in REGISTRY:
        raise ValueError(f"message tag {tag!r} declared twice")
    body = cls
    fields = {f.name: f for f in msgspec.structs.fields(cls)}
    if cls.PROOF:
        if not set(cls.PROOF) <= set(fields) - {cls.PAYLOAD}:
            raise TypeError(f"{tag}: proof fields {cls.PROOF!r} must be fields of its body")
        proof = [_spec(fields[name]) for name in cls.PROOF]
        _PROOFS[tag] = msgspec.msgpack.Decoder(
            msgspec.defstruct(f"{cls.__name__}Proof", proof, tag=tag, tag_field="type", frozen=True)
        )
    if cls.PAYLOAD:
        if cls.PAYLOAD not in fields or fields[cls.PAYLOAD].type != Payload:
            raise TypeError(f"{tag}: payload field {cls.PAYLOAD!r} must be declared as Payload")
        rest = [_spec(f) for name, f in fields.items() if name != cls.PAYLOAD]
        body = msgspec.defstruct(
            f"{cls.__name__}Body", rest, tag=tag, tag_field="type", frozen=True, forbid_unknown_fields=True
        )
    cls.TAG = tag
    REGISTRY[tag] = cls
    _BODIES[tag] = msgspec.msgpack.Decoder(body)


def _spec(f: msgspec.structs.FieldInfo) -> tuple[str, Any] | tuple[str, Any, Any]:
    """A field of a message as `defstruct` declares it again."""
    if f.default_factory is not msgspec.NODEFAULT:
        return (f.name, f.type, msgspec.field(default_factory=f.default_factory))
    if f.default is not msgspec.NODEFAULT:
        return (f.name, f.type, f.default)
    return (f.name, f.type)


# ---------------------------------------------------------------- codec


@dataclass(frozen=True)
class Envelope:
    """A decoded message with who sent it and for which run."""

    message: Message
    sender: str
    run: str


class _Header(msgspec.Struct):
    """A header frame as received: every key is checked in `decode_frames`, one by one; the body is
    left undecoded until the envelope holds."""

    type: Any = None
    proto: Any = None
    run: Any = None
    sender: Any = None
    body: msgspec.Raw = msgspec.Raw()
    payload: Any = msgspec.UNSET


_HEADER = msgspec.msgpack.Decoder(_Header)
_ENCODER = msgspec.msgpack.Encoder()
_MAP_FORMATS = frozenset({*range(0x80, 0x90), 0xDE, 0xDF})  # fixmap, map 16, map 32


def encode_frames(msg: Message, sender: str, run: str = "") -> list[Payload]:
    """The frames of `msg`: its header, then its payload (not copied) if its type declares one."""
    header: dict[str, Any] = {"type": msg.TAG, "proto": PROTOCOL_VERSION, "run": run, "sender": sender}
    if not msg.PAYLOAD:
        header["body"] = msg
        return [_ENCODER.encode(header)]
    payload: Payload = getattr(msg, msg.PAYLOAD)
    header["body"] = msgspec.structs.replace(msg, **{msg.PAYLOAD: msgspec.UNSET})  # left out
    header["payload"] = payload.nbytes if isinstance(payload, memoryview) else len(payload)
    return [_ENCODER.encode(header), payload]


def encode(msg: Message, sender: str, run: str = "") -> bytes:
    """The one frame of `msg`, of a type without a payload (`encode_frames` takes any message)."""
    frames = encode_frames(msg, sender, run)
    if len(frames) != 1:
        raise TypeError(f"{msg.TAG} carries its {msg.PAYLOAD!r} in a frame of its own: use encode_frames")
    return bytes(frames[0])


def decode(frame: Payload, max_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> Envelope:
    """The message in the single frame `frame`, or `DecodeError` with the reason."""
    return decode_frames([frame], max_bytes)


def decode_frames(frames: Sequence[Payload], max_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> Envelope:
    """The message in `frames` (a header, then a payload where the type declares one), or
    `DecodeError` with the reason. No frame may exceed `max_bytes`."""
    if not 1 <= len(frames) <= 2:
        raise DecodeError(f"expected 1 frame, or 2 with a payload, got {len(frames)}")
    head, tag, sender = _envelope(frames[0], max_bytes)
    cls = REGISTRY[tag]
    body = memoryview(head.body)
    try:
        with _quiet_gc(body.nbytes > QUIET_GC_BYTES):
            msg = _BODIES[tag].decode(body)
    except msgspec.ValidationError as exc:  # names the field: "Expected `int`, got `str` - at `$.credits`"
        raise DecodeError(f"{tag}: {exc}", tag, sender) from None
    except Exception as exc:
        raise DecodeError(f"{tag}: {_not_msgpack(exc)}", tag, sender) from None
    if cls.PAYLOAD:
        data = _payload(head.payload, frames, max_bytes, tag, sender)
        msg = cls(**msgspec.structs.asdict(msg), **{cls.PAYLOAD: data})
    elif len(frames) != 1:
        raise DecodeError(f"{tag}: expected 1 frame, got {len(frames)}", tag, sender)
    elif head.payload is not msgspec.UNSET:
        raise DecodeError(f"{tag}: announces a payload, which this type does not carry", tag, sender)
    return Envelope(msg, sender, head.run)


@dataclass(frozen=True)
class Peek:
    """A header frame's envelope and its type's `PROOF` fields (None for a type without), the rest of
    its body unread."""

    tag: str
    sender: str
    run: str
    proof: Any


def peek(header: Payload, max_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> Peek:
    """What `header` says it is, read without building its body: `DecodeError` where its envelope
    (or its proof fields) would not decode. A frame that peeks well may still fail `decode_frames`."""
    head, tag, sender = _envelope(header, max_bytes)
    proofs = _PROOFS.get(tag)
    if proofs is None:
        return Peek(tag, sender, head.run, None)
    try:
        proof = proofs.decode(head.body)
    except msgspec.ValidationError as exc:
        raise DecodeError(f"{tag}: {exc}", tag, sender) from None
    except Exception as exc:
        raise DecodeError(f"{tag}: {_not_msgpack(exc)}", tag, sender) from None
    return Peek(tag, sender, head.run, proof)


def _envelope(header: Payload, max_bytes: int) -> tuple[_Header, str, str]:
    """The header's envelope, its type's tag and its sender, each checked; its body left undecoded."""
    size = memoryview(header).nbytes
    if size > max_bytes:
        raise DecodeError(f"frame of {size} bytes exceeds the limit of {max_bytes}")
    try:
        head = _HEADER.decode(header)
    except msgspec.ValidationError as exc:  # not a map of str keys (seen before the rest was read), or worse
        raise DecodeError(_shapeless(header, exc)) from None
    except Exception as exc:  # malformed, text that is not UTF-8, nested too deep
        raise DecodeError(_not_msgpack(exc)) from None
    sender = head.sender if isinstance(head.sender, str) else None
    tag = head.type
    if not isinstance(tag, str):
        raise DecodeError("frame has no string 'type'", sender=sender)
    if type(head.proto) is not int or head.proto != PROTOCOL_VERSION:
        raise DecodeError(f"protocol version {head.proto!r}, expected {PROTOCOL_VERSION}", tag, sender)
    if tag not in REGISTRY:
        raise DecodeError(f"unknown message type {tag!r}", tag, sender)
    if sender is None:
        raise DecodeError("frame has no string 'sender'", tag)
    if not isinstance(head.run, str):
        raise DecodeError("frame has no string 'run'", tag, sender)
    body = memoryview(head.body)
    if not body.nbytes or body[0] not in _MAP_FORMATS:
        raise DecodeError("frame has no map 'body'", tag, sender)
    return head, tag, sender


@contextmanager
def _quiet_gc(quiet: bool) -> Iterator[None]:
    """The cyclic collector paused while the block runs, where `quiet` (and it was running)."""
    paused = quiet and gc.isenabled()
    if paused:
        gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()


def _shapeless(header: Payload, exc: msgspec.ValidationError) -> str:
    """Why `header`, which the envelope's decoder refused with `exc`, is refused: it is no msgpack at
    all, or msgpack of another shape (read whole, on this path only, to tell which)."""
    try:
        raw = msgspec.msgpack.decode(header)
    except Exception as err:
        return _not_msgpack(err)
    if not isinstance(raw, dict):
        return f"frame is a msgpack {type(raw).__name__}, not a map"
    keys = sorted({type(k).__name__ for k in raw if not isinstance(k, str)})
    return f"frame is a map with keys of type {', '.join(keys)}, not str" if keys else f"frame: {exc}"


def _not_msgpack(exc: Exception) -> str:
    if isinstance(exc, RecursionError):
        return "not msgpack: nested too deep"
    return f"not msgpack: {type(exc).__name__}: {exc}"


def _payload(announced: Any, frames: Sequence[Payload], max_bytes: int, tag: str, sender: str) -> memoryview:
    if len(frames) != 2:
        raise DecodeError(f"{tag}: expected 2 frames, a header and its payload, got 1", tag, sender)
    if type(announced) is not int or not 0 <= announced <= max_bytes:
        shown = None if announced is msgspec.UNSET else announced
        raise DecodeError(
            f"{tag}: header announces a payload of {shown!r}, not a size within {max_bytes}", tag, sender
        )
    data = memoryview(frames[1]).cast("B")
    if data.nbytes > max_bytes:
        raise DecodeError(
            f"payload frame of {data.nbytes} bytes exceeds the limit of {max_bytes}", tag, sender
        )
    if data.nbytes != announced:
        raise DecodeError(
            f"{tag}: payload frame of {data.nbytes} bytes, the header announced {announced}", tag, sender
        )
    return data.toreadonly()
