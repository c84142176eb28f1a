"""Record batch v2: header layout, iteration bounds, CRC, rewrites, markers."""

from __future__ import annotations

import struct

import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from onceflow.protocol.errors import (
    CorruptRecord,
    InvalidRecord,
    RecordError,
    UnsupportedCompression,
    UnsupportedMagic,
)
from onceflow.protocol.records import (
    ATTR_CONTROL,
    ATTR_TRANSACTIONAL,
    BATCH_HEADER,
    BATCH_HEADER_BYTES,
    EndTxnMarker,
    SimpleRecord,
    TimestampType,
    build_batch,
    build_control_batch,
    check_produce_records,
    crc_ok,
    decode_records,
    end_txn_marker,
    increment_sequence,
    iter_batches,
    last_sequence,
    with_base_offset,
    with_log_append_time,
)

RECORDS = [
    SimpleRecord(key=b"k1", value=b"v1", timestamp_ms=1_000),
    SimpleRecord(key=None, value=b"v2", headers=(("h", b"x"), ("n", None)), timestamp_ms=1_005),
    SimpleRecord(key=b"k3", value=None, timestamp_ms=999),
]


def sample_batch(**overrides: object) -> bytes:
    options: dict[str, object] = {"base_offset": 0, "producer_id": 7, "producer_epoch": 1,
                                  "base_sequence": 10}  # fmt: skip
    options.update(overrides)
    return build_batch(RECORDS, **options)  # type: ignore[arg-type]


def test_header_is_61_bytes() -> None:
    assert BATCH_HEADER.size == BATCH_HEADER_BYTES == 61


def test_build_iterate_crc() -> None:
    batch = sample_batch(base_offset=40)
    ((header, view),) = list(iter_batches(batch))
    assert bytes(view) == batch and crc_ok(view)
    assert header.magic == 2 and header.size_bytes == len(batch)
    assert (header.base_offset, header.last_offset_delta, header.last_offset) == (40, 2, 42)
    assert (header.base_timestamp, header.max_timestamp) == (1_000, 1_005)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (7, 1, 10)
    assert header.last_sequence == 12 and header.records_count == 3
    assert not header.is_transactional and not header.is_control
    assert header.timestamp_type == TimestampType.CREATE_TIME


def test_crc_is_kafkas_crc32c_of_attributes_to_end() -> None:
    batch = sample_batch()
    (stored,) = struct.unpack_from(">I", batch, 17)
    assert stored == crc32c(batch[21:])


def test_decode_records() -> None:
    records = decode_records(sample_batch(base_offset=100))
    assert [(r.offset, r.timestamp_ms, r.key, r.value) for r in records] == [
        (100, 1_000, b"k1", b"v1"), (101, 1_005, None, b"v2"), (102, 999, b"k3", None),
    ]  # fmt: skip
    assert records[1].headers == (("h", b"x"), ("n", None))


@pytest.mark.parametrize("position", [21, 30, 60, 61, 70, -1])
def test_flipped_byte_fails_the_crc(position: int) -> None:
    batch = bytearray(sample_batch())
    batch[position] ^= 0x01
    ((_, view),) = list(iter_batches(batch))
    assert not crc_ok(view)


def test_with_base_offset_keeps_the_crc() -> None:
    batch = sample_batch()
    moved = with_base_offset(memoryview(batch), 1 << 40, partition_leader_epoch=3)
    ((header, view),) = list(iter_batches(moved))
    assert (header.base_offset, header.partition_leader_epoch) == (1 << 40, 3)
    assert crc_ok(view) and moved[16:] == batch[16:]
    assert with_base_offset(batch, 5)[8:] == batch[8:]


def test_with_log_append_time_recomputes_the_crc() -> None:
    stamped = with_log_append_time(sample_batch(), 1_700_000_000_000)
    ((header, view),) = list(iter_batches(stamped))
    assert crc_ok(view)
    assert header.timestamp_type == TimestampType.LOG_APPEND_TIME
    assert (header.max_timestamp, header.base_timestamp) == (1_700_000_000_000, 1_000)
    assert {record.timestamp_ms for record in decode_records(stamped)} == {1_700_000_000_000}


@pytest.mark.parametrize(("commit", "control_type"), [(True, 1), (False, 0)])
def test_control_batch(commit: bool, control_type: int) -> None:
    batch = build_control_batch(producer_id=9, producer_epoch=4, commit=commit,
                                coordinator_epoch=12, timestamp_ms=5_000)  # fmt: skip
    ((header, view),) = list(iter_batches(batch))
    assert crc_ok(view)
    assert header.attributes == ATTR_TRANSACTIONAL | ATTR_CONTROL
    assert header.is_control and header.is_transactional
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (9, 4, -1)
    (record,) = decode_records(batch)
    assert record.key == struct.pack(">hh", 0, control_type)  # ControlRecordType v0
    assert record.value == struct.pack(">hi", 0, 12)  # EndTransactionMarker v0
    assert record.timestamp_ms == 5_000
    assert end_txn_marker(batch) == EndTxnMarker(commit, 12)


def test_several_batches_in_one_blob() -> None:
    blob = sample_batch(base_offset=0) + sample_batch(base_offset=3) + sample_batch(base_offset=6)
    assert [header.base_offset for header, _ in iter_batches(blob)] == [0, 3, 6]


@pytest.mark.parametrize("cut", [1, 16, 17, 60, 61, 90])
def test_partial_trailing_batch_is_corrupt(cut: int) -> None:
    batch = sample_batch()
    blob = batch + batch[:cut]
    with pytest.raises(CorruptRecord) as raised:
        list(iter_batches(blob))
    assert raised.value.position == len(batch)


