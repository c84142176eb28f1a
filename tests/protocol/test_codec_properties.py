"""Hypothesis: round trips over every advertised version, and fuzzing that only
ProtocolError / UnsupportedVersion ever escape the decoder."""

from __future__ import annotations

import contextlib
import datetime
import struct
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.serial import entity_reader
from kio.static.primitive import Records, i64Timedelta

from onceflow.protocol import codec
from onceflow.protocol.apis import SUPPORTED, ApiKey
from onceflow.protocol.codec import (
    RequestHeader,
    decode_request,
    encode_request,
    encode_response,
    request_type,
    response_type,
)
from onceflow.protocol.errors import ProtocolError, UnsupportedVersion
from tests.protocol.golden import GOLDEN_FRAMES

st.register_type_strategy(Records, st.binary(max_size=64).map(Records))
# kio decodes an int64 duration through microseconds in an int64, so only |ms| below
# 2**63 // 1000 (about 292,000 years) round-trips, while its own strategy draws up to
# timedelta.max. OffsetCommit v2-v4 retention_time is the advertised field of that type.
I64_TIMEDELTA_MS_MAX = 2**63 // 1000 - 1
st.register_type_strategy(i64Timedelta, st.integers(
    -I64_TIMEDELTA_MS_MAX, I64_TIMEDELTA_MS_MAX).map(
        lambda ms: i64Timedelta.parse(datetime.timedelta(milliseconds=ms))))

ADVERTISED = sorted(
    (int(api_key), version)
    for api_key, (low, high) in SUPPORTED.items()
    for version in range(low, high + 1)
)
SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

headers = st.builds(
    RequestHeader,
    api_key=st.just(0),
    api_version=st.just(0),
    correlation_id=st.integers(-(2**31), 2**31 - 1),
    client_id=st.none() | st.text(max_size=20),
)


@st.composite
def requests(draw: st.DrawFn) -> tuple[RequestHeader, Any]:
    api_key, version = draw(st.sampled_from(ADVERTISED))
    header = draw(headers)
    header = RequestHeader(api_key, version, header.correlation_id, header.client_id)
    return header, draw(st.from_type(request_type(api_key, version)))


@st.composite
def responses(draw: st.DrawFn) -> tuple[RequestHeader, Any]:
    api_key, version = draw(st.sampled_from(ADVERTISED))
    correlation_id = draw(st.integers(-(2**31), 2**31 - 1))
    header = RequestHeader(api_key, version, correlation_id, None)
    return header, draw(st.from_type(response_type(api_key, version)))


@SETTINGS
@given(requests())
def test_request_round_trip(request: tuple[RequestHeader, Any]) -> None:
    header, body = request
    frame = encode_request(header, body)
    assert struct.unpack_from(">i", frame)[0] == len(frame) - 4
    decoded = decode_request(frame[4:])
    assert decoded.header == header
    assert decoded.body == body
    # Large frames arrive in (writable) pooled bytearrays: the same decoding.
    assert decode_request(bytearray(frame[4:])).body == body


@SETTINGS
@given(responses())
def test_response_round_trip(response: tuple[RequestHeader, Any]) -> None:
    header, body = response
    frame = encode_response(header, body)
    size, correlation_id = struct.unpack_from(">ii", frame)
    assert (size, correlation_id) == (len(frame) - 4, header.correlation_id)
    offset = 8
    if type(body).__flexible__ and header.api_key != ApiKey.API_VERSIONS:
        assert frame[offset] == 0  # response header v1: no tagged fields
        offset += 1
    decoded, body_size = entity_reader(type(body))(frame, offset)
    assert decoded == body
    assert offset + body_size == len(frame)
    # The bounds walker agrees with kio on responses too, whose schemas have the
    # shapes requests lack (tagged structs, nullable structs).
    edits: list[tuple[int, int, bytes]] = []
    view = memoryview(frame)
    assert codec._walk_entity(codec._shape(type(body)), view, offset, len(view), edits) == len(
        frame
    )
    assert edits == []


def decode_only_protocol_errors(frame: bytes) -> None:
    with contextlib.suppress(ProtocolError, UnsupportedVersion):
        decode_request(frame)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_random_bytes(frame: bytes) -> None:
    decode_only_protocol_errors(frame)


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(ADVERTISED), st.binary(max_size=200))
def test_fuzz_random_body_behind_a_valid_header(api_version: tuple[int, int], body: bytes) -> None:
    api_key, version = api_version
    header = struct.pack(">hhih", api_key, version, 1, 1) + b"c"
    flexible = request_type(api_key, version).__flexible__
    decode_only_protocol_errors(header + (b"\x00" if flexible else b"") + body)


