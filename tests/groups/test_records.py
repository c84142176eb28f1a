"""__consumer_offsets records: Kafka's byte layout, round trips, bounded decoding."""

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from onceflow.groups.records import (
    GroupMetadataKey,
    GroupMetadataValue,
    MemberMetadataValue,
    OffsetCommitKey,
    OffsetCommitValue,
    RecordFormatError,
    decode_group_metadata_value,
    decode_key,
    decode_offset_commit_value,
    encode_group_metadata_key,
    encode_group_metadata_value,
    encode_offset_commit_key,
    encode_offset_commit_value,
    java_string_hashcode,
    partition_for,
)

names = st.text(max_size=40)
int32 = st.integers(-(2**31), 2**31 - 1)
int64 = st.integers(-(2**63), 2**63 - 1)


@pytest.mark.parametrize("s,expected", [
    ("", 0),
    ("a", 97),
    ("hello", 99162322),
    ("polygenelubricants", -(2**31)),  # the classic Integer.MIN_VALUE hash
    ("\U0001F600", 0xD83D * 31 + 0xDE00),  # hashed as its two UTF-16 surrogates
])
def test_java_string_hashcode(s, expected):
    assert java_string_hashcode(s) == expected


def test_partition_for_uses_kafkas_abs():
    # Math.abs(MIN_VALUE) is negative in Java; Kafka's Utils.abs maps it to 0
    assert partition_for("polygenelubricants", 50) == 0
    assert partition_for("hello", 50) == 99162322 % 50
    assert partition_for("a", 1) == 0
    assert all(0 <= partition_for(f"group-{i}", 50) < 50 for i in range(200))


def test_golden_key_bytes_are_kafkas_layout():
    # version 1, "g", "t", partition 0
    assert encode_offset_commit_key(OffsetCommitKey("g", "t", 0)) == bytes.fromhex(
        "0001" "00016" "7" "0001" "74" "00000000")
    assert encode_group_metadata_key(GroupMetadataKey("g")) == bytes.fromhex("0002" "0001" "67")


def test_golden_offset_value_v3():
    value = OffsetCommitValue(offset=42, leader_epoch=7, metadata="m", commit_timestamp_ms=1000)
    assert encode_offset_commit_value(value) == (
        struct.pack(">hqi", 3, 42, 7) + struct.pack(">h", 1) + b"m" + struct.pack(">q", 1000))


@given(names, names, int32)
def test_offset_key_round_trip(group, topic, partition):
    key = OffsetCommitKey(group, topic, partition)
    assert decode_key(encode_offset_commit_key(key)) == key


@given(names)
def test_group_key_round_trip(group):
    assert decode_key(encode_group_metadata_key(GroupMetadataKey(group))) == GroupMetadataKey(group)


@given(int64, int32, names, int64, st.one_of(st.just(-1), st.integers(0, 2**62)))
def test_offset_value_round_trip(offset, epoch, metadata, commit_ts, expire_ts):
    value = OffsetCommitValue(offset, epoch, metadata, commit_ts, expire_ts)
    decoded = decode_offset_commit_value(encode_offset_commit_value(value))
    if expire_ts >= 0:  # written as v1, which has no leader epoch (as in Kafka)
        assert decoded == OffsetCommitValue(offset, -1, metadata, commit_ts, expire_ts)
    else:
        assert decoded == value


members = st.builds(MemberMetadataValue, names, st.one_of(st.none(), names), names, names,
                    int32, int32, st.binary(max_size=50), st.binary(max_size=50))


@given(names, int32, st.one_of(st.none(), names), st.one_of(st.none(), names), int64,
       st.lists(members, max_size=5))
def test_group_value_round_trip(ptype, generation, protocol, leader, ts, ms):
    ms = [m for m in ms if m.rebalance_timeout_ms != -1]  # -1 decodes as "use the session timeout"
    value = GroupMetadataValue(ptype, generation, protocol, leader, ts, tuple(ms))
    assert decode_group_metadata_value(encode_group_metadata_value(value)) == value


def test_decodes_older_value_versions():
    v0 = struct.pack(">hq", 0, 5) + struct.pack(">h", 0) + struct.pack(">q", 9)
    assert decode_offset_commit_value(v0) == OffsetCommitValue(5, -1, "", 9, -1)
    # GroupMetadataValue v0: no state timestamp, no instance id, no rebalance timeout
    member = (struct.pack(">h", 1) + b"m" + struct.pack(">h", 1) + b"c" + struct.pack(">h", 1)
              + b"h" + struct.pack(">i", 3000) + struct.pack(">i", 2) + b"su"
              + struct.pack(">i", 1) + b"a")
    g0 = (struct.pack(">h", 0) + struct.pack(">h", 8) + b"consumer" + struct.pack(">i", 4)
          + struct.pack(">h", 5) + b"range" + struct.pack(">h", 1) + b"m" + struct.pack(">i", 1)
          + member)
    value = decode_group_metadata_value(g0)
    assert value.generation == 4 and value.current_state_timestamp_ms == -1
    assert value.members == (MemberMetadataValue("m", None, "c", "h", 3000, 3000, b"su", b"a"),)


@pytest.mark.parametrize("data", [
    b"",
    b"\x00",
    b"\x00\x07\x00\x00",  # unknown key version
    encode_offset_commit_key(OffsetCommitKey("g", "t", 1))[:-1],  # truncated
    encode_offset_commit_key(OffsetCommitKey("g", "t", 1)) + b"x",  # trailing
    b"\x00\x02\x00\x05ab",  # string longer than the bytes left
])
def test_malformed_keys_raise(data):
    with pytest.raises(RecordFormatError):
        decode_key(data)


def test_member_count_is_checked_against_remaining_bytes():
    head = (struct.pack(">h", 3) + struct.pack(">h", 0) + struct.pack(">i", 1)
            + struct.pack(">hh", -1, -1) + struct.pack(">q", 0))
    with pytest.raises(RecordFormatError, match="member count"):
        decode_group_metadata_value(head + struct.pack(">i", 2**31 - 1))


@given(st.binary(max_size=64))
def test_decoders_only_raise_record_format_error(data):
    for decode in (decode_key, decode_offset_commit_value, decode_group_metadata_value):
        try:
            decode(data)
        except RecordFormatError:
            pass
