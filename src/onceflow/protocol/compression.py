"""Decompressing record batches: the records of a batch whatever its codec.

Theory of operation. The broker keeps batches opaque on its hot paths (principle 2); only
two places need the records themselves: the produce check that a compacted topic's records
carry keys, and the log cleaner, which decides per key. `batch_records` gives the records
of one v2 batch: an uncompressed batch is decoded as it is; a compressed one has its
records section decompressed (bounded by `limit_bytes`, a decompression bomb fails instead
of filling memory) and is then decoded as the same batch uncompressed.

Codecs as Kafka writes them: gzip (RFC 1952), snappy (raw, or xerial-framed as the Java
client writes it), lz4 (the LZ4 frame format), zstd (a zstd frame).
"""

from __future__ import annotations

import struct
import zlib
from typing import NamedTuple

import cramjam
import lz4.frame
import zstandard

from onceflow.protocol.errors import CorruptRecord
from onceflow.protocol.records import (
    ATTR_COMPRESSION_MASK,
    ATTRIBUTES_AT,
    BATCH_HEADER,
    BATCH_HEADER_BYTES,
    BatchHeader,
    LOG_OVERHEAD_BYTES,
    Compression,
    Record,
    decode_records,
)

# Most bytes one batch may decompress to: Kafka reads records of a batch lazily; we hold
# them, so a small compressed batch must not grow without bound. Beyond Kafka's
# message.max.bytes default by far (a compacted topic's batch is decoded whole).
DECOMPRESSED_BYTES_MAX = 64 * 1024 * 1024
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER_BYTES = 16  # magic, version, compatible version
_INT32 = struct.Struct(">i")
_BATCH_LENGTH = struct.Struct(">i")  # after the base offset
_ATTRIBUTES = struct.Struct(">h")


def decompress(codec: int, data: bytes | memoryview, limit_bytes: int = DECOMPRESSED_BYTES_MAX
               ) -> bytes:
    """The decompressed records section; CorruptRecord if it is invalid or too large."""
    try:
        out = _DECOMPRESSORS[Compression(codec)](bytes(data), limit_bytes)
    except CorruptRecord:
        raise
    except Exception as exc:  # noqa: BLE001 - any codec failure is a corrupt batch
        raise CorruptRecord(f"{Compression(codec).name} records do not decompress: {exc}"
                            ) from None
    if len(out) > limit_bytes:
        raise CorruptRecord(f"records decompress to more than {limit_bytes} bytes")
    return out


def _gzip(data: bytes, limit: int) -> bytes:
    return zlib.decompressobj(wbits=16 + zlib.MAX_WBITS).decompress(data, limit + 1)


def _snappy_raw(data: bytes, limit: int) -> bytes:
    if cramjam.snappy.decompress_raw_len(data) > limit:
        raise CorruptRecord(f"records decompress to more than {limit} bytes")
    return bytes(cramjam.snappy.decompress_raw(data))


def _snappy(data: bytes, limit: int) -> bytes:
    if not data.startswith(_XERIAL_MAGIC):
        return _snappy_raw(data, limit)
    chunks, pos, total = [], _XERIAL_HEADER_BYTES, 0
    while pos < len(data):
        (length,) = _INT32.unpack_from(data, pos)
        if length < 0 or pos + 4 + length > len(data):
            raise CorruptRecord("xerial snappy chunk length out of bounds")
        chunk = _snappy_raw(data[pos + 4:pos + 4 + length], limit - total)
        total += len(chunk)
        chunks.append(chunk)
        pos += 4 + length
    return b"".join(chunks)


def _lz4(data: bytes, limit: int) -> bytes:
    return lz4.frame.LZ4FrameDecompressor().decompress(data, max_length=limit + 1)


def _zstd(data: bytes, limit: int) -> bytes:
    with zstandard.ZstdDecompressor().stream_reader(data) as reader:
        return reader.read(limit + 1)


_DECOMPRESSORS = {
    Compression.NONE: lambda data, limit: data,
    Compression.GZIP: _gzip,
    Compression.SNAPPY: _snappy,
    Compression.LZ4: _lz4,
    Compression.ZSTD: _zstd,
}


