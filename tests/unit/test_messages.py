"""The wire codec: every message round-trips, and every malformed frame is refused with a reason."""

from __future__ import annotations

import types
import typing
from typing import Any, get_args, get_origin

import msgpack
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cadence.wire.messages import (
    PROTOCOL_VERSION,
    REGISTRY,
    Assignment,
    DecodeError,
    Envelope,
    Heartbeat,
    Message,
    WeightChunk,
    WorkRequest,
    decode,
    decode_frames,
    encode,
    encode_frames,
)


def sample(hint: Any, salt: int = 0) -> Any:
    """A non-default value of type `hint`, varied by `salt` so fields differ from each other."""
    origin = get_origin(hint)
    if hint is Any:
        return {"nested": [1, 2.5, "x", None, b"\x00"]}
    if hint is bool:
        return salt % 2 == 0
    if hint is int:
        return 1000 + salt
    if hint is float:
        return 0.5 + salt
    if hint is str:
        return f"text-{salt}-é"
    if hint is bytes:
        return bytes([salt % 256, 0, 255]) * 3
    if origin is list:
        (item,) = get_args(hint)
        return [sample(item, salt + i) for i in range(3)]
    if origin is dict:
        key, item = get_args(hint)
        return {sample(key, salt): sample(item, salt + 1), sample(key, salt + 7): sample(item, salt + 2)}
    if origin in (typing.Union, types.UnionType):
        return sample(get_args(hint)[0], salt)
    if isinstance(hint, type) and issubclass(hint, msgspec.Struct):  # a struct nested in a message
        hints = typing.get_type_hints(hint)
        return hint(
            **{f.name: sample(hints[f.name], salt + i) for i, f in enumerate(msgspec.structs.fields(hint))}
        )
    raise TypeError(f"no sample for {hint!r}")


def build(cls: type[Message]) -> Message:
    hints = typing.get_type_hints(cls)
    fields = msgspec.structs.fields(cls)
    return cls(**{f.name: sample(hints[f.name], i) for i, f in enumerate(fields)})


def frame(body: Any, **overrides: Any) -> bytes:
    """A raw frame around `body`, as a work_request unless overridden; a key set to ... is left out."""
    raw: dict[str, Any] = {
        "type": "work_request",
        "proto": PROTOCOL_VERSION,
        "run": "r",
        "sender": "w1",
        "body": body,
    }
    raw.update(overrides)
    raw = {k: v for k, v in raw.items() if v is not ...}
    return msgpack.packb(raw, use_bin_type=True)


def refusal(data: bytes, max_bytes: int | None = None) -> DecodeError:
    with pytest.raises(DecodeError) as info:
        decode(data) if max_bytes is None else decode(data, max_bytes)
    return info.value


def test_registry_is_not_empty_and_tags_match() -> None:
    assert {"assignment", "group_result", "weight_chunk", "heartbeat"} <= set(REGISTRY)
    for tag, cls in REGISTRY.items():
        assert tag == cls.TAG


@pytest.mark.parametrize("tag", sorted(REGISTRY))
def test_every_message_round_trips(tag: str) -> None:
    msg = build(REGISTRY[tag])
    env = decode_frames(encode_frames(msg, sender="actor-7", run="run-x"))
    assert env == Envelope(msg, "actor-7", "run-x")
    assert type(env.message) is REGISTRY[tag]


def required_fields(cls: type[Message]) -> list[str]:
    """Required fields of the header's body (a payload travels in a frame of its own)."""
    return [f.name for f in msgspec.structs.fields(cls) if f.required and f.name != cls.PAYLOAD]


@pytest.mark.parametrize("tag", sorted(t for t, c in REGISTRY.items() if required_fields(c)))
def test_every_message_refuses_a_missing_required_field(tag: str) -> None:
    cls = REGISTRY[tag]
    for name in required_fields(cls):
        header, *payload = encode_frames(build(cls), "s")
        raw = msgpack.unpackb(header, raw=False)
        del raw["body"][name]
        with pytest.raises(DecodeError) as info:
            decode_frames([msgpack.packb(raw), *payload])
        err = info.value
        assert f"{tag}: Object missing required field `{name}`" in err.reason
        assert err.type_tag == tag and err.sender == "s"


