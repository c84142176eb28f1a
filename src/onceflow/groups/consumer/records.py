"""The `__consumer_offsets` records of consumer groups (KIP-848), in Kafka 4.0's format.

Theory of operation
-------------------
A consumer group is nothing but these records: loading a partition replays them, and a
live group changes only by replaying the records its requests produce. The key's int16
version is the record type (Kafka's CoordinatorRecordType), followed by non-flexible
strings; the values are flexible version 0 (groups/flexible.py), byte for byte Kafka's
`ConsumerGroup*Value.json`:

    type  key fields          value
     3    group               ConsumerGroupMetadata: group epoch
     4    group               ConsumerGroupPartitionMetadata: [topic id, name, partitions,
                              [partition, racks]] of the subscribed topics
     5    group, member       ConsumerGroupMemberMetadata: instance id, rack, client id and
                              host, subscribed topic names and regex, rebalance timeout,
                              server assignor (tag 0: classic member metadata, not written)
     6    group               ConsumerGroupTargetAssignmentMetadata: assignment epoch
     7    group, member       ConsumerGroupTargetAssignmentMember: [topic id, [partition]]
     8    group, member       ConsumerGroupCurrentMemberAssignment: member epoch, previous
                              epoch, state, assigned and pending-revocation partitions
    16    group, regex        ConsumerGroupRegularExpression: [topic], version, timestamp

A value None is a tombstone. Decoding is bounded (every count checked against the bytes
left) and raises RecordFormatError; unknown tagged fields (Kafka 4.1+ adds some) are
skipped, so a log written by a newer Kafka still loads.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from onceflow.groups.flexible import (
    I8,
    I16,
    I32,
    I64,
    NO_TAGS,
    FlexibleReader,
    compact_array_head,
    compact_int32s,
    compact_string,
    compact_strings,
)
from onceflow.groups.records import Record, RecordFormatError

# key versions = record types (Kafka's CoordinatorRecordType)
GROUP_METADATA = 3
PARTITION_METADATA = 4
MEMBER_METADATA = 5
TARGET_ASSIGNMENT_METADATA = 6
TARGET_ASSIGNMENT_MEMBER = 7
CURRENT_MEMBER_ASSIGNMENT = 8
REGULAR_EXPRESSION = 16
KEY_TYPES = frozenset({GROUP_METADATA, PARTITION_METADATA, MEMBER_METADATA,
                       TARGET_ASSIGNMENT_METADATA, TARGET_ASSIGNMENT_MEMBER,
                       CURRENT_MEMBER_ASSIGNMENT, REGULAR_EXPRESSION})
_WITH_MEMBER = frozenset({MEMBER_METADATA, TARGET_ASSIGNMENT_MEMBER, CURRENT_MEMBER_ASSIGNMENT})
VALUE_VERSION = 0
# smallest encodings, to reject counts the remaining bytes cannot hold
_TOPIC_PARTITIONS_BYTES_MIN = 16 + 1 + 1  # uuid, empty array, no tags
_TOPIC_METADATA_BYTES_MIN = 16 + 1 + 4 + 1 + 1

TopicPartition = tuple[uuid.UUID, int]  # (topic id, partition)


@dataclass(frozen=True, slots=True)
class ConsumerKey:
    """Any consumer-group key: `record_type` is its version; member/regex when it has one."""

    record_type: int
    group: str
    member: str | None = None  # member id (types 5, 7, 8) or regular expression (16)


@dataclass(frozen=True, slots=True)
class MemberSubscription:
    """ConsumerGroupMemberMetadataValue."""

    instance_id: str | None
    rack_id: str | None
    client_id: str
    client_host: str
    subscribed_topic_names: tuple[str, ...]
    subscribed_topic_regex: str | None
    rebalance_timeout_ms: int
    server_assignor: str | None


@dataclass(frozen=True, slots=True)
class MemberAssignmentValue:
    """ConsumerGroupCurrentMemberAssignmentValue."""

    member_epoch: int
    previous_member_epoch: int
    state: int
    assigned: frozenset[TopicPartition]
    pending_revocation: frozenset[TopicPartition]


@dataclass(frozen=True, slots=True)
class TopicMetadata:
    """One topic of ConsumerGroupPartitionMetadataValue (racks are not kept: no racks here)."""

    topic_id: uuid.UUID
    name: str
    num_partitions: int


@dataclass(frozen=True, slots=True)
class ResolvedRegex:
    """ConsumerGroupRegularExpressionValue: the topics a regex matched, at which metadata
    version and when."""

    topics: frozenset[str]
    version: int
    timestamp_ms: int


# ---------------------------------------------------------------- keys


def _key_string(s: str) -> bytes:
    data = s.encode()
    if len(data) > 0x7FFF:
        raise RecordFormatError(f"key string of {len(data)} bytes does not fit an int16 length")
    return I16.pack(len(data)) + data


def encode_key(key: ConsumerKey) -> bytes:
    out = I16.pack(key.record_type) + _key_string(key.group)
    if key.member is not None:
        out += _key_string(key.member)
    return out


def decode_key(version: int, r: FlexibleReader) -> ConsumerKey:
    """The rest of a key whose int16 version (already read) is one of KEY_TYPES."""
    group = r.string()
    member = r.string() if version in _WITH_MEMBER or version == REGULAR_EXPRESSION else None
    r.done()
    return ConsumerKey(version, group, member)


# ---------------------------------------------------------------- values


def _partitions_by_topic(tps: Iterable[TopicPartition]) -> bytes:
    by_topic: dict[uuid.UUID, list[int]] = {}
    for topic_id, partition in sorted(tps):
        by_topic.setdefault(topic_id, []).append(partition)
    return compact_array_head(len(by_topic)) + b"".join(
        topic_id.bytes + compact_int32s(parts) + NO_TAGS for topic_id, parts in by_topic.items())


def _read_partitions_by_topic(r: FlexibleReader) -> frozenset[TopicPartition]:
    out = set()
    for _ in range(r.compact_count(_TOPIC_PARTITIONS_BYTES_MIN) or 0):
        topic_id = r.uuid()
        out.update((topic_id, p) for p in r.compact_int32s())
        r.tags()
    return frozenset(out)


def _value(*parts: bytes) -> bytes:
    return I16.pack(VALUE_VERSION) + b"".join(parts) + NO_TAGS


def epoch_value(epoch: int) -> bytes:
    """ConsumerGroupMetadataValue and ConsumerGroupTargetAssignmentMetadataValue."""
    return _value(I32.pack(epoch))


def partition_metadata_value(topics: Iterable[TopicMetadata]) -> bytes:
    topics = sorted(topics, key=lambda t: t.name)
    return _value(compact_array_head(len(topics)) + b"".join(
        t.topic_id.bytes + compact_string(t.name) + I32.pack(t.num_partitions)
        + compact_array_head(0) + NO_TAGS for t in topics))


def member_metadata_value(m: MemberSubscription) -> bytes:
    return _value(compact_string(m.instance_id), compact_string(m.rack_id),
                  compact_string(m.client_id), compact_string(m.client_host),
                  compact_strings(m.subscribed_topic_names),
                  compact_string(m.subscribed_topic_regex), I32.pack(m.rebalance_timeout_ms),
                  compact_string(m.server_assignor))


def target_member_value(partitions: Iterable[TopicPartition]) -> bytes:
    return _value(_partitions_by_topic(partitions))


def member_assignment_value(v: MemberAssignmentValue) -> bytes:
    return _value(I32.pack(v.member_epoch), I32.pack(v.previous_member_epoch), I8.pack(v.state),
                  _partitions_by_topic(v.assigned), _partitions_by_topic(v.pending_revocation))


def regex_value(v: ResolvedRegex) -> bytes:
    return _value(compact_strings(sorted(v.topics)), I64.pack(v.version), I64.pack(v.timestamp_ms))


def _reader(data: bytes) -> FlexibleReader:
    r = FlexibleReader(data)
    version = r.int16()
    if version != VALUE_VERSION:
        raise RecordFormatError(f"unknown consumer group value version {version}")
    return r


def _finish(r: FlexibleReader) -> None:
    r.tags()
    r.done()


def decode_epoch(data: bytes) -> int:
    r = _reader(data)
    epoch = r.int32()
    _finish(r)
    return epoch


def decode_partition_metadata(data: bytes) -> tuple[TopicMetadata, ...]:
    r = _reader(data)
    topics = []
    for _ in range(r.compact_count(_TOPIC_METADATA_BYTES_MIN) or 0):
        topic_id, name, count = r.uuid(), r.compact_string(), r.int32()
        for _ in range(r.compact_count(4 + 1 + 1) or 0):  # partition racks: not used here
            r.int32()
            r.compact_strings()
            r.tags()
        r.tags()
        topics.append(TopicMetadata(topic_id, name, count))
    _finish(r)
    return tuple(topics)


def decode_member_metadata(data: bytes) -> MemberSubscription:
    r = _reader(data)
    value = MemberSubscription(
        r.compact_nullable_string(), r.compact_nullable_string(), r.compact_string(),
        r.compact_string(), r.compact_strings(), r.compact_nullable_string(), r.int32(),
        r.compact_nullable_string())
    _finish(r)
    return value


def decode_target_member(data: bytes) -> frozenset[TopicPartition]:
    r = _reader(data)
    partitions = _read_partitions_by_topic(r)
    _finish(r)
    return partitions


def decode_member_assignment(data: bytes) -> MemberAssignmentValue:
    r = _reader(data)
    value = MemberAssignmentValue(r.int32(), r.int32(), r.int8(), _read_partitions_by_topic(r),
                                  _read_partitions_by_topic(r))
    _finish(r)
    return value


def decode_regex(data: bytes) -> ResolvedRegex:
    r = _reader(data)
    value = ResolvedRegex(frozenset(r.compact_strings()), r.int64(), r.int64())
    _finish(r)
    return value


def record(record_type: int, group: str, value: bytes | None, member: str | None = None) -> Record:
    return Record(encode_key(ConsumerKey(record_type, group, member)), value)
