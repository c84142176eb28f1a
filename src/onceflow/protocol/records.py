"""Record batches, format v2 (magic 2), kept as opaque bytes.

Theory of operation. A records blob (a produce partition's `records`, a slice of
a log segment, a fetch answer) is a sequence of batches. Each batch is a fixed
61-byte header followed by its records; `batch_length` counts the bytes after
itself, so a batch occupies 12 + batch_length bytes (8-byte base_offset plus the
4-byte length are the "log overhead").

The hot paths (produce validation, log append, log recovery) only ever parse
headers: `iter_batches` walks a blob batch by batch with bounds checks and
yields (header, memoryview of the whole batch) without copying, `crc_ok` runs
CRC-32C over the view, and `with_base_offset` rewrites the 8 bytes that the CRC
does not cover. Records themselves are never decoded or re-encoded there, and
compressed batches are stored as the producer sent them.

The CRC (CRC-32C, Castagnoli) covers the bytes from `attributes` to the end of
the batch. Fields before it (base_offset, batch_length, partition_leader_epoch,
magic) can be rewritten freely; changing anything after it (LogAppendTime's
max_timestamp and timestamp-type bit) means recomputing the CRC.

Slow paths (control markers, internal topics, tests) build and decode
uncompressed batches: `build_batch`, `build_control_batch`, `decode_records`.
Inside a batch a record is: varint length, int8 attributes (unused), varlong
timestamp delta, varint offset delta, varint key length (-1 = null) + key,
varint value length + value, varint header count, then per header a varint key
length + UTF-8 key and a varint value length + value. Varints are zigzag
encoded, as in protobuf.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterator, Sequence
from typing import NamedTuple

from crc32c import crc32c

from onceflow.protocol.errors import (
    CorruptRecord,
    InvalidRecord,
    UnsupportedCompression,
    UnsupportedMagic,
)

__all__ = (
    "BATCH_HEADER",
    "BatchHeader",
    "Compression",
    "EndTxnMarker",
    "Record",
    "SimpleRecord",
    "TimestampType",
    "build_batch",
    "build_control_batch",
    "check_produce_records",
    "crc_ok",
    "decode_records",
    "end_txn_marker",
    "increment_sequence",
    "iter_batches",
    "last_sequence",
    "with_base_offset",
    "with_log_append_time",
)

BATCH_HEADER = struct.Struct(
    ">"
    "q"  # base_offset: offset of the first record; the broker assigns it on append
    "i"  # batch_length: bytes after this field, to the end of the batch
    "i"  # partition_leader_epoch: set by the leader on append; -1 from producers
    "b"  # magic: record format version, 2
    "I"  # crc: CRC-32C of the bytes from attributes to the end of the batch
    "h"  # attributes: compression bits 0-2, timestamp type bit 3, transactional
    #      bit 4, control bit 5, delete horizon bit 6
    "i"  # last_offset_delta: offset of the last record minus base_offset
    "q"  # base_timestamp: timestamp of the first record (ms)
    "q"  # max_timestamp: largest record timestamp, or the LogAppendTime (ms)
    "q"  # producer_id: -1 when not idempotent
    "h"  # producer_epoch: -1 when not idempotent
    "i"  # base_sequence: sequence of the first record, -1 when not idempotent
    "i"  # records_count: number of records in the batch
)
BATCH_HEADER_BYTES = BATCH_HEADER.size  # 61
# base_offset + batch_length: the bytes batch_length does not count.
LOG_OVERHEAD_BYTES = 12
# The smallest honest batch_length: a header and no records.
BATCH_LENGTH_MIN = BATCH_HEADER_BYTES - LOG_OVERHEAD_BYTES
# Byte offsets of the fields that are read or rewritten in place.
PARTITION_LEADER_EPOCH_AT = 12
MAGIC_AT = 16
CRC_AT = 17
ATTRIBUTES_AT = 21  # the CRC covers from here to the end
MAX_TIMESTAMP_AT = 35

MAGIC_V2 = 2
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_PARTITION_LEADER_EPOCH = -1
# Sequences are int32 and wrap to 0 after this (DefaultRecordBatch.incrementSequence).
SEQUENCE_MAX = 2**31 - 1

ATTR_COMPRESSION_MASK = 0x07
ATTR_TIMESTAMP_TYPE = 0x08
ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20
ATTR_DELETE_HORIZON = 0x40

# Control record key (ControlRecordType) and end-transaction marker value
# (EndTransactionMarker): version int16 0 + type int16; version int16 0 +
# coordinator_epoch int32.
_CONTROL_KEY = struct.Struct(">hh")
_END_TXN_MARKER_VALUE = struct.Struct(">hi")
CONTROL_TYPE_ABORT = 0
CONTROL_TYPE_COMMIT = 1
# Produce v7 introduced zstd (KIP-110); older produce versions must not carry it.
_ZSTD_PRODUCE_VERSION_MIN = 7

_INT64 = struct.Struct(">q")
_INT32 = struct.Struct(">i")
_UINT32 = struct.Struct(">I")
# From attributes through records_count: the CRC-covered part of the header.
_CRC_COVERED_HEADER = struct.Struct(">hiqqqhii")


class Compression(enum.IntEnum):
    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


class TimestampType(enum.IntEnum):
    CREATE_TIME = 0
    LOG_APPEND_TIME = 1


class BatchHeader(NamedTuple):
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def compression(self) -> int:
        """Codec id, bits 0-2; compare with `Compression` (may be an unknown id)."""
        return self.attributes & ATTR_COMPRESSION_MASK

    @property
    def timestamp_type(self) -> TimestampType:
        return TimestampType(bool(self.attributes & ATTR_TIMESTAMP_TYPE))

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & ATTR_TRANSACTIONAL)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & ATTR_CONTROL)

    @property
    def last_offset(self) -> int:
        """Offset of the last record (inclusive)."""
        return self.base_offset + self.last_offset_delta

    @property
    def size_bytes(self) -> int:
        """Bytes the whole batch occupies, log overhead included."""
        return LOG_OVERHEAD_BYTES + self.batch_length

    @property
    def last_sequence(self) -> int:
        return last_sequence(self.base_sequence, self.last_offset_delta)


def increment_sequence(sequence: int, increment: int) -> int:
    """`sequence + increment`, wrapping past 2^31-1 to 0 as Kafka does."""
    if sequence > SEQUENCE_MAX - increment:
        return increment - (SEQUENCE_MAX - sequence) - 1
    return sequence + increment


def last_sequence(base_sequence: int, last_offset_delta: int) -> int:
    """Sequence of a batch's last record; -1 for a batch without sequences."""
    if base_sequence == NO_SEQUENCE:
        return NO_SEQUENCE
    return increment_sequence(base_sequence, last_offset_delta)


