"""Fuzz harness: a Produce partition's records, validated, appended to a real log, read back.

What runs, in the order of the Produce path (broker/handlers/produce.py `single_batch`, then
`PartitionState.append` -> `PartitionLog.append`): `records.check_produce_records` (exactly one
magic-2 batch, known codec, count matching the offset range, no control batch, CRC-32C), the
max.message.bytes limit, then the storage layer: `PartitionLog.append` (segment.prepare_append,
the roll decision, offset/time indexes, an optional LogAppendTime stamp). The input is:

    flags u8 | produce api_version (3 + u8 % 10) | records blob

Flags help the fuzzer past checks it could hardly satisfy by mutation: bit 0 sets batch_length
from the blob's size, bit 1 sets records_count = last_offset_delta + 1, bit 2 recomputes the
CRC (after the others), bit 3 appends with LogAppendTime, bit 4 decodes the records of an
uncompressed batch (`decode_records`, which the console and the transaction markers use).

Protocol errors: `RecordError` and its subclasses (the partition's Kafka error code) and a
batch over max.message.bytes (MESSAGE_TOO_LARGE). Everything else escaping is a crash, and so
is a broken invariant of an accepted batch:

- the storage layer takes every batch that validation accepted (an AssertionError there, or a
  segment that cannot hold it, would be a broker crash on a client's bytes);
- reading the log back at the assigned offset returns the same batch, with only base offset
  (and, for LogAppendTime, the stamped fields and CRC) changed, and its CRC still valid;
- reopening the log (recovery re-validates every batch) keeps every appended batch.
"""

from __future__ import annotations

import atexit
import shutil
import struct
import tempfile
from pathlib import Path

from crc32c import crc32c

from onceflow.protocol.errors import CorruptRecord, RecordError
from onceflow.protocol.records import (
    ATTRIBUTES_AT,
    BATCH_HEADER,
    BATCH_HEADER_BYTES,
    CRC_AT,
    LOG_OVERHEAD_BYTES,
    Compression,
    SimpleRecord,
    build_batch,
    build_control_batch,
    check_produce_records,
    crc_ok,
    decode_records,
    iter_batches,
    with_log_append_time,
)
from onceflow.storage import LogConfig, PartitionLog

PROTOCOL_ERRORS = (RecordError,)
MAX_LEN = 2048
MAX_MESSAGE_BYTES = LogConfig().max_message_bytes
NOW_MS = 1_700_000_000_000
# Appends per log before it is reopened (recovery) and replaced by a fresh one: bounds the
# disk a long run uses, and puts recovery on the fuzzed path regularly.
APPENDS_PER_LOG = 200
# Small segments, so that rolling (offsets or bytes past a segment's limits) is exercised.
LOG_CONFIG = LogConfig(segment_bytes=64 * 1024)

FIX_LENGTH, FIX_COUNT, FIX_CRC, LOG_APPEND_TIME, DECODE = 0x01, 0x02, 0x04, 0x08, 0x10
_BATCH_LENGTH_AT = 8
_LAST_OFFSET_DELTA_AT = 23
_RECORDS_COUNT_AT = 57
_BASE_OFFSET_BYTES = 8  # the only bytes of a batch the log rewrites (without LogAppendTime)
_INT32 = struct.Struct(">i")
_UINT32 = struct.Struct(">I")


