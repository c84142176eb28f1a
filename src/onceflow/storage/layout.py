"""On-disk layout of the storage layer: every format declared once, and its errors.

A partition directory `<topic>-<partition>/` holds:

    00000000000000000000.log        record batches, stored verbatim (magic 2) except for the
                                    8-byte base offset (and, on request, the leader epoch and
                                    the LogAppendTime stamp) rewritten on append
    00000000000000000000.index      sparse offset index, appended: entries of OFFSET_ENTRY
    00000000000000000000.timeindex  sparse time index, appended: entries of TIME_ENTRY
    partition.state                 checked file: log start offset, recovery point, clean flag

The data directory holds `topics.meta`, a checked file with a JSON payload (see store.py).

A *checked file* is `CHECKED_HEADER` (magic, version, payload length, CRC-32C of the payload)
followed by the payload. It is always replaced atomically: write `<name>.tmp`, fsync it,
rename over `<name>`, fsync the directory. A reader either sees the old or the new file, and a
file that fails its checks raises `CorruptFileError`; nothing is ever parsed from a file whose
CRC does not match.

The record batch v2 header is read with a private `struct` here (the protocol package owns the
full record codec; storage needs only the 61-byte header and must not wait for it).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import NamedTuple

import crc32c

from onceflow.protocol.records import (  # noqa: F401  (re-exported for storage modules)
    ATTR_COMPRESSION_MASK,
    ATTR_CONTROL,
    ATTR_TIMESTAMP_TYPE,
    ATTR_TRANSACTIONAL,
    ATTRIBUTES_AT,
    BATCH_HEADER,
    CRC_AT,
    LOG_OVERHEAD_BYTES,
    MAX_TIMESTAMP_AT,
    BatchHeader,
)

# ---------------------------------------------------------------------------------------------
# Errors. Kafka error codes are chosen by the broker; these only name what went wrong here.


class StorageError(Exception):
    """Base class of the errors this package raises on purpose."""


class OffsetOutOfRange(StorageError):
    """A fetch/delete offset outside [log_start_offset, log_end_offset] (OFFSET_OUT_OF_RANGE)."""


class LogFailedError(StorageError):
    """A write or fsync of this log failed; the log refuses further work (KAFKA_STORAGE_ERROR).

    After a failed fsync the kernel may have dropped dirty pages, so nothing the log holds in
    memory can be trusted to be on disk: the broker must reopen (recover) the log.
    """


class LogClosedError(StorageError):
    """The log was closed (topic deleted or broker shutting down)."""


class CorruptFileError(StorageError):
    """A checked file (state, metadata) failed its magic/version/length/CRC checks."""


class CorruptLogError(StorageError):
    """Bytes the log had validated no longer parse: a broken invariant, never a peer's fault."""


class InvalidConfigError(StorageError):
    """A topic config name or value is not valid (the broker answers INVALID_CONFIG)."""


class UnknownTopicError(StorageError):
    """No such topic (UNKNOWN_TOPIC_OR_PARTITION)."""


class TopicExistsError(StorageError):
    """The topic already exists (TOPIC_ALREADY_EXISTS)."""


class InvalidTopicError(StorageError):
    """The topic name is not legal or collides with another (INVALID_TOPIC_EXCEPTION)."""


class InvalidPartitionsError(StorageError):
    """A partition count that is not allowed (INVALID_PARTITIONS)."""


# ---------------------------------------------------------------------------------------------
# Record batch v2 header.

# The batch format is declared once, in the protocol layer; storage uses the same
# header struct and NamedTuple (storage never parses records, only headers).
BATCH_HEADER_BYTES = BATCH_HEADER.size  # 61
BATCH_LENGTH_MIN = BATCH_HEADER_BYTES - LOG_OVERHEAD_BYTES  # a batch with zero records
CRC_START = ATTRIBUTES_AT  # the CRC covers [CRC_START, end of batch)
CRC_FIELD = struct.Struct(">I")
CRC_OFFSET = CRC_AT
ATTRIBUTES_OFFSET = ATTRIBUTES_AT
MAX_TIMESTAMP_OFFSET = MAX_TIMESTAMP_AT
MAGIC_V2 = 2
ATTR_LOG_APPEND_TIME = ATTR_TIMESTAMP_TYPE
NO_TIMESTAMP = -1  # Kafka's RecordBatch.NO_TIMESTAMP