def test_defaults_fill_in_omitted_optional_fields() -> None:
    env = decode(frame({}, type="heartbeat"))
    assert env.message == Heartbeat()


def test_float_field_accepts_an_int_and_stores_a_float() -> None:
    msg = decode(frame({"version": 1, "digest": "ab", "nbytes": 3}, type="version_ready")).message
    assert msg.metrics == {}  # type: ignore[attr-defined]
    body = msgpack.unpackb(encode(build(REGISTRY["group_result"]), "s"), raw=False)["body"]
    body["gen_s"] = 3
    gen_s = decode(frame(body, type="group_result")).message.gen_s  # type: ignore[attr-defined]
    assert gen_s == 3.0 and isinstance(gen_s, float)


def test_refuses_bytes_that_are_not_msgpack() -> None:
    assert "not msgpack" in refusal(b"\xc1\xc1 not a frame").reason


def test_refuses_a_truncated_frame() -> None:
    assert "not msgpack" in refusal(encode(WorkRequest(3), "s")[:-2]).reason


def test_refuses_a_msgpack_list() -> None:
    err = refusal(msgpack.packb(["work_request", 1, "", "s", {"credits": 1}]))
    assert "list" in err.reason and "not a map" in err.reason


def test_refuses_an_unknown_type() -> None:
    err = refusal(frame({"credits": 1}, type="launch_missiles"))
    assert "unknown message type 'launch_missiles'" in err.reason
    assert err.sender == "w1"


def test_refuses_a_frame_without_type() -> None:
    assert "no string 'type'" in refusal(frame({"credits": 1}, type=...)).reason


@pytest.mark.parametrize(
    "proto", [0, PROTOCOL_VERSION - 1, PROTOCOL_VERSION + 1, str(PROTOCOL_VERSION), None, ...]
)
def test_refuses_a_wrong_protocol_version(proto: Any) -> None:
    err = refusal(frame({"credits": 1}, proto=proto))
    assert "protocol version" in err.reason and f"expected {PROTOCOL_VERSION}" in err.reason
    assert err.type_tag == "work_request"


@pytest.mark.parametrize("proto", [True, float(PROTOCOL_VERSION)])
def test_refuses_a_protocol_version_of_the_wrong_type(proto: Any) -> None:
    refusal(frame({"credits": 1}, proto=proto))


def test_refuses_a_missing_sender() -> None:
    err = refusal(frame({"credits": 1}, sender=...))
    assert "no string 'sender'" in err.reason and err.sender is None


def test_refuses_a_non_string_sender() -> None:
    assert "no string 'sender'" in refusal(frame({"credits": 1}, sender=17)).reason


def test_refuses_a_missing_run_and_a_missing_body() -> None:
    assert "no string 'run'" in refusal(frame({"credits": 1}, run=...)).reason
    assert "no map 'body'" in refusal(frame([1], run="r")).reason


def test_refuses_a_missing_field() -> None:
    err = refusal(frame({}))
    assert "missing required field `credits`" in err.reason


@pytest.mark.parametrize(
    ("tag", "body", "field", "declared", "got"),
    [
        ("work_request", {"credits": "3"}, "credits", "int", "str"),
        ("work_request", {"credits": True}, "credits", "int", "bool"),
        ("work_request", {"credits": 2.0}, "credits", "int", "float"),
        ("shutdown", {"reason": b"bytes"}, "reason", "str", "bytes"),
        ("weight_chunk", {"version": 1, "index": b"0"}, "index", "int", "bytes"),
        (
            "weight_meta",
            {"version": 1, "available": 1, "nbytes": 0, "digest": "", "chunk_bytes": 1, "chunks": 0},
            "available",
            "bool",
            "int",
        ),
        (
            "version_ready",
            {"version": 1, "digest": "", "nbytes": 0, "metrics": [1]},
            "metrics",
            "object",
            "array",
        ),
        pytest.param(
            "consumed",
            {"period": 1, "prompt_ids": [1, "2", 3]},
            "prompt_ids[1]",
            "int",
            "str",
        ),
        pytest.param(
            "consumed",
            {"period": 1, "prompt_ids": [1, False]},
            "prompt_ids[1]",
            "int",
            "bool",
        ),
    ],
)
def test_refuses_a_mistyped_field(
    tag: str, body: dict[str, Any], field: str, declared: str, got: str
) -> None:
    err = refusal(frame(body, type=tag))
    assert err.reason == f"{tag}: Expected `{declared}`, got `{got}` - at `$.{field}`"
    assert err.type_tag == tag and err.sender == "w1"


