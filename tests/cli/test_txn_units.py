"""The pure parts of `onceflow txn`: which open transactions are hanging, and the small
wire client's decoding (timestamps of -1, response header tagged fields, bad frames)."""

from __future__ import annotations

import io
import socket
import struct

import pytest
from kio.serial import entity_writer

from onceflow.client.transactions import (
    NO_OFFSET,
    DescribedTransaction,
    ProducerState,
    hanging_transactions,
    open_transactions,
)
from onceflow.client.wire import Connection, WireError, decode_response
from onceflow.protocol.apis import ApiKey
from onceflow.protocol.codec import build_entity, response_type

NOW_MS = 10_000_000
PARTITION = ("orders", 0)


def producer(producer_id: int, txn_start_offset: int = 7, idle_ms: int = 60_000) -> ProducerState:
    return ProducerState(PARTITION, producer_id, 3, 1, 41, NOW_MS - idle_ms, txn_start_offset)


def described(producer_id: int, partitions: frozenset, state: str = "Ongoing") -> DescribedTransaction:
    return DescribedTransaction("tx", 0, state, producer_id, 3, 60_000, NOW_MS - 1, partitions)


def test_open_transactions_keeps_open_and_old_enough():
    states = {PARTITION: [producer(1), producer(2, txn_start_offset=NO_OFFSET),
                          producer(3, idle_ms=10)]}
    assert [s.producer_id for s in open_transactions(states, 1_000, NOW_MS)] == [1]


@pytest.mark.parametrize(("ids", "descriptions", "reason"), [
    ({}, {}, "no coordinator knows this producer id"),
    ({1: "tx"}, {"tx": None}, "its transactional id is gone"),
    ({1: "tx"}, {"tx": described(9, frozenset({PARTITION}))}, "now has producer id 9"),
    ({1: "tx"}, {"tx": described(1, frozenset(), "CompleteCommit")},
     "(CompleteCommit) excludes this partition"),
])
def test_hanging_reasons(ids, descriptions, reason):
    (hanging,) = hanging_transactions([producer(1)], ids, descriptions)
    assert reason in hanging.reason and hanging.producer.producer_id == 1


def test_a_transaction_its_coordinator_still_lists_is_not_hanging():
    live = {"tx": described(1, frozenset({PARTITION}), "PrepareCommit")}
    assert hanging_transactions([producer(1)], {1: "tx"}, live) == []


# ---------------------------------------------------------------- wire decoding


def response_frame(api_key: int, version: int, correlation_id: int, body: bytes,
                   tagged: bytes = b"\x00") -> bytes:
    return struct.pack(">i", correlation_id) + tagged + body


def encoded_describe_transactions(start_time_ms: int) -> bytes:
    """A DescribeTransactions v0 body written by kio, then the start time patched in (kio's
    writer, like its reader, refuses -1)."""
    body = build_entity(response_type(ApiKey.DESCRIBE_TRANSACTIONS, 0), throttle_time=0,
                        transaction_states=[{
                            "error_code": 0, "transactional_id": "tx",
                            "transaction_state": "Empty", "transaction_timeout": 60_000,
                            "transaction_start_time": 123_456, "producer_id": 5,
                            "producer_epoch": 0, "topics": []}])
    buffer = io.BytesIO()
    entity_writer(type(body))(buffer, body)
    return buffer.getvalue().replace(struct.pack(">q", 123_456), struct.pack(">q", start_time_ms))


def test_decode_reads_a_start_time_of_minus_one_as_none():
    frame = response_frame(65, 0, 7, encoded_describe_transactions(-1))
    (state,) = decode_response(ApiKey.DESCRIBE_TRANSACTIONS, 0, 7, frame).transaction_states
    assert state.transaction_start_time is None and state.producer_id == 5


def test_decode_skips_tagged_fields_of_the_response_header():
    tagged = b"\x01" + b"\x00" + b"\x03" + b"abc"  # one tagged field: tag 0, 3 bytes
    frame = response_frame(65, 0, 7, encoded_describe_transactions(1_000), tagged)
    (state,) = decode_response(ApiKey.DESCRIBE_TRANSACTIONS, 0, 7, frame).transaction_states
    assert state.transaction_start_time.timestamp() == 1.0


@pytest.mark.parametrize("frame", [
    response_frame(65, 0, 8, b""),                                   # other correlation id
    response_frame(65, 0, 7, b"\x00\x00"),                            # truncated body
    response_frame(65, 0, 7, encoded_describe_transactions(0) + b"!"),  # trailing bytes
    struct.pack(">i", 7) + b"\xff\xff\xff\xff\xff\xff",                 # endless varint
])
def test_decode_turns_bad_frames_into_wire_errors(frame):
    with pytest.raises(WireError):
        decode_response(ApiKey.DESCRIBE_TRANSACTIONS, 0, 7, frame)


def test_connecting_to_nothing_is_a_wire_error():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(WireError, match="cannot connect"):
        Connection("127.0.0.1", port, timeout_s=2.0)


def test_versions_are_negotiated_with_the_broker(bootstrap):
    host, port = bootstrap.split(",")[0].rsplit(":", 1)
    with Connection(host, int(port)) as connection:
        assert connection.pick_version(ApiKey.LIST_TRANSACTIONS, (0, 1)) == 1
        with pytest.raises(WireError, match="does not answer"):
            connection.pick_version(ApiKey.DESCRIBE_PRODUCERS, (5, 6))