# The 17 leading bytes rewritten on append: base_offset, batch_length (unchanged), leader epoch.
BASE_OFFSET_FIELD = struct.Struct(">q")
OFFSET_AND_EPOCH_FIELDS = struct.Struct(">qii")


def read_header(buf: bytes | memoryview, position: int = 0) -> BatchHeader:
    """The header at `position`; the caller guarantees BATCH_HEADER_BYTES are available."""
    return BatchHeader._make(BATCH_HEADER.unpack_from(buf, position))


def header_problem(header: BatchHeader, bytes_available: int) -> str | None:
    """Why a header cannot start a valid batch, or None. Checks only what is cheap."""
    if header.magic != MAGIC_V2:
        return f"magic {header.magic}"
    if header.batch_length < BATCH_LENGTH_MIN:
        return f"batch_length {header.batch_length} below {BATCH_LENGTH_MIN}"
    if header.size_bytes > bytes_available:
        return f"batch of {header.size_bytes} bytes runs past the end ({bytes_available} left)"
    if header.last_offset_delta < 0 or header.records_count < 0:
        return f"negative last_offset_delta/records_count in batch at {header.base_offset}"
    return None


def batch_crc(batch: bytes | memoryview | bytearray) -> int:
    return crc32c.crc32c(memoryview(batch)[CRC_START:])


# ---------------------------------------------------------------------------------------------
# Records inside an uncompressed batch (only ListOffsets by timestamp looks at them).


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """A zig-zag varint (records use them for lengths and deltas) and the next position."""
    shift = result = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def first_record_at_or_after(batch: bytes, header: BatchHeader, timestamp_ms: int, min_offset: int):
    """Walks the records of an uncompressed batch for the first one at or after both bounds;
    None if the records do not parse (then the batch-level answer is used)."""
    pos = BATCH_HEADER_BYTES
    try:
        for _ in range(header.records_count):
            length, pos = _read_varint(batch, pos)
            body = pos
            ts_delta, pos = _read_varint(batch, pos + 1)  # skip the record's attributes byte
            offset_delta, pos = _read_varint(batch, pos)
            offset, ts = header.base_offset + offset_delta, header.base_timestamp + ts_delta
            if offset >= min_offset and ts >= timestamp_ms:
                return offset, ts
            if length <= 0:
                return None
            pos = body + length
    except (IndexError, ValueError):
        return None
    return None


# ---------------------------------------------------------------------------------------------
# Segment files.

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
TMP_SUFFIX = ".tmp"
SEGMENT_NAME_DIGITS = 20  # enough for any non-negative int64 offset, sorts lexically


def segment_path(directory: Path, base_offset: int, suffix: str) -> Path:
    return directory / f"{base_offset:0{SEGMENT_NAME_DIGITS}d}{suffix}"


def parse_segment_name(name: str, suffix: str) -> int | None:
    """The base offset encoded in `name`, or None if it is not a segment file of `suffix`."""
    stem = name[: -len(suffix)] if name.endswith(suffix) else ""
    if len(stem) != SEGMENT_NAME_DIGITS or not stem.isdigit():
        return None
    return int(stem)


# ---------------------------------------------------------------------------------------------
# Checked files: versioned, CRC-protected, replaced atomically.

CHECKED_HEADER = struct.Struct(
    ">4s"  # magic: identifies the kind of file
    "H"  # version of the payload layout
    "I"  # payload length in bytes
    "I"  # CRC-32C of the payload
)
CHECKED_PAYLOAD_BYTES_MAX = 64 * 1024 * 1024  # topics.meta of ~100k topics; refuse absurd sizes

PARTITION_STATE_FILE = "partition.state"
PARTITION_STATE_MAGIC = b"OFPS"
PARTITION_STATE_VERSION = 1
PARTITION_STATE = struct.Struct(
    ">q"  # log_start_offset: first offset readable (DeleteRecords / retention)
    "q"  # recovery_point_offset: every offset below it was fsync'd
    "B"  # clean_shutdown: 1 when written by close() after a final flush
    "q"  # log_end_offset at close (only meaningful when clean_shutdown)
    "q"  # bytes of the active segment at close (only meaningful when clean_shutdown)
)


class PartitionState(NamedTuple):
    log_start_offset: int
    recovery_point_offset: int
    clean_shutdown: bool
    log_end_offset: int
    active_segment_bytes: int