# ---------------------------------------------------------------- iteration


def iter_batches(buf: bytes | bytearray | memoryview) -> Iterator[tuple[BatchHeader, memoryview]]:
    """Yield (header, whole batch) for each batch of a records blob.

    Raises CorruptRecord for a length below the header size, a batch running past
    the end of `buf` (also a partial trailing batch) and UnsupportedMagic for a
    magic other than 2; `position` on the error is where the bad batch starts.
    Reads nothing past the buffer and copies nothing.
    """
    view = memoryview(buf).cast("B")
    end = len(view)
    pos = 0
    while pos < end:
        header, batch_end = _batch_at(view, pos, end)
        yield header, view[pos:batch_end]
        pos = batch_end


def _batch_at(view: memoryview, pos: int, end: int) -> tuple[BatchHeader, int]:
    """The header of the batch at `pos` and where the batch ends, checked as
    iter_batches documents."""
    if end - pos <= MAGIC_AT:
        raise CorruptRecord(f"{end - pos} trailing bytes are no batch", position=pos)
    magic = view[MAGIC_AT + pos]
    if magic != MAGIC_V2:
        raise UnsupportedMagic(f"record batch magic {magic} is not 2", position=pos)
    if end - pos < BATCH_HEADER_BYTES:
        raise CorruptRecord("truncated batch header", position=pos)
    header = BatchHeader._make(BATCH_HEADER.unpack_from(view, pos))
    if header.batch_length < BATCH_LENGTH_MIN:
        raise CorruptRecord(f"batch length {header.batch_length} too small", position=pos)
    batch_end = pos + LOG_OVERHEAD_BYTES + header.batch_length
    if batch_end > end:
        raise CorruptRecord(f"batch runs {batch_end - end} bytes past the end", position=pos)
    return header, batch_end


