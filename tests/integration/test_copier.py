"""The exactly-once copier (onceflow.examples.copier) through SIGKILLs of itself and of
the broker.

50k input records on 4 partitions, produced over several seconds, are copied by two
copier processes in one consumer group while a chaos loop SIGKILLs a random copier (and starts it again with the same
instance id) every fraction of a second, and twice SIGKILLs the broker and restarts it
on the same port and data directory. At the end a read_committed reader must find every
input record exactly once in the output, and the group's committed offsets must equal
the input's end offsets.
"""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    ConsumerGroupTopicPartitions,
    IsolationLevel,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec

from onceflow.examples.copier import transform
from onceflow.testing import BrokerProcess
from tests.helpers import create_topic, unique

RECORDS = 50_000
PARTITIONS = 4
COPIERS = 2
COPIER_KILLS_MIN = 10
# The broker is killed after these copier kills.
BROKER_KILLS_AFTER = (3, 7)
# A copier lives this long (random, seconds) before the next SIGKILL: long enough to
# start, join and commit a few transactions, short enough to die mid-transaction often.
COPIER_LIFETIME_S = (0.8, 2.5)
# The input arrives over this long, in chunks: about as long as the chaos lasts.
FEED_S = 8.0
FEED_CHUNK_RECORDS = 1_000
FINISH_TIMEOUT_S = 60.0
VERIFY_TIMEOUT_S = 30.0
ADMIN_TIMEOUT_S = 30.0
POLL_S = 0.5
SEED = 5  # random moments, but the same ones on every run
# Brokers start groups without the 3 s wait for more members (nothing to wait for).
BROKER_ARGS = ("--group-initial-rebalance-delay-ms", "0", "--offsets-topic-partitions", "4",
               "--transaction-state-partitions", "4")


class Copiers:
    """The copier child processes, restartable by instance number."""

    def __init__(self, bootstrap: str, run: str, log_dir: Path) -> None:
        self.bootstrap, self.run, self.log_dir = bootstrap, run, log_dir
        self.processes: list[subprocess.Popen] = [self._start(i) for i in range(COPIERS)]
        self.kills = 0

    def _start(self, instance: int) -> subprocess.Popen:
        with open(self.log_dir / f"copier-{instance}.log", "a") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "onceflow.examples.copier", "--bootstrap", self.bootstrap,
                 "--input", f"{self.run}-input", "--output", f"{self.run}-output",
                 "--group", self.group, "--instance", str(instance)],
                stdout=log, stderr=log)

    @property
    def group(self) -> str:
        return f"{self.run}-copier"

    def kill_and_restart(self, instance: int) -> None:
        self.processes[instance].kill()
        self.processes[instance].wait()
        self.kills += 1
        self.processes[instance] = self._start(instance)

    def restart_exited(self) -> None:
        """A copier that was fenced or lost the broker exits: its supervisor (we) restarts it."""
        for instance, process in enumerate(self.processes):
            if process.poll() is not None:
                self.processes[instance] = self._start(instance)

    def stop(self) -> None:
        for process in self.processes:
            process.kill()
            process.wait()