def test_refuses_a_list_with_an_item_of_the_wrong_type() -> None:
    for items in ([1, "2", 3], [1, False], [[1]]):
        err = refusal(frame({"period": 1, "prompt_ids": items}, type="consumed"))
        assert "at `$.prompt_ids[" in err.reason

    body = msgpack.unpackb(encode(build(REGISTRY["group_result"]), "s"), raw=False)["body"]
    body["logprobs"] = [[0.5], [0.5, "x"]]
    assert "at `$.logprobs[1][1]`" in refusal(frame(body, type="group_result")).reason
    body["logprobs"] = [[0.5]]
    body["rewards"] = 1.0
    assert (
        "Expected `array`, got `float` - at `$.rewards`" in refusal(frame(body, type="group_result")).reason
    )


def sound_body(tag: str) -> dict[str, Any]:
    """The body of a message of type `tag` that decodes, to change one field of."""
    body: dict[str, Any] = msgpack.unpackb(encode_frames(build(REGISTRY[tag]), "s")[0], raw=False)["body"]
    return body


@pytest.mark.parametrize(
    ("tag", "changes", "field", "declared"),
    [
        ("work_request", {"credits": -1}, "credits", "int` >= 0"),
        ("version_ready", {"version": -1}, "version", "int` >= 0"),
        ("version_ready", {"nbytes": -3}, "nbytes", "int` >= 0"),
        ("consumed", {"period": -2}, "period", "int` >= 0"),
        ("weight_chunk_request", {"index": -1}, "index", "int` >= 0"),
        ("eval_result", {"tokens": [3, -1]}, "tokens[1]", "int` >= 0"),
        ("assignment", {"group_size": 0}, "group_size", "int` >= 1"),
        ("group_result", {"completions": [[1, 2, -3]]}, "completions[0][2]", "int` >= 0"),
        ("group_result", {"following": -1}, "following", "int` >= 0"),
        ("broadcast_plan", {"store_port": 1 << 16}, "store_port", "int` <= 65535"),
    ],
)
def test_refuses_a_value_outside_its_declared_range(
    tag: str, changes: dict[str, Any], field: str, declared: str
) -> None:
    err = refusal(frame({**sound_body(tag), **changes}, type=tag))
    assert err.reason.startswith(f"{tag}: Expected `{declared}")
    assert err.reason.endswith(f"at `$.{field}`")
    assert err.type_tag == tag and err.sender == "w1"


def test_refuses_a_body_tagged_as_another_type() -> None:
    err = refusal(frame({"type": "consumed", "credits": 1}))
    assert err.reason == "work_request: Invalid value 'consumed' - at `$.type`"


def test_refuses_an_unknown_extra_field() -> None:
    err = refusal(frame({"credits": 1, "bonus": 2}))
    assert "unknown field `bonus`" in err.reason


def test_refuses_unknown_fields_of_mixed_key_types() -> None:
    refusal(frame({"credits": 1, "extra": 1, b"raw": 2}))


