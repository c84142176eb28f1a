"""The `__consumer_offsets` record format, and which partition a group lives in.

Theory of operation
-------------------
Everything about groups that must survive a restart is a keyed record in the internal
compacted topic `__consumer_offsets`. The layout is byte-for-byte Kafka's own
(`OffsetCommitKey/Value.json`, `GroupMetadataKey/Value.json`, non-flexible versions), so
Kafka tooling could read our topic and our knowledge of it transfers:

    key   = int16 key_version, then
            version 0/1  OffsetCommitKey   (group: string, topic: string, partition: int32)
            version 2    GroupMetadataKey  (group: string)
    value = int16 value_version + fields, or None: a *tombstone* that deletes the key
            (compaction keeps the newest record per key and drops old tombstones)

    OffsetCommitValue   v0: offset int64, metadata string, commit_timestamp int64
                        v1: v0 + expire_timestamp int64 (written only when a v2-v4
                            OffsetCommit asked for a retention time)
                        v2: as v0
                        v3: offset int64, leader_epoch int32, metadata string,
                            commit_timestamp int64                      (written)
    GroupMetadataValue  protocol_type string, generation int32, protocol string?,
                        leader string?, [v2+] current_state_timestamp int64,
                        members [member_id string, [v3+] group_instance_id string?,
                        client_id string, client_host string, [v1+] rebalance_timeout
                        int32, session_timeout int32, subscription bytes, assignment
                        bytes]                                           (v3 written)

Strings are int16 length + UTF-8 (length -1 = null), bytes are int32 length, arrays an
int32 count; all big-endian. Transactional offset commits use the same key and value:
what makes them pending is the producer id of the batch they were appended in, and a
COMMIT/ABORT control marker of that producer later in the same partition settles them
(the `LogRecord.producer_id` and `TxnMarker` types below carry exactly that).

Decoding is bounded: every length and count is checked against the bytes that remain,
and anything malformed raises `RecordFormatError` (the storage layer already checked the
batch CRC, so this means a version we do not know or a bug: fail loudly).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1

OFFSET_COMMIT_KEY_VERSION = 1  # Kafka writes 1 (0 has the same layout)
GROUP_METADATA_KEY_VERSION = 2
OFFSET_COMMIT_VALUE_VERSION = 3  # with leader epoch
OFFSET_COMMIT_VALUE_VERSION_WITH_EXPIRY = 1  # only version with expire_timestamp
GROUP_METADATA_VALUE_VERSION = 3  # with group_instance_id (static membership)
_OFFSET_VALUE_VERSIONS = range(0, 4)
_GROUP_VALUE_VERSIONS = range(0, 4)

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
# smallest encoding of one GroupMetadataValue member (v0: 4 empty strings/bytes + int32);
# used to reject a member count that the remaining bytes cannot possibly hold.
_MEMBER_BYTES_MIN = 2 + 2 + 2 + 4 + 4 + 4


class RecordFormatError(ValueError):
    """A __consumer_offsets key or value that we cannot decode."""


# ---------------------------------------------------------------- partitioning


def java_string_hashcode(s: str) -> int:
    """Java's String.hashCode(): sum of UTF-16 code units * 31^(n-1-i), as a signed int32."""
    data = s.encode("utf-16-be", "surrogatepass")
    h = 0
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= (1 << 31) else h


def partition_for(group_id: str, num_partitions: int) -> int:
    """Kafka's `Utils.abs(groupId.hashCode()) % offsets.topic.num.partitions`.

    Utils.abs maps Integer.MIN_VALUE to 0 (Math.abs would leave it negative)."""
    h = java_string_hashcode(group_id)
    return (0 if h == -(1 << 31) else abs(h)) % num_partitions


# ---------------------------------------------------------------- typed keys/values


@dataclass(frozen=True, slots=True)
class OffsetCommitKey:
    group: str
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class GroupMetadataKey:
    group: str


@dataclass(frozen=True, slots=True)
class OffsetCommitValue:
    offset: int
    leader_epoch: int  # -1 = unknown
    metadata: str
    commit_timestamp_ms: int
    expire_timestamp_ms: int = -1  # -1 = broker retention applies