class KeyedRecord(NamedTuple):
    """What the log cleaner needs of a record: its offset, key and whether it has a value."""

    offset: int
    key: bytes | None
    has_value: bool


def _records_section(batch: bytes | memoryview, limit_bytes: int) -> tuple[BatchHeader, bytes]:
    view = memoryview(batch).cast("B")
    if len(view) < BATCH_HEADER_BYTES:
        raise CorruptRecord("truncated batch header")
    header = BatchHeader._make(BATCH_HEADER.unpack_from(view, 0))
    section = view[BATCH_HEADER_BYTES:min(len(view), header.size_bytes)]
    if header.compression == Compression.NONE:
        return header, bytes(section)
    return header, decompress(header.compression, section, limit_bytes)


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """A zigzag varint at `pos` (IndexError past the end); one byte is the fast path."""
    byte = data[pos]
    if byte < 0x80:
        return (byte >> 1) ^ -(byte & 1), pos + 1
    zigzag, shift = 0, 0
    while True:
        byte = data[pos]
        pos += 1
        zigzag |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (zigzag >> 1) ^ -(zigzag & 1), pos
        shift += 7
        if shift > 63:
            raise CorruptRecord("varint longer than 10 bytes", position=pos)


def batch_keys(batch: bytes | memoryview, limit_bytes: int = DECOMPRESSED_BYTES_MAX
               ) -> list[KeyedRecord]:
    """Offset, key and value presence of each record of one v2 batch: the cleaner's hot
    path, which skips timestamps' use, values and headers (CorruptRecord)."""
    header, data = _records_section(batch, limit_bytes)
    out, pos, end = [], 0, len(data)
    try:
        for _ in range(header.records_count):
            length, pos = _varint(data, pos)
            record_end = pos + length
            if length <= 0 or record_end > end:
                raise CorruptRecord(f"record length {length} out of bounds", position=pos)
            _timestamp_delta, at = _varint(data, pos + 1)  # +1: the attributes byte
            offset_delta, at = _varint(data, at)
            key_length, at = _varint(data, at)
            key = None if key_length < 0 else data[at:at + key_length]
            value_length, at = _varint(data, at + max(key_length, 0))
            if at > record_end or key_length < -1 or value_length < -1:
                raise CorruptRecord("record fields out of bounds", position=pos)
            out.append(KeyedRecord(header.base_offset + offset_delta, key, value_length >= 0))
            pos = record_end
    except IndexError:
        raise CorruptRecord("batch ends inside a record", position=pos) from None
    if pos != end:
        raise CorruptRecord(f"{end - pos} bytes after the last record", position=pos)
    return out


def plain_batch(batch: bytes | memoryview, limit_bytes: int = DECOMPRESSED_BYTES_MAX
                ) -> bytes | memoryview:
    """The batch itself if uncompressed, else the same batch with its records section
    decompressed and the compression bits cleared (CRC not recomputed: for reading)."""
    view = memoryview(batch).cast("B")
    if len(view) < BATCH_HEADER_BYTES:
        raise CorruptRecord("truncated batch header")
    header = BatchHeader._make(BATCH_HEADER.unpack_from(view, 0))
    if header.compression == Compression.NONE:
        return batch
    body = decompress(header.compression, view[BATCH_HEADER_BYTES:header.size_bytes],
                      limit_bytes)
    return b"".join((
        view[:8],
        _BATCH_LENGTH.pack(BATCH_HEADER_BYTES - LOG_OVERHEAD_BYTES + len(body)),
        view[12:ATTRIBUTES_AT],
        _ATTRIBUTES.pack(header.attributes & ~ATTR_COMPRESSION_MASK),
        view[ATTRIBUTES_AT + 2:BATCH_HEADER_BYTES],
        body,
    ))


def batch_records(batch: bytes | memoryview, limit_bytes: int = DECOMPRESSED_BYTES_MAX
                  ) -> list[Record]:
    """The records of one v2 batch, decompressed if need be (CorruptRecord)."""
    return decode_records(plain_batch(batch, limit_bytes))
