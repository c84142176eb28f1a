"""The Java Kafka client (kafka-clients 3.9.1) against the broker: the harness every Java
test builds on (tests/java_support.py), checked with an idempotent round trip."""

from __future__ import annotations

from tests.helpers import create_topic, unique
from tests.java_support import run_java


def test_java_idempotent_producer_and_read_committed_consumer(onceflow_broker):
    topic = create_topic(onceflow_broker.bootstrap_servers, unique("java"), 1)
    [result] = run_java("RoundTrip", onceflow_broker.bootstrap_servers, topic, "20")
    assert result["produced"] == list(range(20))
    assert result["consumed"] == [f"v{i}" for i in range(20)]
