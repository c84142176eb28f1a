"""A direct decoder of Produce request bodies (v3-v13), for the small-request hot path.

Theory of operation. The generic way to decode a request (codec.py) walks the body
once to check its bounds (walker.py), hands a copy of it without the records to kio's
reader, then rebuilds the kio entities around views of the records. For a one-record
Produce that was about a quarter of the broker's CPU per request (cProfile, issue 19).
A Produce body has a small fixed shape, so `decode_produce_request` reads it in one
pass with `struct`, straight from the frame, into the light classes below.

Same values, same refusals as the generic path, which
tests/protocol/test_produce_request.py checks for every version, byte-for-byte
truncations and corrupted counts and lengths included:

- every length and count is checked against the bytes left before anything is read or
  allocated (an array of n entries needs at least n bytes: Kafka's rule and the
  walker's), so a peer's numbers never size an allocation;
- unknown tagged fields are skipped (KIP-482; Produce defines none in any version);
- strings are strict UTF-8 (kio refuses invalid bytes; so does Kafka's reader);
  transactional_id may be null, a topic name may not (kio: UnexpectedNull);
- records stay views of the frame, null when the client sent null, as walker.py's
  "Records are not copied" describes: the frame must outlive the request;
- a v13 topic_id of sixteen zero bytes reads as None, as kio reads it;
- bytes after the body are ignored, as decode_request does.

One deliberate difference: a null topic_data or partition_data array (count -1) is a
ProtocolError here, as in Kafka's generated reader ("non-nullable field ... was
serialized as null"); kio reads it as None, which the Produce handler cannot iterate.

The classes carry exactly the attributes of kio's entities of the same version (v13
topics have topic_id and no name: handlers tell the versions apart with `hasattr`), and
compare equal to a kio entity with the same field values, so code and tests written
against kio's classes read them unchanged.
"""

from __future__ import annotations

import dataclasses
import datetime
import struct
import uuid

from onceflow.protocol.errors import ProtocolError
from onceflow.protocol.walker import _read_uvarint

FIRST_VERSION, LAST_VERSION = 3, 13
_FLEXIBLE_FROM = 9   # compact strings, arrays and bytes; tagged fields
_TOPIC_ID_FROM = 13  # topics named by id

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_ACKS_TIMEOUT = struct.Struct(">hi")          # acks int16, timeout_ms int32
_ACKS_TIMEOUT_COUNT = struct.Struct(">hii")   # ... and the int32 topic count (v3-v8)
_INDEX_LENGTH = struct.Struct(">ii")          # partition index, int32 records length (v3-v8)
_UUID_BYTES = 16
_NULL_UUID = bytes(_UUID_BYTES)
# Timeouts remembered as timedelta values (immutable): peers choose them, so the cache is
# bounded; clients use one or a few (librdkafka's request.timeout.ms, 30 s by default).
_TIMEOUTS: dict[int, datetime.timedelta] = {}
_TIMEOUTS_MAX = 64


class _Entity:
    """Slotted value object with kio's field names (`_fields`, in kio's order); equal to
    an entity of the same field names (kio's dataclass of that version) holding equal
    values."""

    __slots__ = ()
    _fields: tuple[str, ...] = ()

    def __eq__(self, other: object) -> bool:
        if _field_names(other) != self._fields:
            return NotImplemented
        return all(getattr(self, name) == getattr(other, name) for name in self._fields)

    __hash__ = None  # type: ignore[assignment]  # records views are not values to hash

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._fields)
        return f"{type(self).__name__}({fields})"


def _field_names(entity: object) -> tuple[str, ...] | None:
    if isinstance(entity, _Entity):
        return entity._fields
    if dataclasses.is_dataclass(entity):
        return tuple(field.name for field in dataclasses.fields(entity))
    return None


class PartitionProduceData(_Entity):
    __slots__ = ("index", "records")
    _fields = ("index", "records")

    def __init__(self, index: int, records: memoryview | None) -> None:
        self.index = index
        self.records = records  # a view of the frame; None when the client sent null


