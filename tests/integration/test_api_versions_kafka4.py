"""ApiVersions v4 answers like a Kafka 4.x broker: kafka-python's version probe infers
Kafka 4.1 from the advertised ranges (Produce v13, ListOffsets v10), and the supported and finalized features include
metadata.version at 4.0-IV0 (22)."""

from __future__ import annotations

from kafka import KafkaConsumer

from tests.integration.txn_v2_support import finalized_features
from tests.kafka_raw import RawClient

API_VERSIONS = 18


def test_kafka_python_infers_kafka_4(onceflow_broker):
    consumer = KafkaConsumer(bootstrap_servers=onceflow_broker.bootstrap_servers)
    try:
        assert consumer.config["api_version"] == (4, 1)
    finally:
        consumer.close()


def test_features(onceflow_broker):
    bootstrap = onceflow_broker.bootstrap_servers
    assert finalized_features(bootstrap) == {"group.version": 1, "transaction.version": 1,
                                             "metadata.version": 22}
    with RawClient(bootstrap) as client:
        answer = client.request(API_VERSIONS, 4, {"client_software_name": "raw",
                                                  "client_software_version": "1"})
    supported = {f.name: (f.min_version, f.max_version) for f in answer.supported_features}
    assert supported["metadata.version"] == (7, 24)
    ranges = {k.api_key: (k.min_version, k.max_version) for k in answer.api_keys}
    assert ranges[0] == (3, 13) and ranges[1] == (4, 17) and ranges[2] == (1, 10) and ranges[3] == (0, 13)
