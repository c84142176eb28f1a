"""Startup recovery in the background (docs/logs.md, "Startup and recovery"): after a
SIGKILL the restarted broker answers at once; a partition not yet recovered answers
Produce, Fetch and ListOffsets with NOT_LEADER_OR_FOLLOWER (retriable), and once it is
recovered the same requests succeed on the recovered data: every record acknowledged with
acks=all before the kill is there, none twice, and a producer that retried through the
recovery wrote each of its records once."""

from __future__ import annotations

import threading

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from kio.schema.errors import ErrorCode

from onceflow.broker import state as broker_state
from onceflow.broker.embedded import Broker
from tests.helpers import create_topic, wait_for
from tests.kafka_raw import RawClient

TOPIC = "recovering"
PARTITIONS = 3
BEFORE_KILL = 300  # records acknowledged before the kill, spread over the partitions
DURING_RECOVERY = 50  # records a producer sends to partition 0 while it is not ready
FETCH, LIST_OFFSETS = 1, 2
TIMEOUT_S = 30


def _produce(bootstrap: str, values: range, partition: int | None = None,
             gate: threading.Event | None = None) -> set[int]:
    """Idempotent acks=all producer; returns the values acknowledged. With `gate`: gives
    the producer a moment against the not-ready partition, then opens the gate."""
    acked: set[int] = set()
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                         "enable.idempotence": True, "message.timeout.ms": TIMEOUT_S * 1000,
                         "retry.backoff.ms": 20, "retry.backoff.max.ms": 100})

    def on_delivery(err, message) -> None:
        assert err is None, err
        acked.add(int(message.value()))

    for value in values:
        target = value % PARTITIONS if partition is None else partition
        producer.produce(TOPIC, str(value).encode(), partition=target, on_delivery=on_delivery)
    if gate is not None:
        producer.poll(1.0)  # the requests meet NOT_LEADER_OR_FOLLOWER and are retried
        assert not acked, "acknowledged by a partition that is not recovered"
        gate.set()
    assert producer.flush(TIMEOUT_S) == 0
    return acked


def _raw_errors(bootstrap: str, partition: int) -> tuple[int, int]:
    """(Fetch error, ListOffsets error) of one partition, over a raw connection."""
    with RawClient(bootstrap) as client:
        fetch = client.request(FETCH, 12, {
            "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20,
            "isolation_level": 0, "session_id": 0, "session_epoch": -1,
            "topics": [{"topic": TOPIC, "partitions": [
                {"partition": partition, "current_leader_epoch": -1, "fetch_offset": 0,
                 "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}],
            "forgotten_topics_data": [], "rack_id": ""})
        offsets = client.request(LIST_OFFSETS, 7, {
            "replica_id": -1, "isolation_level": 0, "topics": [{"name": TOPIC, "partitions": [
                {"partition_index": partition, "current_leader_epoch": -1,
                 "timestamp": -1}]}]})
    return (int(fetch.responses[0].partitions[0].error_code),
            int(offsets.topics[0].partitions[0].error_code))


def _read_all(bootstrap: str) -> list[int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused",
                         "enable.auto.commit": False, "isolation.level": "read_committed"})
    try:
        ends = {p: consumer.get_watermark_offsets(TopicPartition(TOPIC, p),
                                                  timeout=TIMEOUT_S)[1]
                for p in range(PARTITIONS)}
        consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
        values: list[int] = []
        remaining = {p for p, end in ends.items() if end > 0}

        def done() -> bool:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                values.append(int(message.value()))
                if message.offset() >= ends[message.partition()] - 1:
                    remaining.discard(message.partition())
            return not remaining

        wait_for(done, "every partition read to its end", TIMEOUT_S, poll_s=0)
        return values
    finally:
        consumer.close()


@pytest.fixture
def recovery_gate():
    gate = broker_state.RECOVERY_GATE = threading.Event()
    yield gate
    gate.set()
    broker_state.RECOVERY_GATE = None


def test_not_ready_partitions_answer_retriable_then_serve_the_recovered_data(
        onceflow_broker_process, recovery_gate):
    process = onceflow_broker_process()
    create_topic(process.bootstrap_servers, TOPIC, PARTITIONS)
    acked_before = _produce(process.bootstrap_servers, range(BEFORE_KILL))
    assert acked_before == set(range(BEFORE_KILL))
    process.kill()

    with Broker(process.data_dir) as broker:  # its recovery waits for the gate
        bootstrap = broker.bootstrap_servers
        assert _raw_errors(bootstrap, 1) == (ErrorCode.not_leader_or_follower,
                                             ErrorCode.not_leader_or_follower)
        during = range(BEFORE_KILL, BEFORE_KILL + DURING_RECOVERY)
        assert _produce(bootstrap, during, partition=0, gate=recovery_gate) == set(during)
        wait_for(lambda: broker.call(lambda: broker.server.state.recovered),
                 "recovery finished", TIMEOUT_S)
        assert _raw_errors(bootstrap, 1) == (ErrorCode.none, ErrorCode.none)
        values = _read_all(bootstrap)
    assert sorted(values) == list(range(BEFORE_KILL + DURING_RECOVERY))  # none lost or doubled
