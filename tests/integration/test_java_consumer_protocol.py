"""The Java client (kafka-clients 3.9.1) with `group.protocol=consumer`: two transactional
copiers (tests/java/TxnCopier.java) in one consumer-protocol group copy an input that
keeps arriving while a copier is SIGKILLed and restarted (same transactional id) a few
times. Every input record ends up in the output exactly once (read_committed), and the
group's committed offsets reach the input's end.

kafka-clients 3.9.1 speaks ConsumerGroupHeartbeat v0 (the coordinator makes the member id)
and OffsetCommit/OffsetFetch v9 with member epochs.
"""

from __future__ import annotations

import random
import subprocess
import time

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient

from tests.helpers import create_topic, unique
from tests.integration.test_consumer_protocol_copier import (
    committed_offsets,
    end_offsets,
    feed,
    read_committed,
)
from tests.java_support import java_command

COPIERS = 2
KILLS = 3
LIFETIME_S = (4.0, 7.0)  # a JVM takes a couple of seconds to start and join
FEED_S = 15.0
FINISH_TIMEOUT_S = 90.0
SEED = 3
PARTITIONS = 12
BROKER_ARGS = ("--group-initial-rebalance-delay-ms", "0", "--offsets-topic-partitions", "4",
               "--transaction-state-partitions", "4",
               "--group-consumer-session-timeout-ms", "4000",
               "--group-consumer-heartbeat-interval-ms", "500")


@pytest.mark.timeout(300)
def test_java_consumer_protocol_copiers_exactly_once_through_kills(onceflow_broker_process,
                                                                    tmp_path):
    from tests.integration.test_consumer_protocol_copier import RECORDS
    broker = onceflow_broker_process(args=BROKER_ARGS)
    bootstrap, run = broker.bootstrap_servers, unique("java848")
    source = create_topic(bootstrap, f"{run}-in", PARTITIONS)
    target = create_topic(bootstrap, f"{run}-out", PARTITIONS)
    group = f"{run}-copier"
    _commit_start(bootstrap, group, source)

    def start(instance: int) -> subprocess.Popen:
        log = open(tmp_path / f"copier-{instance}.log", "a")  # noqa: SIM115 - the child holds it
        return subprocess.Popen(java_command("TxnCopier", bootstrap, source, target, group,
                                             str(instance), "consumer"),
                                stdout=log, stderr=log)

    copiers = [start(i) for i in range(COPIERS)]
    feeder = feed(bootstrap, source, FEED_S)
    rng = random.Random(SEED)
    try:
        for _ in range(KILLS):
            time.sleep(rng.uniform(*LIFETIME_S))
            victim = rng.randrange(COPIERS)
            copiers[victim].kill()
            copiers[victim].wait()
            copiers[victim] = start(victim)
            _restart_exited(copiers, start)
        feeder.join(FINISH_TIMEOUT_S)
        ends = end_offsets(bootstrap, source)
        deadline = time.monotonic() + FINISH_TIMEOUT_S
        while committed_offsets(bootstrap, group, source) != ends:
            assert time.monotonic() < deadline, "the Java copiers did not finish"
            _restart_exited(copiers, start)
            time.sleep(0.5)
    finally:
        for copier in copiers:
            copier.kill()
            copier.wait()

    seen = read_committed(bootstrap, target)
    expected = {f"RECORD-{i}".encode() for i in range(RECORDS)}
    duplicated = {value: n for value, n in seen.items() if n > 1}
    assert not duplicated, f"{len(duplicated)} records copied twice, e.g. {list(duplicated)[:3]}"
    assert set(seen) == expected, f"{len(expected - set(seen))} input records missing"
    logs = "".join(p.read_text() for p in tmp_path.glob("copier-*.log"))
    assert '"committed"' in logs, "no transaction was committed by a Java copier"


def _commit_start(bootstrap: str, group: str, topic: str) -> None:
    """Offset 0 committed for every input partition before any copier joins: the copiers
    run with auto.offset.reset=none (tests/java/TxnCopier.java says why)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    request = ConsumerGroupTopicPartitions(
        group, [TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    result = admin.alter_consumer_group_offsets([request])[group].result(30)
    assert all(tp.error is None for tp in result.topic_partitions), result


def _restart_exited(copiers: list[subprocess.Popen], start) -> None:
    """A copier that exited (fenced, or NoOffsetForPartition after a reset) is restarted
    by its supervisor, as in production."""
    for i, copier in enumerate(copiers):
        if copier.poll() is not None:
            copiers[i] = start(i)
