"""The direct Produce request decoder (protocol/produce_request.py) gives the same values
and the same refusals as the generic path (walker + kio's reader), for every version.

Frames are built with kio's writer. For the flexible versions (v9+) the body is put
together from kio-written pieces so that an unknown tagged-field section can stand at
each of the four places a Produce body has one (request header, partition, topic,
request). Both decoders run on the same frame: `decode_request(frame)` (direct) and
`decode_request(frame, direct=False)` (generic).
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import struct
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.serial import entity_writer
from kio.static.primitive import Records

from onceflow.protocol.apis import SUPPORTED, ApiKey
from onceflow.protocol.codec import RequestHeader, decode_request, encode_request, request_type
from onceflow.protocol.errors import ProtocolError, UnsupportedVersion
from onceflow.protocol.produce_request import ProduceRequest
from onceflow.protocol.records import SimpleRecord, build_batch
from onceflow.protocol.walker import _encode_uvarint
from tests.protocol.golden import GOLDEN_FRAMES

VERSIONS = range(SUPPORTED[ApiKey.PRODUCE][0], SUPPORTED[ApiKey.PRODUCE][1] + 1)
FLEXIBLE_FROM, TOPIC_ID_FROM = 9, 13
NO_TAGS = b"\x00"
# Two unknown tags (Produce defines none): the decoders must skip both.
UNKNOWN_TAGS = b"\x02" + b"\x07\x03abc" + b"\x81\x01\x00"
CLIENT_ID = "client-é"
# Byte values that corrupt a count, a length or a varint in the interesting ways.
CORRUPTIONS = (0x00, 0x01, 0x7F, 0x80, 0xFF)


uvarint = _encode_uvarint


def kio_bytes(entity: Any) -> bytes:
    out = io.BytesIO()
    entity_writer(type(entity))(out, entity)
    return out.getvalue()


def header_bytes(version: int, header_tags: bytes = NO_TAGS) -> bytes:
    client_id = CLIENT_ID.encode()
    header = struct.pack(">hhih", ApiKey.PRODUCE, version, 42, len(client_id)) + client_id
    return header + header_tags if version >= FLEXIBLE_FROM else header


# ---------------------------------------------------------------- kio bodies


def batch(value: bytes) -> bytes:
    return build_batch([SimpleRecord(b"k", value)], base_timestamp_ms=1_700_000_000_000)


def kio_body(version: int, transactional_id: str | None,
             topics: list[tuple[str, list[tuple[int, bytes | None]]]]) -> Any:
    """A kio ProduceRequest of `version`: topics as (name, [(index, records)])."""
    request_cls = request_type(ApiKey.PRODUCE, version)
    fields = {f.name: f for f in dataclasses.fields(request_cls)}
    topic_cls = fields["topic_data"].type.__args__[0]
    topic_fields = {f.name: f for f in dataclasses.fields(topic_cls)}
    partition_cls = topic_fields["partition_data"].type.__args__[0]
    topic_data = []
    for name, partitions in topics:
        key = ({"topic_id": uuid.uuid5(uuid.NAMESPACE_DNS, name) if name else None}
               if version >= TOPIC_ID_FROM else {"name": name})
        topic_data.append(topic_cls(**key, partition_data=tuple(
            partition_cls(index=index, records=None if records is None else Records(records))
            for index, records in partitions)))
    return request_cls(transactional_id=transactional_id, acks=-1,
                       timeout=datetime.timedelta(milliseconds=30_000),
                       topic_data=tuple(topic_data))


BODIES: dict[str, tuple[str | None, list[tuple[str, list[tuple[int, bytes | None]]]]]] = {
    "one record (librdkafka)": (None, [("t", [(0, batch(b"v"))])]),
    "several topics and partitions": ("txn-1", [
        ("alpha", [(0, batch(b"a0")), (5, None), (2, batch(b"a2" * 50))]),
        ("beta", [(1, batch(b""))]),
        ("gamma", []),
    ]),
    "no topics": (None, []),
    "null records only": ("", [("t", [(0, None), (1, None)])]),
    "long strings": ("x" * 1000 + "é", [("t" * 249, [(i, batch(bytes([i]) * i))
                                                  for i in range(140)])]),
    "zero topic id": (None, [("", [(3, batch(b"z"))])]),  # v13: all-zero uuid, None
}


def kio_frame(version: int, body: Any, tags: tuple[bytes, bytes, bytes, bytes]) -> bytes:
    """The request frame (no size prefix), with `tags` as the header's, each partition's,
    each topic's and the request's tagged-field sections (flexible versions)."""
    if version < FLEXIBLE_FROM:
        header = RequestHeader(ApiKey.PRODUCE, version, 42, CLIENT_ID)
        return encode_request(header, body)[4:]
    header_tags, partition_tags, topic_tags, request_tags = tags
    # kio writes an empty array as count byte 1 and an empty tag section as byte 0, so
    # an entity written without its array ends in b"\x01\x00": cut, then put back.
    prefix = kio_bytes(dataclasses.replace(body, topic_data=()))
    assert prefix.endswith(b"\x01\x00")
    out = [header_bytes(version, header_tags), prefix[:-2], uvarint(len(body.topic_data) + 1)]
    for topic in body.topic_data:
        topic_prefix = kio_bytes(dataclasses.replace(topic, partition_data=()))
        out += [topic_prefix[:-2], uvarint(len(topic.partition_data) + 1)]
        for partition in topic.partition_data:
            written = kio_bytes(partition)
            assert written.endswith(NO_TAGS)
            out += [written[:-1], partition_tags]
        out.append(topic_tags)
    out.append(request_tags)
    return b"".join(out)


TAG_PLACES = {
    "no tags": (NO_TAGS,) * 4,
    "header": (UNKNOWN_TAGS, NO_TAGS, NO_TAGS, NO_TAGS),
    "partition": (NO_TAGS, UNKNOWN_TAGS, NO_TAGS, NO_TAGS),
    "topic": (NO_TAGS, NO_TAGS, UNKNOWN_TAGS, NO_TAGS),
    "request": (NO_TAGS, NO_TAGS, NO_TAGS, UNKNOWN_TAGS),
    "everywhere": (UNKNOWN_TAGS,) * 4,
}


def frames() -> list[tuple[str, int, bytes]]:
    cases = []
    for version in VERSIONS:
        for body_name, (transactional_id, topics) in BODIES.items():
            body = kio_body(version, transactional_id, topics)
            places = TAG_PLACES if version >= FLEXIBLE_FROM else {"no tags": TAG_PLACES["no tags"]}
            for place, tags in places.items():
                cases.append((f"v{version}-{body_name}-{place}", version,
                              kio_frame(version, body, tags)))
    return cases


FRAMES = frames()


# ---------------------------------------------------------------- comparing


def field_names(entity: Any) -> tuple[str, ...]:
    if dataclasses.is_dataclass(entity):
        return tuple(f.name for f in dataclasses.fields(entity))
    return entity._fields  # the direct decoder's classes: kio's names, in kio's order


def plain(value: Any) -> Any:
    """A body as nested (name, value) pairs, records as bytes: field by field."""
    if isinstance(value, memoryview):
        return ("records", bytes(value))
    if isinstance(value, bytes):
        return ("records", value)
    if isinstance(value, tuple):
        return tuple(plain(element) for element in value)
    if dataclasses.is_dataclass(value) or hasattr(value, "_fields"):
        return tuple((name, plain(getattr(value, name))) for name in field_names(value))
    return value


def outcome(frame: bytes | bytearray, direct: bool) -> tuple[str, Any]:
    try:
        body = decode_request(frame, direct=direct).body
    except ProtocolError:
        return ("ProtocolError", None)
    except UnsupportedVersion:  # a mutated header
        return ("UnsupportedVersion", None)
    return ("ok", plain(body))


def has_null_array(value: Any) -> bool:
    """kio reads a null (count -1) topic_data or partition_data as None; the direct
    decoder refuses it, as Kafka's reader does (the module docstring)."""
    names = field_names(value)
    if "topic_data" in names:
        return value.topic_data is None or any(has_null_array(t) for t in value.topic_data)
    return value.partition_data is None


