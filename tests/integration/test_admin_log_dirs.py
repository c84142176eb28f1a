"""DescribeLogDirs (kafka-python) and ElectLeaders (confluent-kafka) against the broker over
a real socket: real partition sizes and filesystem figures, Kafka's election errors."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest
from confluent_kafka import ElectionType, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.admin import KafkaAdminClient

TIMEOUT_S = 30


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def admin(onceflow_broker) -> AdminClient:
    return AdminClient({"bootstrap.servers": onceflow_broker.bootstrap_servers})


def _topic_with_records(onceflow_broker, admin, count: int) -> str:
    name = _name("dirs")
    admin.create_topics([NewTopic(name, 2, 1)])[name].result(TIMEOUT_S)
    producer = Producer({"bootstrap.servers": onceflow_broker.bootstrap_servers})
    for i in range(count):
        producer.produce(name, value=b"x" * 100, partition=0)
    assert producer.flush(TIMEOUT_S) == 0
    return name


def test_describe_log_dirs_reports_sizes(onceflow_broker, admin):
    name = _topic_with_records(onceflow_broker, admin, 50)
    client = KafkaAdminClient(bootstrap_servers=onceflow_broker.bootstrap_servers,
                              request_timeout_ms=TIMEOUT_S * 1000)
    try:
        result = client.describe_log_dirs({name: [0, 1, 7]})
    finally:
        client.close()
    data_dir = Path(onceflow_broker.data_dir).resolve()
    ((broker, log_dirs),) = [(node["broker"], node["log_dirs"]) for node in result]
    (entry,) = log_dirs
    assert (broker, entry["error_code"], entry["log_dir"]) == (0, 0, str(data_dir))
    (topic,) = entry["topics"]
    sizes = {p["partition_index"]: p["partition_size"] for p in topic["partitions"]}
    on_disk = sum(f.stat().st_size for f in (data_dir / f"{name}-0").glob("*.log"))
    assert on_disk > 50 * 100
    assert sizes == {0: on_disk, 1: 0}  # partition 7 does not exist: left out, as Kafka does
    assert all((p["offset_lag"], p["is_future_key"]) == (0, False) for p in topic["partitions"])
    usage = shutil.disk_usage(data_dir)
    assert entry["total_bytes"] == usage.total
    assert 0 < entry["usable_bytes"] <= usage.total


def test_elect_leaders_not_needed_and_unknown(onceflow_broker, admin):
    name = _name("elect")
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(TIMEOUT_S)
    future = admin.elect_leaders(ElectionType.PREFERRED, [TopicPartition(name, 0),
                                                          TopicPartition(name, 5)])
    results = future.result(TIMEOUT_S)
    errors = {tp.partition: (err.name() if err else None) for tp, err in results.items()}
    assert errors == {0: "ELECTION_NOT_NEEDED", 5: "UNKNOWN_TOPIC_OR_PART"}
    # All partitions (null): nothing needed an election, nothing is listed.
    assert admin.elect_leaders(ElectionType.PREFERRED, None).result(TIMEOUT_S) == {}