def test_refuses_text_that_is_not_utf8_and_a_malformed_timestamp() -> None:
    not_utf8 = b"\xa1\x80"  # a str of one byte that begins no UTF-8 character
    assert "not msgpack" in refusal(msgpack.packb({"type": None})[:-1] + not_utf8).reason
    err = refusal(frame({"reason": None}, type="shutdown")[:-1] + not_utf8)
    assert err.reason.startswith("shutdown: not msgpack") and err.type_tag == "shutdown"
    bad_timestamp = b"\xd5\xff\x00\x00"  # ext -1 of 2 bytes: no timestamp has that size
    assert refusal(msgpack.packb({"type": None})[:-1] + bad_timestamp).reason
    body = {"version": 1, "digest": "", "nbytes": 0, "metrics": {"x": None}}
    err = refusal(frame(body, type="version_ready")[:-1] + bad_timestamp)
    assert err.reason.startswith("version_ready: ") and "timestamp" in err.reason


@pytest.mark.parametrize("key", ["type", "body"])
def test_refuses_a_frame_nested_too_deep(key: str) -> None:
    deep = b"\x91" * 200_000 + b"\xc0"  # an array in an array in … nil
    err = refusal(msgpack.packb({key: None})[:-1] + deep)
    assert "nested too deep" in err.reason


def test_refuses_an_oversized_frame() -> None:
    data = encode(WorkRequest(1), "s")
    assert decode(data, max_bytes=len(data)).message == WorkRequest(1)
    err = refusal(data, max_bytes=len(data) - 1)
    assert f"frame of {len(data)} bytes exceeds the limit of {len(data) - 1}" in err.reason


# ---------------------------------------------------------------- payload frames


def frames_refusal(frames: list[Any], max_bytes: int = 1 << 20) -> DecodeError:
    with pytest.raises(DecodeError) as info:
        decode_frames(frames, max_bytes)
    return info.value


def chunk_header(body: dict[str, Any] | None = None, **overrides: Any) -> bytes:
    """A weight_chunk header announcing a payload of 4 bytes unless overridden."""
    overrides = {"type": "weight_chunk", "payload": 4, **overrides}
    return frame({"version": 1, "index": 0} if body is None else body, **overrides)


def test_a_payload_travels_uncopied_in_its_own_frame() -> None:
    data = bytes(range(256)) * 4
    view = memoryview(data)[100:300]
    header, payload = encode_frames(WeightChunk(3, 1, view), "s", "r")
    assert payload is view
    raw = msgpack.unpackb(header, raw=False)
    assert raw["payload"] == 200 and raw["body"] == {"type": "weight_chunk", "version": 3, "index": 1}
    env = decode_frames([header, data[100:300]])
    assert env == Envelope(WeightChunk(3, 1, data[100:300]), "s", "r")
    got = env.message.data  # type: ignore[attr-defined]
    assert isinstance(got, memoryview) and got.readonly and bytes(got) == data[100:300]


def test_an_empty_payload_round_trips() -> None:
    env = decode_frames(encode_frames(WeightChunk(0, 0, b""), "s"))
    assert env.message == WeightChunk(0, 0, b"")


def test_encode_refuses_a_message_with_a_payload() -> None:
    with pytest.raises(TypeError, match="encode_frames"):
        encode(WeightChunk(1, 0, b"abcd"), "s")


@pytest.mark.parametrize("size", [0, 3, 5, 4096])
def test_refuses_a_payload_frame_of_another_size_than_announced(size: int) -> None:
    err = frames_refusal([chunk_header(), b"x" * size])
    assert f"payload frame of {size} bytes, the header announced 4" in err.reason
    assert err.type_tag == "weight_chunk" and err.sender == "w1"


def test_refuses_a_payload_frame_over_the_limit() -> None:
    header = chunk_header(payload=100)
    assert decode_frames([header, b"x" * 100], max_bytes=100).message == WeightChunk(1, 0, b"x" * 100)
    err = frames_refusal([header, b"x" * 100], max_bytes=99)
    assert "announces a payload of 100, not a size within 99" in err.reason
    err = frames_refusal([chunk_header(payload=4), b"x" * 100], max_bytes=99)
    assert "payload frame of 100 bytes exceeds the limit of 99" in err.reason


@pytest.mark.parametrize("announced", [None, -1, "4", 4.0, True, 1 << 40, ...])
def test_refuses_a_header_that_announces_no_valid_payload_size(announced: Any) -> None:
    err = frames_refusal([chunk_header(payload=announced), b"abcd"])
    assert "header announces a payload of" in err.reason


