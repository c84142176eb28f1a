"""ListOffsets up to v10: MAX_TIMESTAMP through confluent-kafka's AdminClient, and the
special timestamps each answered only from the version that knows them (Kafka's
UNSUPPORTED_VERSION otherwise)."""

from __future__ import annotations

from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from kio.schema.errors import ErrorCode

from tests.helpers import create_topic, unique
from tests.kafka_raw import RawClient

LIST_OFFSETS = 2
TIMEOUT_S = 30
BASE_TS = 1_700_000_000_000


def _produce(bootstrap: str, topic: str, timestamps: list[int]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for ts in timestamps:
        producer.produce(topic, value=b"v", partition=0, timestamp=ts)
    assert producer.flush(TIMEOUT_S) == 0


def _list(client: RawClient, version: int, topic: str, timestamp: int):
    body = {"replica_id": -1, "isolation_level": 0, "timeout": 1000, "topics": [
        {"name": topic, "partitions": [{"partition_index": 0, "current_leader_epoch": -1,
                                        "timestamp": timestamp}]}]}
    return client.request(LIST_OFFSETS, version, body).topics[0].partitions[0]


def test_admin_list_offsets_max_timestamp(onceflow_broker):
    bootstrap = onceflow_broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("max-ts"))
    _produce(bootstrap, topic, [BASE_TS + 5, BASE_TS + 30, BASE_TS + 10])
    admin = AdminClient({"bootstrap.servers": bootstrap})
    tp = TopicPartition(topic, 0)
    found = admin.list_offsets({tp: OffsetSpec.max_timestamp()},
                               request_timeout=TIMEOUT_S)[tp].result(TIMEOUT_S)
    assert (found.offset, found.timestamp) == (1, BASE_TS + 30)
    latest = admin.list_offsets({tp: OffsetSpec.latest()}, request_timeout=TIMEOUT_S)[tp].result(TIMEOUT_S)
    assert latest.offset == 3


def test_special_timestamps_by_version(onceflow_broker):
    bootstrap = onceflow_broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("list-offsets-v"))
    _produce(bootstrap, topic, [BASE_TS, BASE_TS + 1])
    with RawClient(bootstrap) as client:
        for version in (9, 10):
            local = _list(client, version, topic, -4)
            assert (local.error_code, local.offset) == (ErrorCode.none, 0)
            tiered = _list(client, version, topic, -5)
            assert (tiered.error_code, tiered.offset, tiered.leader_epoch) == (ErrorCode.none, -1, -1)
            latest = _list(client, version, topic, -1)
            assert (latest.error_code, latest.offset) == (ErrorCode.none, 2)
        assert _list(client, 8, topic, -5).error_code == ErrorCode.unsupported_version
        assert _list(client, 7, topic, -4).error_code == ErrorCode.unsupported_version
        assert _list(client, 6, topic, -3).error_code == ErrorCode.unsupported_version
        assert _list(client, 7, topic, -3).offset == 1
        assert _list(client, 10, topic, -6).error_code == ErrorCode.unsupported_version
