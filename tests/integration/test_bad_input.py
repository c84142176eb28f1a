"""Corrupt, truncated, oversize and random frames: the broker closes the offending
connection or answers with the right error code, stays up, keeps serving other
clients, and never appends a bad batch."""

from __future__ import annotations

import os
import random
import socket
import struct
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from kio.schema.errors import ErrorCode

from onceflow.protocol.records import SimpleRecord, build_batch
from tests.helpers import create_topic, unique
from tests.kafka_raw import RawClient

PRODUCE, METADATA, API_VERSIONS = 0, 3, 18
TIMEOUT_S = 15


@pytest.fixture
def topic(onceflow_broker) -> str:
    return create_topic(onceflow_broker.bootstrap_servers, unique("bad"))


def _produce_body(topic: str, records: bytes, partition: int = 0) -> dict:
    return {"transactional_id": None, "acks": -1, "timeout": 5000,
            "topic_data": [{"name": topic, "partition_data": [{"index": partition, "records": records}]}]}


def _batch(values: list[bytes]) -> bytes:
    return build_batch([SimpleRecord(key=None, value=v) for v in values])


def _produce_error(client: RawClient, topic: str, records: bytes, partition: int = 0) -> ErrorCode:
    response = client.request(PRODUCE, 9, _produce_body(topic, records, partition))
    return response.responses[0].partition_responses[0].error_code


def _closed(client: RawClient) -> bool:
    client.sock.settimeout(TIMEOUT_S)
    try:
        return client.sock.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True


def _log_end(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bad-input-check", "enable.auto.commit": False})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=TIMEOUT_S)[1]
    finally:
        consumer.close()


def test_bad_batches_get_error_codes_and_nothing_is_appended(onceflow_broker, topic):
    bootstrap = onceflow_broker.bootstrap_servers
    good = _batch([b"a", b"b"])
    flipped = bytearray(good)
    flipped[-1] ^= 0xFF
    magic1 = bytearray(good)
    magic1[16] = 1
    with RawClient(bootstrap) as client:
        assert _produce_error(client, topic, bytes(flipped)) == ErrorCode.corrupt_message
        assert _produce_error(client, topic, good[:-3]) == ErrorCode.corrupt_message
        # Kafka answers a magic < 2 batch in Produce v3+ with INVALID_RECORD (ProduceRequest.validateRecords).
        assert _produce_error(client, topic, bytes(magic1)) == ErrorCode.invalid_record
        assert _produce_error(client, topic, good + good) == ErrorCode.invalid_record
        assert _produce_error(client, topic, good, partition=7) == ErrorCode.unknown_topic_or_partition
        assert _produce_error(client, "no-such-topic-x", good) == ErrorCode.unknown_topic_or_partition
        big = _batch([os.urandom(1_100_000)])
        assert _produce_error(client, topic, big) == ErrorCode.message_too_large
        assert _log_end(bootstrap, topic) == 0
        assert _produce_error(client, topic, good) == ErrorCode.none
    assert _log_end(bootstrap, topic) == 2


def test_unsupported_api_versions_version_gets_fallback(onceflow_broker):
    with RawClient(onceflow_broker.bootstrap_servers) as client:
        client.correlation_id += 1
        header = struct.pack(">hhih", API_VERSIONS, 99, client.correlation_id, 3) + b"raw" + b"\x00"
        client.send_frame(header + b"\x00\x00\x00")
        frame = client.recv_frame()
        # v0 body: correlation id, error code, then the api key array.
        assert struct.unpack_from(">ih", frame, 0) == (client.correlation_id, ErrorCode.unsupported_version.value)
        (count,) = struct.unpack_from(">i", frame, 6)
        keys = {struct.unpack_from(">h", frame, 10 + 6 * i)[0] for i in range(count)}
        # Kafka (ApiVersionsRequest.getErrorResponse) lists only ApiVersions itself,
        # so the client can retry with a version in that range.
        assert keys == {API_VERSIONS}


@pytest.mark.parametrize("payload", [
    struct.pack(">i", -5),                       # negative size
    struct.pack(">i", 2**31 - 1),                # oversize: above socket.request.max.bytes
    struct.pack(">i", 12) + b"\x00\x03\x00",     # truncated then closed below
    struct.pack(">i", 8) + struct.pack(">hhi", 999, 0, 1),  # unknown API key
    struct.pack(">i", 8) + struct.pack(">hhi", METADATA, 999, 1),  # unknown version
])
def test_bad_frames_close_only_that_connection(onceflow_broker, payload):
    with RawClient(onceflow_broker.bootstrap_servers) as client:
        client.send_bytes(payload)
        if payload.startswith(struct.pack(">i", 12)):
            client.sock.shutdown(socket.SHUT_WR)
        assert _closed(client)
    _assert_broker_serves(onceflow_broker.bootstrap_servers)


def test_random_frames_do_not_hurt_the_broker(onceflow_broker, topic):
    rng = random.Random(1234)
    bootstrap = onceflow_broker.bootstrap_servers
    for i in range(200):
        with RawClient(bootstrap) as client:
            body = bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 200)))
            if i % 2:   # a valid header for a real API, random body
                body = struct.pack(">hhih", rng.choice([0, 1, 3, 18, 19]), rng.randint(0, 12), i, -1) + body
            try:
                client.send_frame(body)
                client.sock.settimeout(2)
                client.sock.recv(65536)
            except (socket.timeout, ConnectionError):
                pass
    _assert_broker_serves(bootstrap)
    assert _log_end(bootstrap, topic) == 0


def _assert_broker_serves(bootstrap: str) -> None:
    name = f"alive-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(name, b"still here")
    assert producer.flush(TIMEOUT_S) == 0


def test_api_versions_v3_validates_client_software(onceflow_broker):
    with RawClient(onceflow_broker.bootstrap_servers) as client:
        good = client.request(API_VERSIONS, 3, {"client_software_name": "my-app",
                                                "client_software_version": "1.2.3"})
        assert good.error_code == ErrorCode.none
        assert {k.api_key for k in good.api_keys} >= {PRODUCE, METADATA, API_VERSIONS}
        bad = client.request(API_VERSIONS, 3, {"client_software_name": "bad name!",
                                               "client_software_version": "1"})
        assert bad.error_code == ErrorCode.invalid_request


def test_transactional_batch_without_transactional_id_is_refused(onceflow_broker, topic):
    # Kafka (KafkaApis.handleProduceRequest) refuses the whole request: appending it
    # would open a transaction that no coordinator could ever end.
    batch = build_batch([SimpleRecord(key=None, value=b"x")], producer_id=4242, producer_epoch=0,
                        base_sequence=0, transactional=True)
    with RawClient(onceflow_broker.bootstrap_servers) as client:
        assert _produce_error(client, topic, batch) == ErrorCode.transactional_id_authorization_failed
    assert _log_end(onceflow_broker.bootstrap_servers, topic) == 0
