"""The codec of the wire: the message base, the registry of types, and frames to messages and back.

Invariant: a frame either decodes into exactly one declared message whose every field has its
declared type, or raises `DecodeError` saying what was wrong. Nothing else leaves `decode`.

A message is one header frame, a msgpack map ``{"type": tag, "proto": PROTOCOL_VERSION, "run": run
id, "sender": actor name, "body": {field: value}}``, and for a type that declares a `PAYLOAD` field
(weight chunks) a second, raw frame holding that field's bytes: the header then says
``"payload": n`` and leaves the field out of its body, the second frame must have exactly n bytes,
and both frames are bounded by the same limit. The payload is never copied by the codec: it is sent
from the caller's buffer and decoded as a view of the received frame. The message types themselves
are declared in `cadence.wire.messages`, which is where everyone imports both from. This module imports
nothing of cadence.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeAlias, TypeVar, get_args, get_origin

import msgpack

PROTOCOL_VERSION = 3
DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024

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


class Message:
    """Base of all message types; subclasses are frozen dataclasses with a `TAG`. A subclass whose
    `PAYLOAD` names one of its fields (typed `Payload`) carries that field as a frame of its own."""

    TAG: ClassVar[str] = ""
    PAYLOAD: ClassVar[str] = ""


M = TypeVar("M", bound=type[Message])
REGISTRY: dict[str, type[Message]] = {}


def message(tag: str) -> typing.Callable[[M], M]:
    """Declare a message type under `tag` (once)."""

    def register(cls: M) -> M:
        if tag in REGISTRY:
            raise ValueError(f"message tag {tag!r} declared twice")
        if cls.PAYLOAD and typing.get_type_hints(cls).get(cls.PAYLOAD) != Payload:
            raise TypeError(f"{tag}: payload field {cls.PAYLOAD!r} must be declared as Payload")
        cls.TAG = tag
        REGISTRY[tag] = cls
        return cls

    return register


# ---------------------------------------------------------------- codec


@dataclass(frozen=True)
class Envelope:
    """A decoded message with who sent it and for which run."""

    message: Message
    sender: str
    run: str


def encode_frames(msg: Message, sender: str, run: str = "") -> list[Payload]:
    """The frames of `msg`: its header, then its payload (not copied) if its type declares one."""
    body = {f.name: getattr(msg, f.name) for f in dataclasses.fields(msg)}  # type: ignore[arg-type]
    frame: dict[str, Any] = {"type": msg.TAG, "proto": PROTOCOL_VERSION, "run": run, "sender": sender}
    if not msg.PAYLOAD:
        return [msgpack.packb({**frame, "body": body}, use_bin_type=True)]
    payload = body.pop(msg.PAYLOAD)
    frame["payload"] = payload.nbytes if isinstance(payload, memoryview) else len(payload)
    return [msgpack.packb({**frame, "body": body}, use_bin_type=True), payload]


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
    header = frames[0]
    if len(header) > max_bytes:
        raise DecodeError(f"frame of {len(header)} bytes exceeds the limit of {max_bytes}")
    try:
        raw = msgpack.unpackb(header, raw=False, strict_map_key=True)
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
    kwargs = _fields(cls, body, tag, sender)
    if cls.PAYLOAD:
        kwargs[cls.PAYLOAD] = _payload(raw.get("payload"), frames, max_bytes, tag, sender)
    elif len(frames) != 1:
        raise DecodeError(f"{tag}: expected 1 frame, got {len(frames)}", tag, sender)
    elif "payload" in raw:
        raise DecodeError(f"{tag}: announces a payload, which this type does not carry", tag, sender)
    return Envelope(cls(**kwargs), sender, run)


def _payload(announced: Any, frames: Sequence[Payload], max_bytes: int, tag: str, sender: str) -> memoryview:
    if len(frames) != 2:
        raise DecodeError(f"{tag}: expected 2 frames, a header and its payload, got 1", tag, sender)
    if type(announced) is not int or not 0 <= announced <= max_bytes:
        raise DecodeError(
            f"{tag}: header announces a payload of {announced!r}, not a size within {max_bytes}", tag, sender
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


def _fields(cls: type[Message], body: dict[str, Any], tag: str, sender: str) -> dict[str, Any]:
    """The body's values by field name, each checked against its declared type; the payload field
    is not in the body."""
    hints = _hints(cls)
    declared = [f for f in dataclasses.fields(cls) if f.name != cls.PAYLOAD]  # type: ignore[arg-type]
    kwargs: dict[str, Any] = {}
    for f in declared:
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
    extra = set(body) - {f.name for f in declared}
    if extra:
        raise DecodeError(f"{tag}: unknown fields {sorted(map(str, extra))}", tag, sender)
    return kwargs


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
