"""The `__transaction_state` record format, and which partition a transactional id lives in.

Theory of operation
-------------------
Everything the transaction coordinator must remember is one keyed record per transactional
id in the compacted internal topic `__transaction_state`: the newest record of an id is its
state, a tombstone (value None) forgets it. The layout is byte-for-byte Kafka's own
(`TransactionLogKey.json` / `TransactionLogValue.json`, transaction-coordinator module), so
Kafka tooling could read our topic:

    key   = int16 version (0), TransactionalId string (int16 length + UTF-8)
    value = int16 version, then
        v0 (non-flexible):
            ProducerId int64, ProducerEpoch int16, TransactionTimeoutMs int32,
            TransactionStatus int8 (TxnState.id),
            TransactionPartitions nullable array (int32 count, -1 = null) of
                { Topic string (int16 length), PartitionIds array (int32 count) of int32 },
            TransactionLastUpdateTimestampMs int64, TransactionStartTimestampMs int64
        v1 (flexible, what we write - Kafka's layout with transaction.version 1):
            the same fields, with compact strings/arrays (unsigned varint length + 1,
            0 = null) and a tagged-field section after each struct; the value's tags:
                0 PreviousProducerId int64 (default -1), 1 NextProducerId int64 (default -1),
                2 ClientTransactionVersion int16 (default 0)
            written only when different from the default, as Kafka's generated code does;
            unknown tags are skipped (that is what tagged fields are for).

Why v1: it keeps PreviousProducerId, which lets a KIP-360 retry of an InitProducerId that
rotated the producer id (epoch exhaustion) be recognised after a reload. The producer's
*last* epoch is not in either version (Kafka loads it as -1); see metadata.py.

Kafka writes TransactionPartitions as null in Empty and ignores it on load in Empty.
The partition of an id is Kafka's `abs(hashCode(id)) % transaction.state.log.num.partitions`
- the same function the group coordinator uses for `__consumer_offsets`, imported from there.

Decoding is bounded: every length and count is checked against the bytes that remain, and
anything malformed raises `RecordFormatError` (the storage layer already checked the batch
CRC, so this means a version we do not know or a bug: fail loudly).
"""

from __future__ import annotations

from dataclasses import dataclass

from onceflow.groups.flexible import I8 as _I8
from onceflow.groups.flexible import I16 as _I16
from onceflow.groups.flexible import I32 as _I32
from onceflow.groups.flexible import I64 as _I64
from onceflow.groups.flexible import (
    STRING_BYTES_MAX,
    FlexibleReader,
    compact_array_head,
    tag_int,
    tagged,
    utf8,
    uvarint,
)
from onceflow.groups.records import (  # shared with the group coordinator, not duplicated
    Record,
    RecordFormatError,
    java_string_hashcode,
    partition_for,
)

__all__ = [
    "KEY_VERSION", "VALUE_VERSION_WRITTEN", "Record", "RecordFormatError", "TxnLogValue",
    "decode_key", "decode_value", "encode_key", "encode_value", "java_string_hashcode",
    "partition_for", "txn_record",
]

KEY_VERSION = 0  # TransactionLogKey has one version
VALUE_VERSION_WRITTEN = 1  # flexible; see the module docstring
_VALUE_VERSIONS = (0, 1)
_FLEXIBLE_FROM = 1

TAG_PREVIOUS_PRODUCER_ID = 0
TAG_NEXT_PRODUCER_ID = 1
TAG_CLIENT_TRANSACTION_VERSION = 2
NO_PRODUCER_ID = -1

_PARTITION_BYTES = 4
# smallest encoding of one PartitionsSchema entry: empty topic + empty id array
# (+ its tagged-field count in v1)
_TOPIC_ENTRY_BYTES_MIN = {0: 2 + 4, 1: 1 + 1 + 1}


@dataclass(frozen=True, slots=True)
class TxnLogValue:
    """TransactionLogValue, field for field (names are Kafka's in snake_case)."""

    producer_id: int
    producer_epoch: int
    transaction_timeout_ms: int
    transaction_status: int  # TxnState.id
    # ((topic, (partition, ...)), ...); None = null (written in Empty)
    transaction_partitions: tuple[tuple[str, tuple[int, ...]], ...] | None
    transaction_last_update_timestamp_ms: int
    transaction_start_timestamp_ms: int
    previous_producer_id: int = NO_PRODUCER_ID  # tagged, v1+
    next_producer_id: int = NO_PRODUCER_ID  # tagged, v1+ (transactions V2 only)
    client_transaction_version: int = 0  # tagged, v1+


# ---------------------------------------------------------------- encoding


def _string(s: str, flexible: bool) -> bytes:
    data = utf8(s)
    return (uvarint(len(data) + 1) if flexible else _I16.pack(len(data))) + data


def _array_head(count: int | None, flexible: bool) -> bytes:
    if flexible:
        return compact_array_head(count)
    return _I32.pack(-1 if count is None else count)


def encode_key(transactional_id: str) -> bytes:
    return _I16.pack(KEY_VERSION) + _string(transactional_id, flexible=False)