def assert_same_outcome(frame: bytes | bytearray) -> None:
    direct, generic = outcome(frame, True), outcome(frame, False)
    if direct != generic and generic[0] == "ok":
        assert direct[0] == "ProtocolError"
        assert has_null_array(decode_request(frame, direct=False).body)
        return
    assert direct == generic


# ---------------------------------------------------------------- values


@pytest.mark.parametrize(("name", "version", "frame"), FRAMES, ids=[c[0] for c in FRAMES])
def test_same_values_as_the_generic_path(name: str, version: int, frame: bytes) -> None:
    buffer = bytearray(frame)  # large frames arrive in pooled bytearrays
    request = decode_request(buffer)
    generic = decode_request(buffer, direct=False)
    assert request.header == generic.header
    body = request.body
    assert isinstance(body, ProduceRequest)  # the hook is in place
    assert plain(body) == plain(generic.body)
    assert body == generic.body and generic.body == body
    # The same attribute names, entity by entity (v13 topics have no `name`).
    assert field_names(body) == field_names(generic.body)
    for ours, theirs in zip(body.topic_data, generic.body.topic_data, strict=True):
        assert field_names(ours) == field_names(theirs)
        assert hasattr(ours, "name") == (version < TOPIC_ID_FROM)
        for partition, reference in zip(ours.partition_data, theirs.partition_data, strict=True):
            assert field_names(partition) == field_names(reference)
            if partition.records is not None:  # a read-only view of the frame, no copy
                assert isinstance(partition.records, memoryview)
                assert partition.records.obj is buffer and partition.records.readonly