class InputFeeder(threading.Thread):
    """Produces the input over `FEED_S` seconds, so copiers die while input still
    arrives; an idempotent producer, so broker restarts neither lose nor repeat it."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic = bootstrap, topic
        self.unacknowledged: int | None = None

    def run(self) -> None:
        producer = Producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": True,
                             "linger.ms": 5})
        started = time.monotonic()
        for i in range(RECORDS):
            producer.produce(self.topic, key=str(i).encode(), value=f"record-{i}".encode())
            if i % FEED_CHUNK_RECORDS == 0:
                producer.poll(0)
                time.sleep(max(0.0, started + FEED_S * i / RECORDS - time.monotonic()))
        self.unacknowledged = producer.flush(FINISH_TIMEOUT_S)


def end_offsets(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> dict[int, int]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    request = {TopicPartition(topic, p): OffsetSpec.latest() for p in range(partitions)}
    futures = admin.list_offsets(request, isolation_level=IsolationLevel.READ_COMMITTED,
                                 request_timeout=ADMIN_TIMEOUT_S)
    return {tp.partition: f.result(ADMIN_TIMEOUT_S).offset for tp, f in futures.items()}


def committed_offsets(bootstrap: str, group: str, topic: str,
                      partitions: int = PARTITIONS) -> dict[int, int]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    request = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in range(partitions)])
    futures = admin.list_consumer_group_offsets([request], require_stable=True,
                                                request_timeout=ADMIN_TIMEOUT_S)
    found = futures[group].result(ADMIN_TIMEOUT_S)
    return {tp.partition: tp.offset for tp in found.topic_partitions}


def chaos(broker: BrokerProcess, copiers: Copiers, rng: random.Random) -> int:
    """SIGKILL copiers (and twice the broker) at random moments; returns broker kills."""
    broker_kills = 0
    while copiers.kills < COPIER_KILLS_MIN:
        time.sleep(rng.uniform(*COPIER_LIFETIME_S) / COPIERS)
        copiers.restart_exited()
        copiers.kill_and_restart(rng.randrange(COPIERS))
        if copiers.kills in BROKER_KILLS_AFTER:
            broker.kill()
            time.sleep(rng.uniform(0.0, 0.5))
            broker.start()
            broker_kills += 1
    return broker_kills


def wait_until_copied(bootstrap: str, copiers: Copiers, input_topic: str) -> dict[int, int]:
    """Until the group's committed offsets reach the input's end offsets."""
    ends = end_offsets(bootstrap, input_topic)
    deadline = time.monotonic() + FINISH_TIMEOUT_S
    committed: dict[int, int] = {}
    while time.monotonic() < deadline:
        copiers.restart_exited()
        try:
            committed = committed_offsets(bootstrap, copiers.group, input_topic)
        except KafkaException:  # e.g. UNSTABLE_OFFSET_COMMIT while a commit is in flight
            committed = {}
        if committed == ends:
            return committed
        time.sleep(POLL_S)
    pytest.fail(f"copiers did not finish: committed {committed}, input ends {ends}")


def read_committed(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> Counter:
    """Every value of `topic` up to its last stable offset, read_committed."""
    ends = end_offsets(bootstrap, topic, partitions)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("verify"),
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    seen: Counter = Counter()
    deadline = time.monotonic() + VERIFY_TIMEOUT_S
    while time.monotonic() < deadline:
        for message in consumer.consume(5000, POLL_S):
            assert message.error() is None, message.error()
            seen[message.value()] += 1
        positions = {tp.partition: tp.offset for tp in consumer.position(consumer.assignment())}
        if all(positions[p] >= ends[p] for p in range(partitions)):
            break
    consumer.close()
    return seen


@pytest.mark.timeout(240)
def test_copier_exactly_once_through_copier_and_broker_sigkills(onceflow_broker_process, tmp_path):
    broker = onceflow_broker_process(args=BROKER_ARGS)
    bootstrap, run = broker.bootstrap_servers, unique("copy")
    input_topic = create_topic(bootstrap, f"{run}-input", PARTITIONS)
    output_topic = create_topic(bootstrap, f"{run}-output", PARTITIONS)
    feeder = InputFeeder(bootstrap, input_topic)
    feeder.start()
    copiers = Copiers(bootstrap, run, tmp_path)
    try:
        broker_kills = chaos(broker, copiers, random.Random(SEED))
        feeder.join(FINISH_TIMEOUT_S)
        assert feeder.unacknowledged == 0, "the input was not all acknowledged"
        committed = wait_until_copied(bootstrap, copiers, input_topic)
    finally:
        copiers.stop()

    assert copiers.kills >= COPIER_KILLS_MIN and broker_kills == len(BROKER_KILLS_AFTER)
    seen = read_committed(bootstrap, output_topic)
    expected = {transform(f"record-{i}".encode()) for i in range(RECORDS)}
    duplicated = {value: n for value, n in seen.items() if n > 1}
    assert not duplicated, f"{len(duplicated)} records copied more than once, e.g. {list(duplicated.items())[:3]}"
    assert set(seen) == expected, f"{len(expected - set(seen))} input records missing from the output"
    assert committed == end_offsets(bootstrap, input_topic)
