"""Shared pieces of the consumer group tests: a broker with fast group settings, group
consumers in child processes (tests/integration/group_worker.py), waiting helpers."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from tests.helpers import TIMEOUT_S
from tests import helpers

WORKER = Path(__file__).with_name("group_worker.py")
# Broker settings that keep group tests fast: few __consumer_offsets partitions (each is
# a directory with files), a short initial rebalance delay, short sessions allowed.
FAST_GROUPS = {"offsets_topic_num_partitions": 4, "group_initial_rebalance_delay_ms": 200,
               "group_min_session_timeout_ms": 1000}
FAST_GROUPS_ARGS = ("--offsets-topic-partitions", "4", "--group-initial-rebalance-delay-ms",
                    "200", "--group-min-session-timeout-ms", "1000")
SESSION_MS = 3000  # a crashed consumer's partitions move after this
WAIT_S = 40.0  # bound on any one wait (rebalances, processing)
POLL_S = 0.1


@pytest.fixture(scope="module")
def groups_broker() -> Iterator:
    from onceflow.broker.embedded import Broker

    with Broker(**FAST_GROUPS) as broker:
        yield broker


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    helpers.wait_for(condition, what, timeout_s, POLL_S)


class Worker:
    """A group consumer in a child process; its log says what it processed and owned."""

    def __init__(self, client: str, bootstrap: str, group: str, topic: str, log_path: Path,
                 session_ms: int = SESSION_MS, instance: str | None = None) -> None:
        self.log_path = log_path
        args = [client, bootstrap, group, topic, str(log_path), str(session_ms)]
        self._command = [sys.executable, str(WORKER), *args, *([instance] if instance else [])]
        self.process: subprocess.Popen | None = None

    def start(self) -> Worker:
        self.process = subprocess.Popen(self._command, stderr=subprocess.DEVNULL)
        return self

    def stop(self) -> None:
        """Graceful: final commit, close (LeaveGroup for dynamic members)."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        assert self.process.wait(timeout=WAIT_S) == 0
        assert self.lines()[-1] == "closed"

    def kill(self) -> None:
        """The crash: no LeaveGroup, no final commit."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def lines(self) -> list[str]:
        return self.log_path.read_text().splitlines() if self.log_path.exists() else []

    def processed(self) -> list[int]:
        return [int(line.split()[3]) for line in self.lines() if line.startswith("r ")]

    def assignments(self) -> list[tuple[int, ...]]:
        return [tuple(int(p) for p in line[2:].split(",") if p)
                for line in self.lines() if line.startswith("a ")]

    def assignment(self) -> tuple[int, ...]:
        history = self.assignments()
        return history[-1] if history else ()


def assignment_settled(workers: list[Worker], partitions: int) -> Callable[[], bool]:
    """Every worker owns a share and together they own each partition exactly once."""
    def settled() -> bool:
        owned = [p for w in workers for p in w.assignment()]
        return all(w.assignment() for w in workers) and sorted(owned) == list(range(partitions))
    return settled


class Records:
    """Numbered records produced round-robin over the partitions of a topic."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.topic = topic
        self.partitions = partitions
        self.count = 0
        self._producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                                   "linger.ms": 5})

    def produce(self, n: int) -> None:
        for i in range(self.count, self.count + n):
            self._producer.produce(self.topic, str(i).encode(), partition=i % self.partitions)
        self.count += n
        assert self._producer.flush(TIMEOUT_S) == 0

    def end_offsets(self) -> dict[int, int]:
        """Log end offsets: what a fully caught-up group has committed."""
        return {p: len(range(p, self.count, self.partitions)) for p in range(self.partitions)}


def all_processed(workers: list[Worker], records: Records) -> Callable[[], bool]:
    def done() -> bool:
        seen = {value for w in workers for value in w.processed()}
        return seen >= set(range(records.count))
    return done


def committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The group's committed offsets (OffsetFetch through a consumer that does not join)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        found = consumer.committed([TopicPartition(topic, p) for p in range(partitions)],
                                   timeout=TIMEOUT_S)
    finally:
        consumer.close()
    return {tp.partition: tp.offset for tp in found}
