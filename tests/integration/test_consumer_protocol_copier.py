"""The exactly-once copier in a consumer-protocol group (KIP-848) while members come and go.

Three copiers (confluent-kafka, `group.protocol=consumer`, static members) share a
12-partition input while input keeps arriving; at random moments one is SIGKILLed (and
restarted with the same instance id a moment later, as its supervisor would) or a new one
is added (up to 5 live). A watcher polls ConsumerGroupDescribe all along. At the
end every input record is in the output exactly once (read_committed), the group's
offsets reached the input's end, and no snapshot ever showed a partition in two members'
assignments. How long partitions went without an owner is printed (bench/rebalance.py
measures it against the classic protocol).

The chaos lasts `ONCEFLOW_CHAOS_S` seconds (20 in `make test`; the issue's minute:
`ONCEFLOW_CHAOS_S=60`).
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter

import pytest
from confluent_kafka import KafkaException, Producer

from onceflow.examples.copier import transform
from tests.helpers import create_topic, unique
from tests.integration import test_copier as copier_test
from tests.integration.rebalance_support import (
    AssignmentWatcher,
    Chaos,
    percentile,
    unowned_intervals,
)

PARTITIONS = 12
RECORDS = 20_000
CHAOS_S = float(os.environ.get("ONCEFLOW_CHAOS_S", "20"))
FINISH_TIMEOUT_S = 90.0
ADMIN_TIMEOUT_S = 30.0
POLL_S = 0.5
SEED = 16
# Consumer-protocol members of a killed copier are fenced after this session timeout
# (Kafka's default is 45 s; a test cannot wait that long for each kill).
SESSION_TIMEOUT_MS = 4_000
HEARTBEAT_INTERVAL_MS = 300
BROKER_ARGS = ("--group-initial-rebalance-delay-ms", "0", "--offsets-topic-partitions", "4",
               "--transaction-state-partitions", "4",
               "--group-consumer-session-timeout-ms", str(SESSION_TIMEOUT_MS),
               "--group-consumer-heartbeat-interval-ms", str(HEARTBEAT_INTERVAL_MS))


def feed(bootstrap: str, topic: str, seconds: float) -> threading.Thread:
    def run() -> None:
        producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                             "linger.ms": 5})
        started = time.monotonic()
        for i in range(RECORDS):
            producer.produce(topic, key=str(i).encode(), value=f"record-{i}".encode())
            if i % 500 == 0:
                producer.poll(0)
                time.sleep(max(0.0, started + seconds * i / RECORDS - time.monotonic()))
        assert producer.flush(FINISH_TIMEOUT_S) == 0

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    return copier_test.end_offsets(bootstrap, topic, PARTITIONS)


def committed_offsets(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    return copier_test.committed_offsets(bootstrap, group, topic, PARTITIONS)


def wait_until_copied(bootstrap: str, chaos: Chaos, input_topic: str) -> None:
    ends = end_offsets(bootstrap, input_topic)
    deadline = time.monotonic() + FINISH_TIMEOUT_S
    committed: dict[int, int] = {}
    while time.monotonic() < deadline:
        chaos.replace_exited()
        if not chaos.processes:
            chaos.add()
        try:
            committed = committed_offsets(bootstrap, chaos.group, input_topic)
        except KafkaException:  # UNSTABLE_OFFSET_COMMIT while a commit is in flight
            committed = {}
        if committed == ends:
            return
        time.sleep(POLL_S)
    pytest.fail(f"copiers did not finish: committed {committed}, input ends {ends}")


def read_committed(bootstrap: str, topic: str) -> Counter:
    return copier_test.read_committed(bootstrap, topic, PARTITIONS)


@pytest.mark.timeout(300)
def test_consumer_protocol_copiers_exactly_once_while_members_come_and_go(
        onceflow_broker_process, tmp_path):
    broker = onceflow_broker_process(args=BROKER_ARGS)
    bootstrap, run = broker.bootstrap_servers, unique("kip848")
    input_topic = create_topic(bootstrap, f"{run}-input", PARTITIONS)
    output_topic = create_topic(bootstrap, f"{run}-output", PARTITIONS)
    chaos = Chaos(bootstrap, input_topic, output_topic, f"{run}-copier", tmp_path, "consumer")
    watcher = AssignmentWatcher(bootstrap, chaos.group)
    feeder = feed(bootstrap, input_topic, CHAOS_S)
    watcher.start()
    started = time.time()
    try:
        chaos.run(CHAOS_S, random.Random(SEED))
        ended = time.time()
        feeder.join(FINISH_TIMEOUT_S)
        wait_until_copied(bootstrap, chaos, input_topic)
    finally:
        watcher.stop()
        chaos.stop()

    assert chaos.kills, "the chaos killed nobody"
    assert watcher.snapshots > CHAOS_S, "ConsumerGroupDescribe was not polled"
    assert not watcher.overlaps, f"a partition was assigned twice: {watcher.overlaps[:3]}"
    seen = read_committed(bootstrap, output_topic)
    expected = {transform(f"record-{i}".encode()) for i in range(RECORDS)}
    duplicated = {value: n for value, n in seen.items() if n > 1}
    assert not duplicated, f"{len(duplicated)} records copied twice, e.g. {list(duplicated)[:3]}"
    assert set(seen) == expected, f"{len(expected - set(seen))} input records missing"
    pauses = unowned_intervals(chaos, PARTITIONS, started, ended)
    print(f"\n{len(chaos.kills)} kills, {chaos.next_instance} copiers, {watcher.snapshots} "
          f"describe snapshots; unowned periods: {len(pauses)}, p50 "
          f"{percentile(pauses, 0.5):.2f} s, p99 {percentile(pauses, 0.99):.2f} s")