def crc_ok(batch: bytes | memoryview) -> bool:
    """True when the stored CRC-32C matches the batch's CRC-covered bytes."""
    (stored,) = _UINT32.unpack_from(batch, CRC_AT)
    return crc32c(memoryview(batch)[ATTRIBUTES_AT:]) == stored


def check_produce_records(
    records: bytes | memoryview | None, api_version: int
) -> tuple[BatchHeader, memoryview]:
    """Validate one produce partition's records as Kafka does for produce v3+.

    Exactly one batch, magic 2, a known codec (zstd only from produce v7), a record
    count matching the offset range, no control batch from a client, a good CRC.
    Header-only work: the records are not decompressed. Raises RecordError
    subclasses whose `error_code` is the partition's answer.
    """
    if not records:
        raise InvalidRecord("produce requests must carry one record batch per partition")
    view = memoryview(records).cast("B")
    end = len(view)
    header, batch_end = _batch_at(view, 0, end)   # not iter_batches: one request, one call
    if batch_end < end:
        _batch_at(view, batch_end, end)   # what follows is refused as iter_batches refuses it
        raise InvalidRecord("produce requests carry exactly one record batch per partition")
    batch = view[:batch_end]
    if header.compression > Compression.ZSTD:
        raise UnsupportedCompression(f"unknown compression codec {header.compression}")
    if header.compression == Compression.ZSTD and api_version < _ZSTD_PRODUCE_VERSION_MIN:
        raise UnsupportedCompression(f"zstd needs produce v7, got v{api_version}")
    if header.last_offset_delta < 0 or header.records_count != header.last_offset_delta + 1:
        raise InvalidRecord(
            f"record count {header.records_count} does not match the offset range "
            f"0..{header.last_offset_delta}"
        )
    if header.is_control:
        raise InvalidRecord("clients may not write control batches")
    if not crc_ok(batch):
        raise CorruptRecord("record batch CRC mismatch")
    return header, batch


# ---------------------------------------------------------------- rewriting


def with_base_offset(
    batch: bytes | memoryview, base_offset: int, partition_leader_epoch: int | None = None
) -> bytes:
    """The batch with a new base offset (and leader epoch); both lie outside the CRC."""
    view = memoryview(batch)
    if partition_leader_epoch is None:
        return b"".join((_INT64.pack(base_offset), view[_INT64.size :]))
    return b"".join(
        (
            _INT64.pack(base_offset),
            view[_INT64.size : PARTITION_LEADER_EPOCH_AT],
            _INT32.pack(partition_leader_epoch),
            view[PARTITION_LEADER_EPOCH_AT + _INT32.size :],
        )
    )


def with_log_append_time(batch: bytes | memoryview, log_append_time_ms: int) -> bytes:
    """The batch stamped for a LogAppendTime topic, CRC recomputed.

    Kafka (DefaultRecordBatch.setMaxTimestamp) sets the timestamp-type bit and
    writes the append time as max_timestamp; consumers then report that time for
    every record. Both fields are CRC-covered, so the CRC is recomputed: over the
    rewritten 40-byte covered header, continued over the untouched records.
    """
    view = memoryview(batch)
    fields = list(_CRC_COVERED_HEADER.unpack_from(view, ATTRIBUTES_AT))
    fields[0] |= ATTR_TIMESTAMP_TYPE  # attributes
    fields[3] = log_append_time_ms  # max_timestamp
    covered_header = _CRC_COVERED_HEADER.pack(*fields)
    records = view[BATCH_HEADER_BYTES:]
    crc = crc32c(records, crc32c(covered_header))
    return b"".join((view[:CRC_AT], _UINT32.pack(crc), covered_header, records))


# ---------------------------------------------------------------- building


class SimpleRecord(NamedTuple):
    """A record to build: timestamp None means the batch's base timestamp."""

    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()
    timestamp_ms: int | None = None


