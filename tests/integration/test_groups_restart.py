"""Committed offsets and group membership survive a broker restart, clean or SIGKILL.

A consumer joins, processes and commits; the broker restarts under it. After the restart
the group is reloaded from __consumer_offsets: same member, same generation, Stable, same
committed offsets, so the running consumer carries on without a rebalance and without
seeing a record twice. A consumer that joins later starts at the committed offsets.
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, ConsumerGroupState, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from tests.helpers import TIMEOUT_S, create_topic, unique
from tests.integration.groups_support import (
    FAST_GROUPS_ARGS,
    SESSION_MS,
    Records,
    committed,
    wait_for,
)

PARTITIONS = 3


def _consume(consumer: Consumer, count: int) -> list[int]:
    """Poll until `count` records arrived, committing after processing each batch."""
    values: list[int] = []
    deadline = time.monotonic() + TIMEOUT_S * 2
    while len(values) < count and time.monotonic() < deadline:
        messages = [m for m in consumer.consume(100, timeout=0.2) if not m.error()]
        if messages:
            values += [int(m.value()) for m in messages]
            consumer.commit(asynchronous=False)
    return values


# Answers that mean "ask again": right after a restart the coordinator is still loading
# __consumer_offsets (as Kafka), and librdkafka's admin client does not retry these itself.
RETRIABLE = {KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.COORDINATOR_NOT_AVAILABLE,
             KafkaError.NOT_COORDINATOR}


def _describe(bootstrap: str, group: str):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        future = admin.describe_consumer_groups([group], request_timeout=TIMEOUT_S)[group]
        try:
            return future.result(TIMEOUT_S)
        except KafkaException as exc:
            if exc.args[0].code() not in RETRIABLE or time.monotonic() > deadline:
                raise
        time.sleep(0.1)


def _consumer(bootstrap: str, group: str) -> Consumer:
    return Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                     "enable.auto.commit": False, "auto.offset.reset": "earliest",
                     "session.timeout.ms": SESSION_MS * 2, "heartbeat.interval.ms": 500,
                     "reconnect.backoff.max.ms": 200})


@pytest.mark.parametrize("kill", [False, True], ids=["clean", "sigkill"])
def test_offsets_and_membership_survive_restart(onceflow_broker_process, kill):
    broker = onceflow_broker_process(args=FAST_GROUPS_ARGS)
    bootstrap = broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("restart"), PARTITIONS)
    group = unique("group")
    records = Records(bootstrap, topic, PARTITIONS)
    records.produce(60)

    first = _consumer(bootstrap, group)
    rebalances: list[list[TopicPartition]] = []
    first.subscribe([topic], on_assign=lambda _consumer, partitions: rebalances.append(partitions))
    assert sorted(_consume(first, 60)) == list(range(60))
    before = _describe(bootstrap, group)
    assert before.state == ConsumerGroupState.STABLE
    offsets_before = committed(bootstrap, group, topic, PARTITIONS)
    assert offsets_before == records.end_offsets()

    broker.restart(kill=kill)
    after = _describe(bootstrap, group)
    assert after.state == ConsumerGroupState.STABLE, "membership reloaded from the log"
    assert [m.member_id for m in after.members] == [m.member_id for m in before.members]
    assert committed(bootstrap, group, topic, PARTITIONS) == offsets_before

    records.produce(30)  # the running consumer carries on: only the new records
    assert sorted(_consume(first, 30)) == list(range(60, 90))
    assert len(rebalances) == 1, "the restart did not make the consumer rejoin"
    first.close()
    wait_for(lambda: _describe(bootstrap, group).state == ConsumerGroupState.EMPTY,
             "the group to be empty after the consumer left")

    records.produce(30)
    broker.restart(kill=kill)
    second = _consumer(bootstrap, group)  # a new member resumes from the committed offsets
    second.subscribe([topic])
    assert sorted(_consume(second, 30)) == list(range(90, 120))
    second.close()
    assert committed(bootstrap, group, topic, PARTITIONS) == records.end_offsets()