def test_refuses_a_payload_message_without_its_payload_frame() -> None:
    assert "expected 2 frames" in frames_refusal([chunk_header()]).reason


def test_refuses_a_payload_inside_the_header_body() -> None:
    err = frames_refusal([chunk_header({"version": 1, "index": 0, "data": b"abcd"}), b"abcd"])
    assert "unknown field `data`" in err.reason


def test_refuses_a_payload_for_a_type_without_one() -> None:
    assert "expected 1 frame, got 2" in frames_refusal([frame({"credits": 1}), b"abcd"]).reason
    err = frames_refusal([frame({"credits": 1}, payload=4)])
    assert "announces a payload" in err.reason


@pytest.mark.parametrize("count", [0, 3])
def test_refuses_a_wrong_number_of_frames(count: int) -> None:
    assert f"got {count}" in frames_refusal([chunk_header(), b"abcd", b"more"][:count]).reason


# ---------------------------------------------------------------- properties

_scalars = (
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text() | st.binary()
)
_values = st.recursive(
    _scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
_field_names = st.sampled_from(sorted({name for c in REGISTRY.values() for name in c.__struct_fields__}))
# Bodies with real field names and arbitrary values, so the schema checks are exercised, not just the envelope.
_bodies = st.dictionaries(_field_names | st.text(max_size=8), _values, max_size=8)
_frames = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(sorted(REGISTRY)) | _values,
        "proto": st.just(PROTOCOL_VERSION) | _values,
        "run": st.text(max_size=4) | _values,
        "sender": st.text(max_size=4) | _values,
        "body": _bodies | _values,
    },
)


def _decodes_or_refuses(data: bytes) -> None:
    try:
        result = decode(data)
    except DecodeError as err:
        assert isinstance(err.reason, str) and err.reason
    else:
        assert isinstance(result, Envelope)
        assert isinstance(result.message, Message)


@settings(max_examples=150, deadline=None, database=None)
@given(st.binary(max_size=256))
def test_arbitrary_bytes_decode_or_refuse(data: bytes) -> None:
    _decodes_or_refuses(data)


@settings(max_examples=150, deadline=None, database=None)
@given(st.dictionaries(st.text(max_size=8), _values, max_size=6))
def test_arbitrary_maps_decode_or_refuse(raw: dict[str, Any]) -> None:
    _decodes_or_refuses(msgpack.packb(raw, use_bin_type=True))


@settings(max_examples=200, deadline=None, database=None)
@given(_frames)
def test_frame_shaped_maps_decode_or_refuse(raw: dict[str, Any]) -> None:
    _decodes_or_refuses(msgpack.packb(raw, use_bin_type=True))


@settings(max_examples=200, deadline=None, database=None)
@given(_frames, st.none() | st.integers(-2, 40) | _values, st.lists(st.binary(max_size=40), max_size=2))
def test_headers_with_payload_frames_decode_or_refuse(
    raw: dict[str, Any], announced: Any, payloads: list[bytes]
) -> None:
    if announced is not None:
        raw = {**raw, "payload": announced}
    header = msgpack.packb(raw, use_bin_type=True)
    try:
        result = decode_frames([header, *payloads], max_bytes=32)
    except DecodeError as err:
        assert isinstance(err.reason, str) and err.reason
    else:
        assert isinstance(result.message, Message)
        assert len(payloads) == (1 if result.message.PAYLOAD else 0)


_i64 = st.integers(-(2**63), 2**63 - 1)
_versions = st.integers(0, 2**63 - 1)  # a version or a period: never negative


@settings(max_examples=100, deadline=None, database=None)
@given(
    st.builds(Assignment, _versions, _versions, _i64, st.text(), st.text(), st.integers(1, 2**63 - 1)),
    st.text(max_size=16),
    st.text(max_size=16),
)
def test_assignments_round_trip_exactly(msg: Assignment, sender: str, run: str) -> None:
    assert decode(encode(msg, sender, run)) == Envelope(msg, sender, run)