class Record(NamedTuple):
    """A decoded record with absolute offset and timestamp."""

    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


def build_batch(
    records: Sequence[SimpleRecord],
    *,
    base_offset: int = 0,
    base_timestamp_ms: int = 0,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    transactional: bool = False,
    control: bool = False,
    timestamp_type: TimestampType = TimestampType.CREATE_TIME,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
) -> bytes:
    """An uncompressed v2 batch of `records` with a valid CRC."""
    if not records:
        raise ValueError("a record batch holds at least one record")
    timestamps = [
        base_timestamp_ms if record.timestamp_ms is None else record.timestamp_ms
        for record in records
    ]
    first_timestamp = timestamps[0]
    body = b"".join(
        _encode_record(record, offset_delta, timestamp - first_timestamp)
        for offset_delta, (record, timestamp) in enumerate(zip(records, timestamps, strict=True))
    )
    attributes = (
        (ATTR_TIMESTAMP_TYPE if timestamp_type == TimestampType.LOG_APPEND_TIME else 0)
        | (ATTR_TRANSACTIONAL if transactional else 0)
        | (ATTR_CONTROL if control else 0)
    )
    covered_header = _CRC_COVERED_HEADER.pack(
        attributes, len(records) - 1, first_timestamp, max(timestamps),
        producer_id, producer_epoch, base_sequence, len(records),
    )  # fmt: skip
    crc = crc32c(body, crc32c(covered_header))
    batch_length = BATCH_LENGTH_MIN + len(body)
    prefix = struct.pack(">qiib", base_offset, batch_length, partition_leader_epoch, MAGIC_V2)
    return b"".join((prefix, _UINT32.pack(crc), covered_header, body))


def build_control_batch(
    *,
    producer_id: int,
    producer_epoch: int,
    commit: bool,
    coordinator_epoch: int,
    timestamp_ms: int,
    base_offset: int = 0,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
) -> bytes:
    """A COMMIT or ABORT marker batch, as a transaction coordinator writes it.

    Like Kafka's MemoryRecords.withEndTransactionMarker: transactional and
    control bits set, no sequence, one record whose key is ControlRecordType and
    whose value is EndTransactionMarker, both at their version 0.
    """
    control_type = CONTROL_TYPE_COMMIT if commit else CONTROL_TYPE_ABORT
    marker = SimpleRecord(
        key=_CONTROL_KEY.pack(0, control_type),
        value=_END_TXN_MARKER_VALUE.pack(0, coordinator_epoch),
    )
    return build_batch(
        [marker],
        base_offset=base_offset,
        base_timestamp_ms=timestamp_ms,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        transactional=True,
        control=True,
        partition_leader_epoch=partition_leader_epoch,
    )


class EndTxnMarker(NamedTuple):
    commit: bool
    coordinator_epoch: int


def end_txn_marker(batch: bytes | memoryview) -> EndTxnMarker | None:
    """The COMMIT/ABORT marker of a control batch; None for other control types."""
    (record,) = decode_records(batch)
    if record.key is None or len(record.key) < _CONTROL_KEY.size:
        raise CorruptRecord("control record without a valid key")
    _version, control_type = _CONTROL_KEY.unpack_from(record.key)
    if control_type not in (CONTROL_TYPE_ABORT, CONTROL_TYPE_COMMIT):
        return None
    if record.value is None or len(record.value) < _END_TXN_MARKER_VALUE.size:
        raise CorruptRecord("end transaction marker value too short")
    _version, coordinator_epoch = _END_TXN_MARKER_VALUE.unpack_from(record.value)
    return EndTxnMarker(control_type == CONTROL_TYPE_COMMIT, coordinator_epoch)


# ---------------------------------------------------------------- records


