"""The documented limit: idempotence lives as long as one producer instance (its PID).

An application sends records with an idempotent confluent-kafka producer; the broker
appends them, but every answer is lost (fault injection drops them), so the producer's
deliveries time out even though its retries were recognised as duplicates while it
lived. The application then restarts its producer - a new instance, without a
transactional id - and sends the undelivered records again. The new instance gets a new
producer id from InitProducerId, so the broker has no reason to link its batches to the
old ones: every record is now stored twice. Transactions (a stable transactional.id,
later issue) are the remedy; docs/faults.md and the idempotence section of the spec say
so.
"""

from __future__ import annotations

import uuid
from collections import Counter

from confluent_kafka import Producer

from onceflow.protocol.records import iter_batches
from tests.helpers import create_topic
from tests.integration.test_idempotence_clients import id_of, read_ids, value_of
from tests.kafka_raw import RawClient

RECORDS = 500
FETCH, FETCH_VERSION = 1, 12
FETCH_BYTES_MAX = 16 * 1024 * 1024
# The first instance must give up quickly on the answers that never come.
SOCKET_TIMEOUT_MS = 1_000
DELIVERY_TIMEOUT_MS = 6_000  # room for retries (and duplicates) on a loaded machine
FLUSH_TIMEOUT_S = 30


def produce_all(bootstrap: str, topic: str, ids: list[int], delivery_timeout_ms: int) -> list[int]:
    """One idempotent producer instance sends `ids`; returns the ids it got no ack for."""
    failed: list[int] = []
    producer = Producer({
        "bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
        "linger.ms": 5, "socket.timeout.ms": SOCKET_TIMEOUT_MS,
        "delivery.timeout.ms": delivery_timeout_ms,
    })

    def on_delivery(err, message) -> None:
        if err is not None:
            failed.append(id_of(message.value()))

    for i in ids:
        producer.produce(topic, value=value_of(i), on_delivery=on_delivery)
    assert producer.flush(FLUSH_TIMEOUT_S) == 0
    return failed


def stored_producer_ids(bootstrap: str, topic: str) -> Counter[int]:
    """How many records each producer id wrote to partition 0 (raw fetch of the batches)."""
    with RawClient(bootstrap) as client:
        response = client.request(FETCH, FETCH_VERSION, {
            "max_wait": 0, "min_bytes": 0, "max_bytes": FETCH_BYTES_MAX,
            "topics": [{"topic": topic, "partitions": [
                {"partition": 0, "fetch_offset": 0, "partition_max_bytes": FETCH_BYTES_MAX}]}],
            "forgotten_topics_data": []})
    records = response.responses[0].partitions[0].records
    counts: Counter[int] = Counter()
    for header, _batch in iter_batches(records):
        counts[header.producer_id] += header.records_count
    return counts


def test_a_restarted_producer_gets_a_new_pid_and_its_resends_are_not_deduplicated(
        onceflow_fresh_broker):
    broker = onceflow_fresh_broker
    bootstrap = broker.bootstrap_servers
    topic = create_topic(bootstrap, f"limit-{uuid.uuid4().hex[:8]}")
    broker.faults.drop_responses("produce", count=None)  # every answer lost, until cleared
    undelivered = produce_all(bootstrap, topic, list(range(RECORDS)), DELIVERY_TIMEOUT_MS)
    broker.faults.clear()
    assert sorted(undelivered) == list(range(RECORDS)), "the first instance got no ack at all"
    registry = broker.server.state.metrics.registry
    assert registry.get_sample_value("onceflow_producer_duplicates_total", {"topic": topic}), \
        "while it lived, the first instance's retries were deduplicated"
    once = read_ids(bootstrap, topic, 1)[0]
    assert sorted(once) == list(range(RECORDS)), "each record stored once so far"

    # The application restarts its producer and re-sends what was never acknowledged.
    assert produce_all(bootstrap, topic, undelivered, 60_000) == []

    stored = read_ids(bootstrap, topic, 1)[0]
    assert Counter(stored) == {i: 2 for i in range(RECORDS)}, "each re-send is a second copy"
    writers = stored_producer_ids(bootstrap, topic)
    assert len(writers) == 2 and set(writers.values()) == {RECORDS}, writers
    first_pid, second_pid = sorted(writers)
    assert second_pid > first_pid  # a new PID from InitProducerId, never a reused one