@dataclass(frozen=True, slots=True)
class MemberMetadataValue:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    subscription: bytes  # the member's metadata for the selected protocol
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupMetadataValue:
    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    current_state_timestamp_ms: int  # -1 = unknown
    members: tuple[MemberMetadataValue, ...]


# ---------------------------------------------------------------- log entries


@dataclass(frozen=True, slots=True)
class Record:
    """A record to append: key and value bytes; value None is a tombstone."""

    key: bytes
    value: bytes | None


@dataclass(frozen=True, slots=True)
class LogRecord:
    """A record as read back from __consumer_offsets (what replay consumes)."""

    offset: int  # its offset in the partition
    timestamp_ms: int
    producer_id: int  # NO_PRODUCER_ID unless it was appended in a transactional batch
    key: bytes
    value: bytes | None


@dataclass(frozen=True, slots=True)
class TxnMarker:
    """A COMMIT/ABORT control marker of `producer_id` in __consumer_offsets."""

    offset: int
    timestamp_ms: int
    producer_id: int
    commit: bool


LogEntry = LogRecord | TxnMarker


# ---------------------------------------------------------------- encoding


def _string(s: str) -> bytes:
    data = s.encode()
    if len(data) > 0x7FFF:
        raise RecordFormatError(f"string of {len(data)} bytes does not fit an int16 length")
    return _I16.pack(len(data)) + data


def _nullable_string(s: str | None) -> bytes:
    return _I16.pack(-1) if s is None else _string(s)


def _bytes(b: bytes) -> bytes:
    return _I32.pack(len(b)) + b


def encode_offset_commit_key(key: OffsetCommitKey) -> bytes:
    return (_I16.pack(OFFSET_COMMIT_KEY_VERSION) + _string(key.group) + _string(key.topic)
            + _I32.pack(key.partition))


def encode_group_metadata_key(key: GroupMetadataKey) -> bytes:
    return _I16.pack(GROUP_METADATA_KEY_VERSION) + _string(key.group)


def encode_offset_commit_value(v: OffsetCommitValue) -> bytes:
    if v.expire_timestamp_ms >= 0:
        return (_I16.pack(OFFSET_COMMIT_VALUE_VERSION_WITH_EXPIRY) + _I64.pack(v.offset)
                + _string(v.metadata) + _I64.pack(v.commit_timestamp_ms)
                + _I64.pack(v.expire_timestamp_ms))
    return (_I16.pack(OFFSET_COMMIT_VALUE_VERSION) + _I64.pack(v.offset)
            + _I32.pack(v.leader_epoch) + _string(v.metadata) + _I64.pack(v.commit_timestamp_ms))


def _encode_member(m: MemberMetadataValue) -> bytes:
    return b"".join((
        _string(m.member_id), _nullable_string(m.group_instance_id), _string(m.client_id),
        _string(m.client_host), _I32.pack(m.rebalance_timeout_ms), _I32.pack(m.session_timeout_ms),
        _bytes(m.subscription), _bytes(m.assignment),
    ))


def encode_group_metadata_value(v: GroupMetadataValue) -> bytes:
    head = (_I16.pack(GROUP_METADATA_VALUE_VERSION) + _string(v.protocol_type)
            + _I32.pack(v.generation) + _nullable_string(v.protocol) + _nullable_string(v.leader)
            + _I64.pack(v.current_state_timestamp_ms) + _I32.pack(len(v.members)))
    return head + b"".join(_encode_member(m) for m in v.members)


def offset_commit_record(group: str, topic: str, partition: int,
                         value: OffsetCommitValue | None) -> Record:
    key = encode_offset_commit_key(OffsetCommitKey(group, topic, partition))
    return Record(key, None if value is None else encode_offset_commit_value(value))


def group_metadata_record(group: str, value: GroupMetadataValue | None) -> Record:
    key = encode_group_metadata_key(GroupMetadataKey(group))
    return Record(key, None if value is None else encode_group_metadata_value(value))


# ---------------------------------------------------------------- decoding