class _Logs:
    """One log at a time in a private temporary directory, replaced every APPENDS_PER_LOG."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="fuzz-record-batch-"))
        atexit.register(shutil.rmtree, self.root, True)
        self.generation = 0
        self.log = self._open()
        # (first offset, batch as given to append, LogAppendTime)
        self.appended: list[tuple[int, bytes, bool]] = []

    def _open(self) -> PartitionLog:
        return PartitionLog.open(self.root / f"t-{self.generation}", LOG_CONFIG, NOW_MS)

    def cycle(self) -> None:
        """Reopen the log (recovery must keep every batch), then start a fresh one."""
        end = self.log.log_end_offset
        directory = self.log.directory
        self.log.close()
        reopened = PartitionLog.open(directory, LOG_CONFIG, NOW_MS)
        assert reopened.log_end_offset == end, f"recovery moved the LEO {end} -> " \
            f"{reopened.log_end_offset}: {reopened.recovery}"
        for first_offset, batch, log_append_time in self.appended[-3:]:
            _check_read_back(reopened, first_offset, batch, log_append_time)
        reopened.discard()
        self.generation += 1
        self.log = self._open()
        self.appended.clear()


_logs: _Logs | None = None


def test_one_input(data: bytes) -> None:
    if len(data) < 2:
        return
    flags, api_version = data[0], 3 + data[1] % 10
    records = _fixed(bytearray(data[2:]), flags)
    try:
        header, batch = check_produce_records(records, api_version)
    except PROTOCOL_ERRORS:
        return
    assert header.magic == 2 and not header.is_control and crc_ok(batch)
    assert header.compression <= Compression.ZSTD and header.records_count >= 1
    assert len(batch) == header.size_bytes == len(records)
    if flags & DECODE and header.compression == Compression.NONE:
        _decode(batch)
    if len(batch) > MAX_MESSAGE_BYTES:
        return  # MESSAGE_TOO_LARGE
    _append(bytes(batch), log_append_time=bool(flags & LOG_APPEND_TIME))


def _fixed(records: bytearray, flags: int) -> bytearray:
    if len(records) < BATCH_HEADER_BYTES:
        return records
    if flags & FIX_LENGTH:
        _INT32.pack_into(records, _BATCH_LENGTH_AT, len(records) - LOG_OVERHEAD_BYTES)
    if flags & FIX_COUNT:
        (delta,) = _INT32.unpack_from(records, _LAST_OFFSET_DELTA_AT)
        if delta < 2**31 - 1:
            _INT32.pack_into(records, _RECORDS_COUNT_AT, delta + 1)
    if flags & FIX_CRC:
        (length,) = _INT32.unpack_from(records, _BATCH_LENGTH_AT)
        end = min(len(records), LOG_OVERHEAD_BYTES + max(length, 0))
        if end > ATTRIBUTES_AT:
            _UINT32.pack_into(records, CRC_AT, crc32c(memoryview(records)[ATTRIBUTES_AT:end]))
    return records


def _decode(batch: memoryview) -> None:
    try:
        decoded = decode_records(batch)
    except CorruptRecord:
        return
    header = BATCH_HEADER.unpack_from(batch)
    assert len(decoded) == header[-1], "decode_records returned another record count"


def _append(batch: bytes, *, log_append_time: bool) -> None:
    global _logs
    if _logs is None:
        _logs = _Logs()
    log = _logs.log
    info = log.append([batch], NOW_MS, log_append_time=log_append_time)
    header = BATCH_HEADER.unpack_from(batch)
    last_offset_delta = header[6]
    assert info.last_offset - info.first_offset == last_offset_delta, "offsets do not fit"
    _logs.appended.append((info.first_offset, batch, log_append_time))
    _check_read_back(log, info.first_offset, batch, log_append_time)
    if len(_logs.appended) >= APPENDS_PER_LOG:
        _logs.cycle()


def _check_read_back(log: PartitionLog, first_offset: int, batch: bytes,
                     log_append_time: bool) -> None:
    """The batch at `first_offset` is `batch` with the new base offset and, on LogAppendTime,
    stamped as `records.with_log_append_time` stamps (the storage layer has its own code)."""
    stored = log.read(first_offset, 1, first_offset + 1)
    (got, view), *rest = list(iter_batches(stored))
    assert not rest, "a read of one offset returned several batches"
    assert got.base_offset == first_offset, f"read {got.base_offset}, wanted {first_offset}"
    assert crc_ok(view), "the stored batch fails its CRC"
    expected = with_log_append_time(batch, NOW_MS) if log_append_time else batch
    assert bytes(view[_BASE_OFFSET_BYTES:]) == expected[_BASE_OFFSET_BYTES:], \
        "the stored batch differs from the appended one beyond its base offset"


# ------------------------------------------------------------------------------ seeds


def seeds() -> list[bytes]:
    """Valid batches built with the project's encoder, each behind a few flag choices."""
    batches = [
        build_batch([SimpleRecord(b"k", b"v")]),
        build_batch([SimpleRecord(b"key", b"value", (("h", b"x"), ("n", None)))] * 3,
                    base_timestamp_ms=NOW_MS),
        build_batch([SimpleRecord(None, b"idempotent")], producer_id=7, producer_epoch=0,
                    base_sequence=0),
        build_batch([SimpleRecord(None, b"a"), SimpleRecord(b"b", None, timestamp_ms=5)],
                    producer_id=8, producer_epoch=3, base_sequence=41, transactional=True),
        build_control_batch(producer_id=8, producer_epoch=3, commit=True, coordinator_epoch=0,
                            timestamp_ms=NOW_MS),  # refused from clients: a seed for that path
    ]
    found = []
    for batch in batches:
        for flags in (0, FIX_CRC, FIX_CRC | DECODE, FIX_LENGTH | FIX_COUNT | FIX_CRC | DECODE,
                      LOG_APPEND_TIME | DECODE):
            found.append(bytes([flags, 7]) + batch)
    return found