def test_bad_lengths_and_magic() -> None:
    batch = bytearray(sample_batch())
    struct.pack_into(">i", batch, 8, 48)  # below the 49-byte minimum
    with pytest.raises(CorruptRecord):
        list(iter_batches(batch))
    struct.pack_into(">i", batch, 8, 2**31 - 1)  # past the end
    with pytest.raises(CorruptRecord):
        list(iter_batches(batch))
    batch = bytearray(sample_batch())
    batch[16] = 1
    with pytest.raises(UnsupportedMagic):
        list(iter_batches(batch))


def test_check_produce_records() -> None:
    header, _ = check_produce_records(sample_batch(), 9)
    assert header.records_count == 3
    with pytest.raises(InvalidRecord):
        check_produce_records(b"", 9)
    with pytest.raises(InvalidRecord):
        check_produce_records(sample_batch() + sample_batch(), 9)
    control = build_control_batch(producer_id=1, producer_epoch=0, commit=True,
                                  coordinator_epoch=0, timestamp_ms=0)  # fmt: skip
    with pytest.raises(InvalidRecord):
        check_produce_records(control, 9)
    corrupt = bytearray(sample_batch())
    corrupt[-1] ^= 0xFF
    with pytest.raises(CorruptRecord):
        check_produce_records(corrupt, 9)


def set_compression(batch: bytes, codec: int) -> bytes:
    out = bytearray(batch)
    (attributes,) = struct.unpack_from(">h", out, 21)
    struct.pack_into(">h", out, 21, (attributes & ~7) | codec)
    struct.pack_into(">I", out, 17, crc32c(bytes(out[21:])))
    return bytes(out)


def test_check_produce_records_compression_rules() -> None:
    zstd = set_compression(sample_batch(), 4)
    assert check_produce_records(zstd, 7)[0].compression == 4
    with pytest.raises(UnsupportedCompression):
        check_produce_records(zstd, 6)
    with pytest.raises(UnsupportedCompression):
        check_produce_records(set_compression(sample_batch(), 5), 9)


def test_check_produce_records_count_must_match_offsets() -> None:
    batch = bytearray(sample_batch())
    struct.pack_into(">i", batch, 57, 2)  # records_count 2, last_offset_delta 2
    struct.pack_into(">I", batch, 17, crc32c(bytes(batch[21:])))
    with pytest.raises(InvalidRecord):
        check_produce_records(batch, 9)


@pytest.mark.parametrize(
    ("base", "delta", "expected"),
    [(0, 4, 4), (-1, 4, -1), (2**31 - 1, 1, 0), (2**31 - 3, 5, 2), (2**31 - 5, 4, 2**31 - 1)],
)
def test_sequences_wrap_like_kafka(base: int, delta: int, expected: int) -> None:
    assert last_sequence(base, delta) == expected


def test_increment_sequence() -> None:
    assert increment_sequence(2**31 - 1, 1) == 0
    assert increment_sequence(5, 3) == 8


def test_decode_records_refuses_bad_lengths() -> None:
    batch = bytearray(sample_batch())
    batch[BATCH_HEADER_BYTES] = 0x7E  # first record length: 63, past its real size
    with pytest.raises(CorruptRecord):
        decode_records(batch)
    truncated = sample_batch()[:-3]
    with pytest.raises(CorruptRecord):
        decode_records(truncated)


record_strategy = st.builds(
    SimpleRecord,
    key=st.none() | st.binary(max_size=40),
    value=st.none() | st.binary(max_size=200),
    headers=st.lists(
        st.tuples(st.text(max_size=10), st.none() | st.binary(max_size=10)), max_size=3
    ).map(tuple),
    timestamp_ms=st.none() | st.integers(min_value=0, max_value=2**41),
)


@settings(max_examples=150, deadline=None)
@given(
    records=st.lists(record_strategy, min_size=1, max_size=8),
    base_offset=st.integers(min_value=0, max_value=2**62),
    base_timestamp_ms=st.integers(min_value=0, max_value=2**41),
)
def test_build_decode_round_trip(
    records: list[SimpleRecord], base_offset: int, base_timestamp_ms: int
) -> None:
    batch = build_batch(records, base_offset=base_offset, base_timestamp_ms=base_timestamp_ms)
    ((header, view),) = list(iter_batches(batch))
    assert crc_ok(view)
    decoded = decode_records(view)
    assert [record.offset for record in decoded] == [
        base_offset + index for index in range(len(records))
    ]
    for original, record in zip(records, decoded, strict=True):
        expected_ts = base_timestamp_ms if original.timestamp_ms is None else original.timestamp_ms
        assert (record.key, record.value, record.headers) == (
            original.key, original.value, original.headers,
        )  # fmt: skip
        assert record.timestamp_ms == expected_ts


@settings(max_examples=300, deadline=None)
@given(blob=st.binary(max_size=300), mutation=st.tuples(st.integers(0, 400), st.binary(max_size=8)))
def test_only_record_errors_escape(blob: bytes, mutation: tuple[int, bytes]) -> None:
    position, patch = mutation
    candidates = [blob, sample_batch()[:position] + patch + sample_batch()[position + len(patch) :]]
    for candidate in candidates:
        try:
            for header, view in iter_batches(candidate):
                crc_ok(view)
                if header.compression == 0:  # decode_records reads uncompressed batches
                    decode_records(view)
        except RecordError:
            pass
