"""Record decompression for the broker's compacted-topic paths: every codec as Kafka
writes it, `batch_keys` agreeing with the full decoder, bounds on what a batch may
decompress to."""

from __future__ import annotations

import gzip
import struct

import cramjam
import lz4.frame
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from onceflow.protocol.compression import batch_keys, batch_records
from onceflow.protocol.errors import CorruptRecord
from onceflow.protocol.records import (
    ATTRIBUTES_AT,
    BATCH_HEADER_BYTES,
    LOG_OVERHEAD_BYTES,
    Compression,
    SimpleRecord,
    build_batch,
)


def _xerial(data: bytes) -> bytes:
    chunk = bytes(cramjam.snappy.compress_raw(data))
    return b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1) + struct.pack(">i", len(chunk)) + chunk


CODECS = {
    Compression.GZIP: gzip.compress,
    Compression.SNAPPY: lambda data: bytes(cramjam.snappy.compress_raw(data)),
    Compression.LZ4: lz4.frame.compress,
    Compression.ZSTD: lambda data: zstandard.ZstdCompressor().compress(data),
}


def _compressed(batch: bytes, codec: int, compress=None) -> bytes:
    """The same batch with its records section compressed (CRC not recomputed: unread)."""
    body = (compress or CODECS[codec])(batch[BATCH_HEADER_BYTES:])
    attributes = struct.unpack_from(">h", batch, ATTRIBUTES_AT)[0] | codec
    return b"".join((batch[:8], struct.pack(">i", BATCH_HEADER_BYTES - LOG_OVERHEAD_BYTES
                                            + len(body)),
                     batch[12:ATTRIBUTES_AT], struct.pack(">h", attributes),
                     batch[ATTRIBUTES_AT + 2:BATCH_HEADER_BYTES], body))


records = st.lists(st.builds(
    SimpleRecord,
    st.none() | st.binary(max_size=300),
    st.none() | st.binary(max_size=300),
    st.lists(st.tuples(st.text(max_size=5), st.none() | st.binary(max_size=5)), max_size=2)
    .map(tuple), st.none()), min_size=1, max_size=20)


@settings(max_examples=60, deadline=None)
@given(records, st.sampled_from([Compression.NONE, *CODECS]), st.integers(0, 10**9))
def test_batch_keys_agree_with_the_full_decoder(simple, codec, base_offset):
    batch = build_batch(simple, base_offset=base_offset, base_timestamp_ms=1)
    if codec != Compression.NONE:
        batch = _compressed(batch, codec)
    full = batch_records(batch)
    assert [(r.key, r.value) for r in full] == [(r.key, r.value) for r in simple]
    assert [(k.offset, k.key, k.has_value) for k in batch_keys(batch)] == \
        [(r.offset, r.key, r.value is not None) for r in full]


def test_xerial_framed_snappy_as_the_java_client_writes_it():
    batch = build_batch([SimpleRecord(b"k", b"v" * 100)])
    assert batch_records(_compressed(batch, Compression.SNAPPY, _xerial))[0].value == b"v" * 100


def test_a_decompression_bomb_is_refused():
    batch = build_batch([SimpleRecord(b"k", b"\0" * 1_000_000)])
    bomb = _compressed(batch, Compression.ZSTD)
    assert len(bomb) < 1_000
    with pytest.raises(CorruptRecord):
        batch_records(bomb, limit_bytes=100_000)
    with pytest.raises(CorruptRecord):
        batch_keys(_compressed(batch, Compression.GZIP), limit_bytes=100_000)


def test_garbage_is_a_corrupt_record():
    batch = build_batch([SimpleRecord(b"k", b"v")])
    with pytest.raises(CorruptRecord):
        batch_keys(batch[:-3])
    with pytest.raises(CorruptRecord):
        batch_records(_compressed(batch, Compression.LZ4, lambda data: b"not lz4"))