GOLDEN_PRODUCE = {name: frame for name, frame in GOLDEN_FRAMES.items() if "produce" in name}


@pytest.mark.parametrize("name", sorted(GOLDEN_PRODUCE))
def test_frames_of_real_clients(name: str) -> None:
    """librdkafka, kafka-python and aiokafka bytes: same values; every truncation and
    corrupted byte gives the same outcome both ways."""
    frame = GOLDEN_PRODUCE[name]
    body = decode_request(frame).body
    assert isinstance(body, ProduceRequest)
    assert plain(body) == plain(decode_request(frame, direct=False).body)
    for cut in range(len(frame)):
        assert_same_outcome(frame[:cut])
    for position in range(len(frame)):
        for value in CORRUPTIONS:
            assert_same_outcome(frame[:position] + bytes([value]) + frame[position + 1:])


@pytest.mark.parametrize("version", VERSIONS)
def test_bytes_after_the_body_are_ignored(version: int) -> None:
    frame = kio_frame(version, kio_body(version, "t", [("t", [(0, batch(b"v"))])]),
                      TAG_PLACES["everywhere"])
    assert plain(decode_request(frame + b"\x05\xff\x00").body) == plain(
        decode_request(frame).body)


@pytest.mark.parametrize("version", VERSIONS)
def test_null_arrays_are_refused_as_kafka_does(version: int) -> None:
    flexible = version >= FLEXIBLE_FROM
    null_count = b"\x00" if flexible else b"\xff\xff\xff\xff"
    body = kio_body(version, None, [])
    prefix = kio_bytes(body)[:-2] if flexible else kio_bytes(body)[:-4]
    null_topics = header_bytes(version) + prefix + null_count + (NO_TAGS if flexible else b"")
    with pytest.raises(ProtocolError, match="null in a non-nullable field"):
        decode_request(null_topics, direct=False)  # the walker refuses it too
    with pytest.raises(ProtocolError, match="topic_data count -1"):
        decode_request(null_topics)
    topic = kio_body(version, None, [("t", [])])
    written = kio_bytes(topic)
    null_partitions = written[:-3] + b"\x00" + written[-2:] if flexible else (
        written[:-4] + null_count)
    null_partitions = header_bytes(version) + null_partitions
    with pytest.raises(ProtocolError, match="null in a non-nullable field"):
        decode_request(null_partitions, direct=False)
    with pytest.raises(ProtocolError, match="partition_data count -1"):
        decode_request(null_partitions)


