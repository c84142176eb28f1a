"""Test helpers: build valid magic-2 record batches (correct CRC-32C) without the protocol
package, and small utilities shared by the storage tests."""

from __future__ import annotations

import struct

import crc32c

from onceflow.storage.layout import BATCH_HEADER, read_header

_AFTER_CRC = struct.Struct(">hiqqqhii")  # attributes .. records_count
_BEFORE_CRC = struct.Struct(">qiibI")  # base_offset, batch_length, leader epoch, magic, crc


def _varint(value: int) -> bytes:
    zigzag = (value << 1) ^ (value >> 63)
    out = bytearray()
    while True:
        byte = zigzag & 0x7F
        zigzag >>= 7
        if zigzag:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _record(offset_delta: int, timestamp_delta: int, value: bytes) -> bytes:
    body = b"\x00" + _varint(timestamp_delta) + _varint(offset_delta) + _varint(-1)
    body += _varint(len(value)) + value + _varint(0)
    return _varint(len(body)) + body


def make_batch(
    values: list[bytes] | int,
    *,
    base_offset: int = 0,
    base_timestamp_ms: int = 1_000,
    timestamp_step_ms: int = 0,
    attributes: int = 0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    leader_epoch: int = -1,
) -> bytes:
    """An uncompressed v2 batch of `values` (or that many 1-byte values)."""
    if isinstance(values, int):
        values = [bytes([i % 256]) for i in range(values)]
    records = b"".join(_record(i, i * timestamp_step_ms, v) for i, v in enumerate(values))
    max_ts = base_timestamp_ms + (len(values) - 1) * timestamp_step_ms
    after_crc = (
        _AFTER_CRC.pack(
            attributes,
            len(values) - 1,
            base_timestamp_ms,
            max_ts,
            producer_id,
            producer_epoch,
            base_sequence,
            len(values),
        )
        + records
    )
    batch_length = 4 + 1 + 4 + len(after_crc)
    head = _BEFORE_CRC.pack(base_offset, batch_length, leader_epoch, 2, crc32c.crc32c(after_crc))
    batch = head + after_crc
    assert len(batch) == 12 + batch_length and BATCH_HEADER.size == 61
    return batch


def split_batches(data: bytes) -> list[bytes]:
    """The whole batches in `data` (asserts there is no partial one)."""
    out, pos = [], 0
    while pos < len(data):
        size = read_header(data, pos).size_bytes
        assert pos + size <= len(data), "partial batch returned"
        out.append(data[pos : pos + size])
        pos += size
    return out


def with_base_offset(batch: bytes, offset: int) -> bytes:
    return struct.pack(">q", offset) + batch[8:]


def crc_ok(batch: bytes) -> bool:
    return crc32c.crc32c(batch[21:]) == read_header(batch).crc