class TopicProduceData(_Entity):
    """A topic named by name (v3-v12)."""

    __slots__ = ("name", "partition_data")
    _fields = ("name", "partition_data")

    def __init__(self, name: str, partition_data: tuple[PartitionProduceData, ...]) -> None:
        self.name = name
        self.partition_data = partition_data


class TopicProduceDataById(_Entity):
    """A topic named by id (v13+); no `name` attribute, as kio's v13 entity."""

    __slots__ = ("partition_data", "topic_id")
    _fields = ("topic_id", "partition_data")

    def __init__(self, topic_id: uuid.UUID | None,
                 partition_data: tuple[PartitionProduceData, ...]) -> None:
        self.topic_id = topic_id
        self.partition_data = partition_data


class ProduceRequest(_Entity):
    __slots__ = ("acks", "timeout", "topic_data", "transactional_id")
    _fields = ("transactional_id", "acks", "timeout", "topic_data")

    def __init__(self, transactional_id: str | None, acks: int, timeout: datetime.timedelta,
                 topic_data: tuple[TopicProduceData | TopicProduceDataById, ...]) -> None:
        self.transactional_id = transactional_id
        self.acks = acks
        self.timeout = timeout  # a timedelta, as kio's timedelta_i32 fields
        self.topic_data = topic_data


def decode_produce_request(buf: memoryview, pos: int, api_version: int) -> ProduceRequest:
    """The Produce body of `api_version` that starts at `buf[pos]` (after the request
    header); `buf` is the read-only frame. Raises ProtocolError for malformed input."""
    if api_version >= _FLEXIBLE_FROM:
        return _decode_flexible(buf, pos, len(buf), api_version >= _TOPIC_ID_FROM)
    if api_version >= FIRST_VERSION:
        return _decode_classic(buf, pos, len(buf))
    raise ValueError(f"Produce v{api_version} is not decoded here")  # our bug: see apis


# ---------------------------------------------------------------- v3-v8


def _decode_classic(buf: memoryview, pos: int, end: int) -> ProduceRequest:
    if pos + 2 > end:
        raise _truncated(pos)
    (length,) = _INT16.unpack_from(buf, pos)
    pos += 2
    transactional_id = None
    if length != -1:
        pos, transactional_id = _string(buf, pos, end, length)
    if pos + _ACKS_TIMEOUT_COUNT.size > end:
        raise _truncated(pos)
    acks, timeout_ms, count = _ACKS_TIMEOUT_COUNT.unpack_from(buf, pos)
    pos = _check_count(count, pos + _ACKS_TIMEOUT_COUNT.size, end, "topic_data")
    topics = []
    for _ in range(count):
        if pos + 2 > end:
            raise _truncated(pos)
        (length,) = _INT16.unpack_from(buf, pos)
        if length == -1:
            raise ProtocolError(f"null topic name at byte {pos}")
        pos, name = _string(buf, pos + 2, end, length)
        if pos + 4 > end:
            raise _truncated(pos)
        (count,) = _INT32.unpack_from(buf, pos)
        pos = _check_count(count, pos + 4, end, "partition_data")
        partitions = []
        for _ in range(count):
            if pos + _INDEX_LENGTH.size > end:
                raise _truncated(pos)
            index, length = _INDEX_LENGTH.unpack_from(buf, pos)
            pos += _INDEX_LENGTH.size
            records = None
            if length != -1:
                if not 0 <= length <= end - pos:
                    raise _bad_length(length, pos, end)
                records = buf[pos : pos + length]
                pos += length
            partitions.append(PartitionProduceData(index, records))
        topics.append(TopicProduceData(name, tuple(partitions)))
    return ProduceRequest(transactional_id, acks, _timedelta(timeout_ms), tuple(topics))


# ---------------------------------------------------------------- v9-v13