def _encode_partitions(v: TxnLogValue, flexible: bool) -> bytes:
    topics = v.transaction_partitions
    out = [_array_head(None if topics is None else len(topics), flexible)]
    for topic, partitions in topics or ():
        out.append(_string(topic, flexible))
        out.append(_array_head(len(partitions), flexible))
        out.extend(_I32.pack(p) for p in partitions)
        if flexible:
            out.append(tagged([]))
    return b"".join(out)


def encode_value(v: TxnLogValue, version: int = VALUE_VERSION_WRITTEN) -> bytes:
    if version not in _VALUE_VERSIONS:
        raise RecordFormatError(f"cannot write TransactionLogValue version {version}")
    flexible = version >= _FLEXIBLE_FROM
    body = [
        _I16.pack(version), _I64.pack(v.producer_id), _I16.pack(v.producer_epoch),
        _I32.pack(v.transaction_timeout_ms), _I8.pack(v.transaction_status),
        _encode_partitions(v, flexible),
        _I64.pack(v.transaction_last_update_timestamp_ms),
        _I64.pack(v.transaction_start_timestamp_ms),
    ]
    if flexible:
        tags = []
        if v.previous_producer_id != NO_PRODUCER_ID:
            tags.append((TAG_PREVIOUS_PRODUCER_ID, _I64.pack(v.previous_producer_id)))
        if v.next_producer_id != NO_PRODUCER_ID:
            tags.append((TAG_NEXT_PRODUCER_ID, _I64.pack(v.next_producer_id)))
        if v.client_transaction_version != 0:
            tags.append((TAG_CLIENT_TRANSACTION_VERSION, _I16.pack(v.client_transaction_version)))
        body.append(tagged(tags))
    return b"".join(body)


def txn_record(transactional_id: str, value: TxnLogValue | None) -> Record:
    """The record to append: a value, or a tombstone (None) that forgets the id."""
    return Record(encode_key(transactional_id), None if value is None else encode_value(value))


# ---------------------------------------------------------------- decoding


class _Reader(FlexibleReader):
    """The flexible reader, plus the v0/v1 choice of string and array encodings."""

    def string(self, flexible: bool) -> str:  # type: ignore[override]
        n = self.uvarint() - 1 if flexible else self.int16()
        if n < 0 or n > STRING_BYTES_MAX:
            raise RecordFormatError(f"bad string length {n}")
        try:
            return bytes(self.take(n)).decode()
        except UnicodeDecodeError as exc:
            raise RecordFormatError(f"string is not UTF-8: {exc}") from None

    def array_count(self, flexible: bool, entry_bytes_min: int) -> int | None:
        """Element count (None = null), checked against the bytes that remain."""
        if flexible:
            return self.compact_count(entry_bytes_min)
        n = self.int32()
        if n == -1:
            return None
        if n < 0 or n * entry_bytes_min > self.remaining():
            raise RecordFormatError(f"array count {n} does not fit {self.remaining()} bytes")
        return n


def decode_key(data: bytes) -> str:
    """The transactional id of a `__transaction_state` key."""
    r = _Reader(data)
    version = r.int16()
    if version != KEY_VERSION:
        raise RecordFormatError(f"unknown __transaction_state key version {version}")
    transactional_id = r.string(flexible=False)
    r.done()
    return transactional_id


def _decode_partitions(r: _Reader, version: int) -> tuple[tuple[str, tuple[int, ...]], ...] | None:
    flexible = version >= _FLEXIBLE_FROM
    count = r.array_count(flexible, _TOPIC_ENTRY_BYTES_MIN[version])
    if count is None:
        return None
    topics = []
    for _ in range(count):
        topic = r.string(flexible)
        n = r.array_count(flexible, _PARTITION_BYTES)
        if n is None:
            raise RecordFormatError("null PartitionIds array")
        topics.append((topic, tuple(r.int32() for _ in range(n))))
        if flexible:
            r.tags()
    return tuple(topics)


def decode_value(data: bytes) -> TxnLogValue:
    r = _Reader(data)
    version = r.int16()
    if version not in _VALUE_VERSIONS:
        raise RecordFormatError(f"unknown TransactionLogValue version {version}")
    producer_id = r.int64()
    producer_epoch = r.int16()
    timeout_ms = r.int32()
    status = r.int8()
    partitions = _decode_partitions(r, version)
    last_update_ms = r.int64()
    start_ms = r.int64()
    tags = r.tags() if version >= _FLEXIBLE_FROM else {}
    r.done()
    return TxnLogValue(
        producer_id, producer_epoch, timeout_ms, status, partitions, last_update_ms, start_ms,
        previous_producer_id=tag_int(tags, TAG_PREVIOUS_PRODUCER_ID, _I64, NO_PRODUCER_ID),
        next_producer_id=tag_int(tags, TAG_NEXT_PRODUCER_ID, _I64, NO_PRODUCER_ID),
        client_transaction_version=tag_int(tags, TAG_CLIENT_TRANSACTION_VERSION, _I16, 0),
    )
