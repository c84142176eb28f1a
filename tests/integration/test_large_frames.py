"""Large request frames: read straight into pooled buffers, decoded without copying
their records (protocol/framing.py, protocol/codec.py). Pipelined ~1 MB produce
requests, some split into odd pieces, land byte for byte in the log while their
buffers are recycled; a large request of another API decodes too; a bad size
behind a large frame, or a peer hanging up inside one, harm only that connection."""

from __future__ import annotations

import os
import struct
import time

from confluent_kafka import Consumer, TopicPartition

from onceflow.protocol.framing import DIRECT_FRAME_BYTES_MIN
from onceflow.protocol.records import SimpleRecord, build_batch
from tests.helpers import create_topic, unique
from tests.kafka_raw import RawClient

PRODUCE, METADATA = 0, 3
PRODUCE_VERSION = 9
TIMEOUT_S = 30
RECORDS_PER_BATCH = 900
RECORD_BYTES = 1_000
PIPELINED_REQUESTS = 12  # above the broker's 8 requests in flight per connection


def _batch(tag: int) -> tuple[bytes, list[bytes]]:
    values = [tag.to_bytes(4, "big") + os.urandom(RECORD_BYTES - 4) for _ in range(RECORDS_PER_BATCH)]
    return build_batch([SimpleRecord(None, value) for value in values]), values


def _produce_frame(client: RawClient, topic: str, partition: int, records: bytes) -> bytes:
    body = {"transactional_id": None, "acks": -1, "timeout": 10_000,
            "topic_data": [{"name": topic, "partition_data": [{"index": partition, "records": records}]}]}
    payload = client.encode(PRODUCE, PRODUCE_VERSION, body)
    return struct.pack(">i", len(payload)) + payload


def _read_values(bootstrap: str, topic: str, partitions: int, expected: int) -> dict[int, list[bytes]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("large"),
                         "enable.auto.commit": False, "fetch.max.bytes": 4_000_000})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    values: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
    deadline, count = time.monotonic() + TIMEOUT_S, 0
    try:
        while count < expected and time.monotonic() < deadline:
            for message in consumer.consume(10_000, 1.0):
                assert message.error() is None, message.error()
                values[message.partition()].append(message.value())
                count += 1
    finally:
        consumer.close()
    assert count == expected
    return values


def test_pipelined_large_produce_requests_land_byte_for_byte(onceflow_broker):
    bootstrap = onceflow_broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("large"), partitions=2)
    sent: dict[int, list[bytes]] = {0: [], 1: []}
    with RawClient(bootstrap) as client:
        frames, correlation_ids = [], []
        for n in range(PIPELINED_REQUESTS):
            records, values = _batch(n)
            frames.append(_produce_frame(client, topic, n % 2, records))
            correlation_ids.append(client.correlation_id)
            sent[n % 2] += values
        stream = b"".join(frames)
        # Odd piece sizes: frame boundaries, size prefixes and bodies all get cut.
        position, piece = 0, 1
        while position < len(stream):
            client.send_bytes(stream[position : position + piece])
            position += piece
            piece = piece * 7 % 300_007 + 1
        for n, correlation_id in enumerate(correlation_ids):
            client.correlation_id = correlation_id
            response = client.decode_response(PRODUCE, PRODUCE_VERSION, client.recv_frame())
            answer = response.responses[0].partition_responses[0]
            assert answer.error_code == 0
            assert answer.base_offset == (n // 2) * RECORDS_PER_BATCH
    assert _read_values(bootstrap, topic, 2, PIPELINED_REQUESTS * RECORDS_PER_BATCH) == sent


def test_large_request_of_another_api_is_decoded(onceflow_broker):
    bootstrap = onceflow_broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("large"))
    # Many unknown names make a Metadata request larger than a head read.
    names = [topic] + [f"absent-{n:06d}-{'x' * 40}" for n in range(2 * DIRECT_FRAME_BYTES_MIN // 40)]
    with RawClient(bootstrap) as client:
        body = {"topics": [{"name": name} for name in names], "allow_auto_topic_creation": False,
                "include_topic_authorized_operations": False,
                "include_cluster_authorized_operations": False}
        assert len(client.encode(METADATA, 9, body)) > 2 * DIRECT_FRAME_BYTES_MIN
        response = client.request(METADATA, 9, body)
    found = {t.name: t.error_code for t in response.topics}
    assert found[topic] == 0
    assert len(found) == len(names)


def _log_end(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("large")})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=TIMEOUT_S)[1]
    finally:
        consumer.close()


def test_bad_size_or_hang_up_mid_frame_harm_only_that_connection(onceflow_broker):
    bootstrap = onceflow_broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("large"))
    records, _values = _batch(1)
    with RawClient(bootstrap) as bad:
        bad.send_bytes(_produce_frame(bad, topic, 0, records))
        answer = bad.decode_response(PRODUCE, PRODUCE_VERSION, bad.recv_frame())
        assert answer.responses[0].partition_responses[0].error_code == 0
        bad.send_bytes(struct.pack(">i", -7) + b"junk")
        assert bad.sock.recv(1) == b""  # closed, for the bad size
    with RawClient(bootstrap) as gone:
        frame = _produce_frame(gone, topic, 0, records)
        gone.send_bytes(frame[: len(frame) // 2])  # hangs up inside a pooled buffer
    with RawClient(bootstrap) as good:
        good.send_bytes(_produce_frame(good, topic, 0, records))
        answer = good.decode_response(PRODUCE, PRODUCE_VERSION, good.recv_frame())
        assert answer.responses[0].partition_responses[0].error_code == 0
        assert answer.responses[0].partition_responses[0].base_offset == RECORDS_PER_BATCH
    assert _log_end(bootstrap, topic) == 2 * RECORDS_PER_BATCH