# ---------------------------------------------------------------- refusals


# Truncations: tags nowhere or everywhere (a place alone adds nothing to refuse).
SMALL_FRAMES = [case for case in FRAMES if "long strings" not in case[0]
                and case[0].endswith(("-no tags", "-everywhere"))]


@pytest.mark.parametrize(("name", "version", "frame"), SMALL_FRAMES,
                         ids=[c[0] for c in SMALL_FRAMES])
def test_every_truncation_is_refused_by_both(name: str, version: int, frame: bytes) -> None:
    body_start = len(header_bytes(version, TAG_PLACES[name.rsplit("-", 1)[1]][0]))
    for cut in range(body_start, len(frame)):
        assert outcome(frame[:cut], True) == outcome(frame[:cut], False) == (
            "ProtocolError", None), cut


# Corruptions: flexible versions with tags everywhere (every kind of field present).
CORRUPTED_FRAMES = [case for case in SMALL_FRAMES
                    if ("several" in case[0] or "one record" in case[0])
                    and (case[1] < FLEXIBLE_FROM or case[0].endswith("-everywhere"))]


@pytest.mark.parametrize(("name", "version", "frame"), CORRUPTED_FRAMES,
                         ids=[c[0] for c in CORRUPTED_FRAMES])
def test_corrupted_bytes_give_the_same_outcome(name: str, version: int, frame: bytes) -> None:
    """Every byte of the body (records excepted: opaque to both) set to each corruption."""
    body_start = len(header_bytes(version, UNKNOWN_TAGS if name.endswith("everywhere")
                                  else NO_TAGS))
    opaque = set()  # the record bytes (their lengths are corrupted like any field)
    for topic in decode_request(frame).body.topic_data:
        for partition in topic.partition_data:
            if partition.records is not None:
                start = frame.index(bytes(partition.records), body_start)
                opaque.update(range(start, start + len(partition.records)))
    for position in sorted(set(range(body_start, len(frame))) - opaque):
        for value in CORRUPTIONS:
            corrupted = bytearray(frame)
            corrupted[position] = value
            assert_same_outcome(bytes(corrupted))


st.register_type_strategy(Records, st.binary(max_size=32).map(Records))


@st.composite
def mutated_produce_frames(draw: st.DrawFn) -> bytes:
    version = draw(st.sampled_from(VERSIONS))
    body = draw(st.from_type(request_type(ApiKey.PRODUCE, version)))
    tags = tuple(draw(st.sampled_from((NO_TAGS, UNKNOWN_TAGS))) for _ in range(4))
    frame = bytearray(kio_frame(version, body, tags))  # type: ignore[arg-type]
    for _ in range(draw(st.integers(0, 3))):
        position = draw(st.integers(0, len(frame)))
        patch = draw(st.binary(min_size=1, max_size=5) | st.sampled_from(
            [b"\xff\xff\xff\xff", b"\x7f\xff\xff\xff", b"\x80\x80\x80\x80\x80\x01"]))
        if draw(st.booleans()):
            frame[position:position + len(patch)] = patch
        else:
            frame[position:position] = patch
    return bytes(frame[:draw(st.integers(0, len(frame)))] if draw(st.booleans()) else frame)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_produce_frames())
def test_generated_and_mutated_frames_give_the_same_outcome(frame: bytes) -> None:
    assert_same_outcome(frame)