def _decode_flexible(buf: memoryview, pos: int, end: int, by_id: bool) -> ProduceRequest:
    length, pos = _uvarint(buf, pos, end)
    transactional_id = None
    if length:
        pos, transactional_id = _string(buf, pos, end, length - 1)
    if pos + _ACKS_TIMEOUT.size > end:
        raise _truncated(pos)
    acks, timeout_ms = _ACKS_TIMEOUT.unpack_from(buf, pos)
    count, pos = _uvarint(buf, pos + _ACKS_TIMEOUT.size, end)
    count -= 1
    pos = _check_count(count, pos, end, "topic_data")
    topics: list[TopicProduceData | TopicProduceDataById] = []
    for _ in range(count):
        if by_id:
            if pos + _UUID_BYTES > end:
                raise _truncated(pos)
            raw = buf[pos : pos + _UUID_BYTES]
            topic_id = None if raw == _NULL_UUID else uuid.UUID(bytes=raw.tobytes())
            pos += _UUID_BYTES
        else:
            length, pos = _uvarint(buf, pos, end)
            if not length:
                raise ProtocolError(f"null topic name at byte {pos}")
            pos, name = _string(buf, pos, end, length - 1)
        count, pos = _uvarint(buf, pos, end)
        count -= 1
        pos = _check_count(count, pos, end, "partition_data")
        partitions = []
        for _ in range(count):
            if pos + 4 > end:
                raise _truncated(pos)
            (index,) = _INT32.unpack_from(buf, pos)
            length, pos = _uvarint(buf, pos + 4, end)
            records = None
            if length:
                length -= 1
                if length > end - pos:
                    raise _bad_length(length, pos, end)
                records = buf[pos : pos + length]
                pos += length
            pos = _skip_tagged_fields(buf, pos, end)
            partitions.append(PartitionProduceData(index, records))
        pos = _skip_tagged_fields(buf, pos, end)
        topics.append(TopicProduceDataById(topic_id, tuple(partitions)) if by_id
                      else TopicProduceData(name, tuple(partitions)))
    _skip_tagged_fields(buf, pos, end)
    return ProduceRequest(transactional_id, acks, _timedelta(timeout_ms), tuple(topics))


# ---------------------------------------------------------------- primitives


def _timedelta(ms: int) -> datetime.timedelta:
    """timedelta(milliseconds=ms): built without the keyword and float path (a fifth of
    the time), and remembered, since a client sends the same timeout every time."""
    value = _TIMEOUTS.get(ms)
    if value is None:
        seconds, rest_ms = divmod(ms, 1000)
        value = datetime.timedelta(0, seconds, rest_ms * 1000)
        if len(_TIMEOUTS) < _TIMEOUTS_MAX:
            _TIMEOUTS[ms] = value
    return value


def _truncated(pos: int) -> ProtocolError:
    return ProtocolError(f"request truncated at byte {pos}")


def _bad_length(length: int, pos: int, end: int) -> ProtocolError:
    return ProtocolError(f"length {length} with {end - pos} bytes left at byte {pos}")


def _check_count(count: int, pos: int, end: int, field: str) -> int:
    """`pos` if an array of `count` entries can fit in the bytes left (each entry takes
    at least one byte), else ProtocolError; a null array (-1) too, as Kafka's reader."""
    if not 0 <= count <= end - pos:
        raise ProtocolError(f"{field} count {count} with {end - pos} bytes left at byte {pos}")
    return pos


def _string(buf: memoryview, pos: int, end: int, length: int) -> tuple[int, str]:
    """The end of, and the strict UTF-8 string of, the `length` bytes at `pos`."""
    if not 0 <= length <= end - pos:
        raise _bad_length(length, pos, end)
    try:
        return pos + length, str(buf[pos : pos + length], "utf-8")
    except UnicodeDecodeError:
        raise ProtocolError(f"string at byte {pos} is not valid UTF-8") from None


def _uvarint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    if pos < end:
        byte = buf[pos]
        if byte < 0x80:  # one byte: every count and length of a small request
            return byte, pos + 1
    return _read_uvarint(buf, pos, end)   # the walker's, same checks and messages


def _skip_tagged_fields(buf: memoryview, pos: int, end: int) -> int:
    """Skip a tagged-field section: Produce defines no tags, so all are unknown."""
    if pos < end and buf[pos] == 0:  # none: the usual case
        return pos + 1
    count, pos = _uvarint(buf, pos, end)
    for _ in range(count):  # each field takes at least two bytes: bounded by the frame
        _tag, pos = _uvarint(buf, pos, end)
        size, pos = _uvarint(buf, pos, end)
        if size > end - pos:
            raise _bad_length(size, pos, end)
        pos += size
    return pos