mutations = st.lists(
    st.tuples(
        st.sampled_from(["flip", "insert", "delete", "overwrite", "truncate"]),
        st.integers(min_value=0, max_value=10_000),
        st.binary(min_size=1, max_size=6)
        | st.sampled_from([b"\xff\xff\xff\xff\x0f", b"\x7f\xff\xff\xff", b"\x80\x80\x80\x80"]),
    ),
    min_size=1,
    max_size=4,
)


def mutate(frame: bytes, edits: list[tuple[str, int, bytes]]) -> bytes:
    data = bytearray(frame)
    for kind, raw_position, patch in edits:
        position = raw_position % (len(data) + 1)
        if kind == "flip" and position < len(data):
            data[position] ^= patch[0] or 0x01
        elif kind == "insert":
            data[position:position] = patch
        elif kind == "delete":
            del data[position : position + len(patch)]
        elif kind == "overwrite":
            data[position : position + len(patch)] = patch
        elif kind == "truncate":
            del data[position:]
    return bytes(data)


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(sorted(GOLDEN_FRAMES.values())), mutations)
def test_fuzz_mutated_golden_frames(frame: bytes, edits: list[tuple[str, int, bytes]]) -> None:
    decode_only_protocol_errors(mutate(frame, edits))


@SETTINGS
@given(requests(), mutations)
def test_fuzz_mutated_generated_frames(
    request: tuple[RequestHeader, Any], edits: list[tuple[str, int, bytes]]
) -> None:
    header, body = request
    decode_only_protocol_errors(mutate(encode_request(header, body)[4:], edits))


# ------------------------------------------ Produce records are views, not copies


def kio_decode(frame: bytes | bytearray) -> Any:
    """kio's own decoding of a request frame's body, records copied (the reference)."""
    header = decode_request(frame).header
    body_start = 8 + 2 + len((header.client_id or "").encode())
    if request_type(header.api_key, header.api_version).__flexible__:
        body_start += 1  # an empty tagged-field section (encode_request writes no tags)
    body, _size = entity_reader(request_type(header.api_key, header.api_version))(
        bytes(frame), body_start
    )
    return body


def records_fields(body: Any) -> list[Any]:
    return [p.records for topic in body.topic_data for p in topic.partition_data]


produce_versions = st.integers(*SUPPORTED[ApiKey.PRODUCE])


@st.composite
def produce_requests(draw: st.DrawFn) -> tuple[RequestHeader, Any]:
    version = draw(produce_versions)
    header = RequestHeader(ApiKey.PRODUCE, version, draw(st.integers(0, 2**31 - 1)), "p")
    return header, draw(st.from_type(request_type(ApiKey.PRODUCE, version)))


@SETTINGS
@given(produce_requests())
def test_produce_decodes_as_kio_does_with_records_as_views_of_the_frame(
    request: tuple[RequestHeader, Any],
) -> None:
    header, body = request
    frame = bytearray(encode_request(header, body)[4:])
    decoded = decode_request(frame).body
    reference = kio_decode(frame)
    assert decoded == reference == body
    for ours, theirs in zip(records_fields(decoded), records_fields(reference), strict=True):
        if theirs is None:
            assert ours is None
        else:
            assert isinstance(ours, memoryview) and ours.obj is frame  # no copy
            assert bytes(ours) == theirs


@SETTINGS
@given(produce_requests(), st.data())
def test_produce_records_survive_unknown_tagged_fields(
    request: tuple[RequestHeader, Any], data: st.DataObject
) -> None:
    """Records cut out and unknown tags cut out in the same body: both edits apply."""
    header, body = request
    if not request_type(header.api_key, header.api_version).__flexible__:
        return
    frame = encode_request(header, body)[4:]
    # The request's own tagged-field section is the last byte (an empty one): give
    # it an unknown tag, which kio would refuse and the walker drops.
    tag_value = data.draw(st.binary(max_size=8))
    tagged = b"\x01" + bytes([99, len(tag_value)]) + tag_value
    decoded = decode_request(frame[:-1] + tagged).body
    assert decoded == body