def fsync_dir(directory: Path) -> None:
    """Makes created, renamed and removed entries of `directory` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_fully(fd: int, data: bytes | memoryview, position: int) -> None:
    """pwrite until every byte is written at `position` (short writes are retried)."""
    view = memoryview(data)
    written = 0
    while written < len(view):
        n = os.pwrite(fd, view[written:], position + written)
        if n <= 0:
            raise OSError(f"pwrite wrote {n} bytes")
        written += n


def replace_file(path: Path, data: bytes, fsync: bool = True, tmp: Path | None = None) -> None:
    """Temp file, fsync, rename, fsync of the directory: readers find the old or the new
    file, never half of one. `fsync=False` keeps the rename (tests, --no-fsync)."""
    tmp = tmp or path.with_name(path.name + TMP_SUFFIX)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        write_fully(fd, data, 0)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if fsync:
        fsync_dir(path.parent)


def write_checked_file(path: Path, magic: bytes, version: int, payload: bytes,
                       fsync: bool = True) -> None:
    """Atomically replaces `path` with a checked file holding `payload`."""
    if len(payload) > CHECKED_PAYLOAD_BYTES_MAX:
        raise AssertionError(f"{path.name}: payload of {len(payload)} bytes is too large")
    header = CHECKED_HEADER.pack(magic, version, len(payload), crc32c.crc32c(payload))
    replace_file(path, header + payload, fsync)


_READ_CHUNK_BYTES = 64 * 1024


def _read_at_most(path: str | Path, limit_bytes: int) -> bytes:
    """Up to `limit_bytes` of the file, with plain system calls (open, read until the end,
    close: a small state file costs four, where a buffered file object costs seven)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks: list[bytes] = []
        total = 0
        while total < limit_bytes:
            chunk = os.read(fd, min(limit_bytes - total, _READ_CHUNK_BYTES))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    finally:
        os.close(fd)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def read_checked_file(path: str | Path, magic: bytes, versions: tuple[int, ...]) -> tuple[int, bytes]:
    """(version, payload) of a checked file; raises FileNotFoundError or CorruptFileError."""
    data = _read_at_most(path, CHECKED_HEADER.size + CHECKED_PAYLOAD_BYTES_MAX + 1)
    if len(data) < CHECKED_HEADER.size:
        raise CorruptFileError(f"{path}: {len(data)} bytes, shorter than its header")
    found_magic, version, length, crc = CHECKED_HEADER.unpack_from(data, 0)
    payload = data[CHECKED_HEADER.size :]
    if found_magic != magic:
        raise CorruptFileError(f"{path}: magic {found_magic!r}, expected {magic!r}")
    if version not in versions:
        raise CorruptFileError(f"{path}: unsupported version {version}")
    if length != len(payload):
        raise CorruptFileError(f"{path}: payload is {len(payload)} bytes, header says {length}")
    if crc32c.crc32c(payload) != crc:
        raise CorruptFileError(f"{path}: CRC mismatch")
    return version, payload


def write_partition_state(directory: Path, state: PartitionState, fsync: bool = True) -> None:
    payload = PARTITION_STATE.pack(
        state.log_start_offset,
        state.recovery_point_offset,
        1 if state.clean_shutdown else 0,
        state.log_end_offset,
        state.active_segment_bytes,
    )
    path = directory / PARTITION_STATE_FILE
    write_checked_file(path, PARTITION_STATE_MAGIC, PARTITION_STATE_VERSION, payload, fsync)


def read_partition_state(directory: Path) -> PartitionState | None:
    """The persisted state, or None when there is none. Raises CorruptFileError."""
    path = f"{directory}/{PARTITION_STATE_FILE}"  # no pathlib join: read once per log open
    try:
        _, payload = read_checked_file(path, PARTITION_STATE_MAGIC, (PARTITION_STATE_VERSION,))
    except FileNotFoundError:
        return None
    if len(payload) != PARTITION_STATE.size:
        raise CorruptFileError(f"{path}: payload of {len(payload)} bytes")
    start, recovery, clean, end, active_bytes = PARTITION_STATE.unpack(payload)
    if clean not in (0, 1) or start < 0 or recovery < 0 or end < 0 or active_bytes < 0:
        raise CorruptFileError(f"{path}: field out of range")
    return PartitionState(start, recovery, clean == 1, end, active_bytes)