def decode_records(batch: bytes | memoryview) -> list[Record]:
    """The records of one uncompressed batch, bounds-checked (CorruptRecord)."""
    view = memoryview(batch).cast("B")
    if len(view) < BATCH_HEADER_BYTES:
        raise CorruptRecord("truncated batch header")
    header = BatchHeader._make(BATCH_HEADER.unpack_from(view, 0))
    if header.compression != Compression.NONE:
        raise ValueError(f"decode_records reads uncompressed batches, codec {header.compression}")
    end = min(len(view), header.size_bytes)
    log_append_time = header.timestamp_type == TimestampType.LOG_APPEND_TIME
    pos = BATCH_HEADER_BYTES
    records = []
    for _ in range(header.records_count):
        if pos >= end:
            raise CorruptRecord(f"batch ends after {len(records)} records", position=pos)
        length, pos = _read_varint(view, pos, end)
        record_end = pos + length
        if length <= 0 or record_end > end:
            raise CorruptRecord(f"record length {length} out of bounds", position=pos)
        record = _decode_record(view, pos + 1, record_end, header)  # +1: attributes
        if log_append_time:
            record = record._replace(timestamp_ms=header.max_timestamp)
        records.append(record)
        pos = record_end
    if pos != end:
        raise CorruptRecord(f"{end - pos} bytes after the last record", position=pos)
    return records


def _decode_record(view: memoryview, pos: int, end: int, header: BatchHeader) -> Record:
    timestamp_delta, pos = _read_varint(view, pos, end)
    offset_delta, pos = _read_varint(view, pos, end)
    key, pos = _read_varint_bytes(view, pos, end)
    value, pos = _read_varint_bytes(view, pos, end)
    header_count, pos = _read_varint(view, pos, end)
    if header_count < 0 or header_count > end - pos:
        raise CorruptRecord(f"record header count {header_count}", position=pos)
    headers = []
    for _ in range(header_count):
        header_key, pos = _read_varint_bytes(view, pos, end)
        if header_key is None:
            raise CorruptRecord("null record header key", position=pos)
        header_value, pos = _read_varint_bytes(view, pos, end)
        headers.append((header_key.decode("utf-8", "replace"), header_value))
    if pos != end:
        raise CorruptRecord("record length does not match its fields", position=pos)
    return Record(
        offset=header.base_offset + offset_delta,
        timestamp_ms=header.base_timestamp + timestamp_delta,
        key=key,
        value=value,
        headers=tuple(headers),
    )


def _encode_record(record: SimpleRecord, offset_delta: int, timestamp_delta: int) -> bytes:
    parts = [
        b"\x00",  # attributes: unused
        _encode_varint(timestamp_delta),
        _encode_varint(offset_delta),
        _encode_varint_bytes(record.key),
        _encode_varint_bytes(record.value),
        _encode_varint(len(record.headers)),
    ]
    for header_key, header_value in record.headers:
        parts += (_encode_varint_bytes(header_key.encode()), _encode_varint_bytes(header_value))
    body = b"".join(parts)
    return _encode_varint(len(body)) + body


# Zigzag varints: Kafka's varlong takes at most 10 bytes.
_VARINT_BYTES_MAX = 10


def _encode_varint(value: int) -> bytes:
    zigzag = (value << 1) ^ (value >> 63)
    out = bytearray()
    while zigzag >= 0x80:
        out.append((zigzag & 0x7F) | 0x80)
        zigzag >>= 7
    out.append(zigzag)
    return bytes(out)


def _encode_varint_bytes(data: bytes | None) -> bytes:
    if data is None:
        return _encode_varint(-1)
    return _encode_varint(len(data)) + data


def _read_varint(view: memoryview, pos: int, end: int) -> tuple[int, int]:
    zigzag = 0
    for shift in range(0, 7 * _VARINT_BYTES_MAX, 7):
        if pos >= end:
            raise CorruptRecord("truncated varint", position=pos)
        byte = view[pos]
        pos += 1
        zigzag |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (zigzag >> 1) ^ -(zigzag & 1), pos
    raise CorruptRecord("varint longer than 10 bytes", position=pos)


def _read_varint_bytes(view: memoryview, pos: int, end: int) -> tuple[bytes | None, int]:
    length, pos = _read_varint(view, pos, end)
    if length == -1:
        return None, pos
    if length < -1 or pos + length > end:
        raise CorruptRecord(f"field length {length} out of bounds", position=pos)
    return bytes(view[pos : pos + length]), pos + length
