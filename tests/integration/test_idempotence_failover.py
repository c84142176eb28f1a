"""Broker failure with `nodes=3`: the new leader still recognises an idempotent retry.

The seeds' broker-failure case. A confluent-kafka idempotent producer sends numbered
records to a 3-partition topic (replication factor 3) on a broker presenting 3 nodes.
A third of the way in, the node leading partition 0 performs the Produce requests it
gets but its answers are lost (fault injection), then the node goes down: its
connections close and leadership of its partitions moves to another node. The
producer retries the unanswered batches - same producer id, same sequences - against
the new leader, which answers them as duplicates with their original offsets. Two
thirds of the way in the node comes back and leadership returns to it.

Afterwards every record is stored exactly once, in send order per partition, and the
broker counted the duplicates.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from confluent_kafka import Producer

from onceflow import Broker
from tests.helpers import create_topic
from tests.integration.test_idempotence_clients import (
    duplicates,
    exactly_once_problems,
    read_ids,
    value_of,
)

pytestmark = pytest.mark.slow

NODES = 3
PARTITIONS = 3
RECORDS = 30_000
SOCKET_TIMEOUT_MS = 10_000  # long: the retries must come from the node going down
FIRE_TIMEOUT_S = 10
FLUSH_TIMEOUT_S = 60


@pytest.fixture
def cluster():
    with Broker(nodes=NODES) as broker:
        yield broker


def leader_of(broker: Broker, topic: str, partition: int) -> int:
    state = broker.server.state
    return state.leader(state.topic(topic), partition)


class Failover:
    """From another thread: lose the leader's answers, take it down, bring it back."""

    def __init__(self, broker: Broker, topic: str) -> None:
        self.broker, self.topic = broker, topic
        self.sent = 0
        self.node = leader_of(broker, topic, 0)
        self.new_leader: int | None = None
        self.failure: BaseException | None = None
        self._thread = threading.Thread(target=self._guarded, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self) -> None:
        self._thread.join(FLUSH_TIMEOUT_S)
        if self.failure is not None:
            raise self.failure

    def _guarded(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread by join()
            self.failure = exc

    def _wait_sent(self, count: int) -> None:
        while self.sent < count:
            time.sleep(0.01)

    def _run(self) -> None:
        faults = self.broker.faults
        self._wait_sent(RECORDS // 3)
        rule = faults.drop_responses("produce", count=None, node_id=self.node)
        deadline = time.monotonic() + FIRE_TIMEOUT_S
        while not any(r["id"] == rule and r["fired"] for r in faults.rules()):
            assert time.monotonic() < deadline, "the leader got no Produce request"
            time.sleep(0.005)
        faults.node_down(self.node)
        faults.remove(rule)
        self.new_leader = leader_of(self.broker, self.topic, 0)
        self._wait_sent(2 * RECORDS // 3)
        faults.node_up(self.node)


def test_new_leader_deduplicates_retries_after_node_down(cluster):
    topic = create_topic(cluster.bootstrap_servers, f"failover-{uuid.uuid4().hex[:8]}",
                         PARTITIONS, replication_factor=NODES)
    failover = Failover(cluster, topic)
    errors: list[str] = []
    producer = Producer({
        "bootstrap.servers": cluster.bootstrap_servers, "enable.idempotence": True,
        "acks": "all", "linger.ms": 5, "socket.timeout.ms": SOCKET_TIMEOUT_MS,
        "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 200,
        "topic.metadata.refresh.interval.ms": 1_000,
    })

    def on_delivery(err, _message) -> None:
        if err is not None:
            errors.append(str(err))

    failover.start()
    for i in range(RECORDS):
        producer.produce(topic, value=value_of(i), on_delivery=on_delivery)
        failover.sent = i + 1
        producer.poll(0)
        if i % 100 == 0:
            time.sleep(0.002)  # spread the run over a few seconds, so the faults land mid-run
    assert producer.flush(FLUSH_TIMEOUT_S) == 0
    failover.join()
    assert not errors, errors[:5]
    assert failover.new_leader is not None and failover.new_leader != failover.node
    assert duplicates(cluster, topic) >= 1, "no retry reached the new leader as a duplicate"
    ids = read_ids(cluster.bootstrap_servers, topic, PARTITIONS)
    problems = exactly_once_problems(ids, range(RECORDS))
    assert not problems, "\n".join(problems)
