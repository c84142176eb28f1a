"""__transaction_state records: Kafka's byte layout (v0 and v1), round trips, bounded decoding."""

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from onceflow.groups import records as group_records
from onceflow.txn import TopicPartition, TxnMetadata, TxnState
from onceflow.txn import records as r
from onceflow.txn.records import RecordFormatError, TxnLogValue


def test_key_layout():
    assert r.encode_key("tx") == b"\x00\x00" + b"\x00\x02" + b"tx"
    assert r.decode_key(b"\x00\x00\x00\x02tx") == "tx"
    with pytest.raises(RecordFormatError, match="key version"):
        r.decode_key(b"\x00\x01\x00\x02tx")
    with pytest.raises(RecordFormatError):
        r.decode_key(b"\x00\x00\x00\x05tx")


def v0_bytes(status: int, partitions) -> bytes:
    """TransactionLogValue v0 built by hand from TransactionLogValue.json."""
    out = struct.pack(">hqhib", 0, 42, 3, 60_000, status)
    if partitions is None:
        out += struct.pack(">i", -1)
    else:
        out += struct.pack(">i", len(partitions))
        for topic, ids in partitions:
            out += struct.pack(">h", len(topic)) + topic.encode() + struct.pack(">i", len(ids))
            out += b"".join(struct.pack(">i", p) for p in ids)
    return out + struct.pack(">qq", 2_000, 1_000)


def test_value_v0_layout_both_ways():
    value = TxnLogValue(42, 3, 60_000, 1, (("a", (0, 2)),), 2_000, 1_000)
    data = v0_bytes(1, [("a", (0, 2))])
    assert r.encode_value(value, version=0) == data
    assert r.decode_value(data) == value
    assert r.decode_value(v0_bytes(0, None)).transaction_partitions is None


def test_value_v1_layout_with_tags():
    value = TxnLogValue(42, 3, 60_000, 1, (("a", (7,)),), 2_000, 1_000,
                        previous_producer_id=41)
    expected = (struct.pack(">hqhib", 1, 42, 3, 60_000, 1)
                + bytes([2])  # compact array: 1 topic
                + bytes([2]) + b"a" + bytes([2]) + struct.pack(">i", 7) + bytes([0])
                + struct.pack(">qq", 2_000, 1_000)
                + bytes([1, 0, 8]) + struct.pack(">q", 41))  # one tag: 0, 8 bytes
    assert r.encode_value(value) == expected
    assert r.decode_value(expected) == value


def test_v1_defaults_are_not_written_and_unknown_tags_are_skipped():
    value = TxnLogValue(1, 0, 1_000, 0, None, 5, -1)
    data = r.encode_value(value)
    assert data.endswith(bytes([0]))  # no tagged fields at all
    with_unknown = data[:-1] + bytes([1, 9, 2, 0xAB, 0xCD])  # tag 9, 2 bytes
    assert r.decode_value(with_unknown) == value


@pytest.mark.parametrize("cut", range(1, 40))
def test_truncated_values_raise(cut):
    data = r.encode_value(TxnLogValue(42, 3, 60_000, 1, (("topic", (0, 1)),), 2, 1,
                                      previous_producer_id=41))
    if cut < len(data):
        with pytest.raises(RecordFormatError):
            r.decode_value(data[:cut])


def test_bad_input_raises_format_error():
    with pytest.raises(RecordFormatError, match="version"):
        r.decode_value(struct.pack(">h", 2) + b"\x00" * 40)
    huge_count = struct.pack(">hqhib", 0, 1, 0, 1, 1) + struct.pack(">i", 10**6)
    with pytest.raises(RecordFormatError, match="does not fit"):
        r.decode_value(huge_count)
    with pytest.raises(RecordFormatError, match="trailing"):
        r.decode_value(r.encode_value(TxnLogValue(1, 0, 1, 0, None, 1, -1)) + b"\x00")
    with pytest.raises(RecordFormatError, match="varint"):
        r.decode_value(struct.pack(">hqhib", 1, 1, 0, 1, 1) + b"\xff" * 6)


names = st.text(min_size=1, max_size=20)
int64 = st.integers(-(2**63), 2**63 - 1)
values = st.builds(
    TxnLogValue, int64, st.integers(-(2**15), 2**15 - 1), st.integers(-(2**31), 2**31 - 1),
    st.integers(0, 7),
    st.none() | st.lists(st.tuples(names, st.lists(st.integers(0, 2**31 - 1), max_size=5)
                                   .map(tuple)), max_size=4).map(tuple),
    int64, int64, previous_producer_id=int64, next_producer_id=int64,
    client_transaction_version=st.integers(-(2**15), 2**15 - 1))


@given(values, st.sampled_from([0, 1]))
def test_round_trip(value, version):
    decoded = r.decode_value(r.encode_value(value, version))
    if version == 0:  # v0 has no tagged fields
        value = TxnLogValue(*[getattr(value, f) for f in (
            "producer_id", "producer_epoch", "transaction_timeout_ms", "transaction_status",
            "transaction_partitions", "transaction_last_update_timestamp_ms",
            "transaction_start_timestamp_ms")])
    assert decoded == value


@given(st.binary(max_size=80))
def test_garbage_only_raises_format_error(data):
    try:
        r.decode_value(data)
    except RecordFormatError:
        pass


def test_metadata_to_value_and_back():
    meta = TxnMetadata("tx", 7, 2, 30_000, TxnState.ONGOING,
                       frozenset({TopicPartition("b", 1), TopicPartition("a", 3),
                                  TopicPartition("a", 0)}), 10, 20, previous_producer_id=7)
    value = meta.to_value()
    assert value.transaction_partitions == (("a", (0, 3)), ("b", (1,)))
    assert TxnMetadata.from_value("tx", r.decode_value(r.encode_value(value))) == meta
    empty = TxnMetadata("tx", 7, 3, 30_000, TxnState.EMPTY, frozenset(), -1, 20)
    assert empty.to_value().transaction_partitions is None  # Kafka writes null in Empty
    bad = TxnLogValue(7, 0, 1, 9, None, 1, -1)
    with pytest.raises(RecordFormatError, match="state id"):
        TxnMetadata.from_value("tx", bad)


def test_partition_function_is_the_group_coordinators():
    assert r.partition_for is group_records.partition_for
    assert r.java_string_hashcode("hello") == 99162322  # Java's "hello".hashCode()
    assert all(0 <= r.partition_for(f"txn-{i}", 50) < 50 for i in range(200))