class Reader:
    """Bounded big-endian reader over one key or value (also used by txn.records)."""

    __slots__ = ("_buf", "_pos")

    def __init__(self, buf: bytes) -> None:
        self._buf = memoryview(buf)
        self._pos = 0

    def remaining(self) -> int:
        return len(self._buf) - self._pos

    def take(self, n: int) -> memoryview:
        if n < 0 or n > self.remaining():
            raise RecordFormatError(f"need {n} bytes at {self._pos}, {self.remaining()} left")
        view = self._buf[self._pos:self._pos + n]
        self._pos += n
        return view

    def int8(self) -> int:
        return int.from_bytes(self.take(1), "big", signed=True)

    def int16(self) -> int:
        return _I16.unpack(self.take(2))[0]

    def int32(self) -> int:
        return _I32.unpack(self.take(4))[0]

    def int64(self) -> int:
        return _I64.unpack(self.take(8))[0]

    def nullable_string(self) -> str | None:
        n = self.int16()
        if n == -1:
            return None
        try:
            return bytes(self.take(n)).decode()
        except UnicodeDecodeError as exc:
            raise RecordFormatError(f"string is not UTF-8: {exc}") from None

    def string(self) -> str:
        s = self.nullable_string()
        if s is None:
            raise RecordFormatError("null where a string is required")
        return s

    def bytes_(self) -> bytes:
        n = self.int32()
        return b"" if n == -1 else bytes(self.take(n))

    def done(self) -> None:
        if self.remaining():
            raise RecordFormatError(f"{self.remaining()} trailing bytes")


def decode_key(data: bytes) -> OffsetCommitKey | GroupMetadataKey:
    r = Reader(data)
    version = r.int16()
    if version in (0, 1):
        key: OffsetCommitKey | GroupMetadataKey = OffsetCommitKey(r.string(), r.string(), r.int32())
    elif version == 2:
        key = GroupMetadataKey(r.string())
    else:
        raise RecordFormatError(f"unknown __consumer_offsets key version {version}")
    r.done()
    return key


def decode_offset_commit_value(data: bytes) -> OffsetCommitValue:
    r = Reader(data)
    version = r.int16()
    if version not in _OFFSET_VALUE_VERSIONS:
        raise RecordFormatError(f"unknown OffsetCommitValue version {version}")
    offset = r.int64()
    leader_epoch = r.int32() if version >= 3 else -1
    metadata = r.string()
    commit_timestamp_ms = r.int64()
    expire_timestamp_ms = r.int64() if version == 1 else -1
    r.done()
    return OffsetCommitValue(offset, leader_epoch, metadata, commit_timestamp_ms,
                             expire_timestamp_ms)


def _decode_member(r: Reader, version: int) -> MemberMetadataValue:
    member_id = r.string()
    group_instance_id = r.nullable_string() if version >= 3 else None
    client_id = r.string()
    client_host = r.string()
    rebalance_timeout_ms = r.int32() if version >= 1 else -1
    session_timeout_ms = r.int32()
    if rebalance_timeout_ms == -1:  # Kafka: v0 members rebalance within the session timeout
        rebalance_timeout_ms = session_timeout_ms
    return MemberMetadataValue(member_id, group_instance_id, client_id, client_host,
                               rebalance_timeout_ms, session_timeout_ms, r.bytes_(), r.bytes_())


def decode_group_metadata_value(data: bytes) -> GroupMetadataValue:
    r = Reader(data)
    version = r.int16()
    if version not in _GROUP_VALUE_VERSIONS:
        raise RecordFormatError(f"unknown GroupMetadataValue version {version}")
    protocol_type = r.string()
    generation = r.int32()
    protocol = r.nullable_string()
    leader = r.nullable_string()
    state_timestamp_ms = r.int64() if version >= 2 else -1
    count = r.int32()
    if count < 0 or count * _MEMBER_BYTES_MIN > r.remaining():
        raise RecordFormatError(f"member count {count} does not fit {r.remaining()} bytes")
    members = tuple(_decode_member(r, version) for _ in range(count))
    r.done()
    return GroupMetadataValue(protocol_type, generation, protocol, leader, state_timestamp_ms,
                              members)
