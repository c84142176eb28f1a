"""Helpers of the processor tests: topics, producing, reading back, committed offsets.

Every loop here is bounded by a deadline, so a broken processor fails a test instead
of hanging it.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

PARTITIONS = 4  # librdkafka's mock cluster auto-creates topics with 4 partitions
WORKER = Path(__file__).with_name("worker.py")


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def create_topic(bootstrap: str, name: str, *, mock: bool, partitions: int = PARTITIONS) -> None:
    if mock:
        # The mock cluster has no CreateTopics; a metadata request auto-creates.
        Producer({"bootstrap.servers": bootstrap}).list_topics(topic=name, timeout=10)
        return
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        future.result(timeout=30)


def produce(bootstrap: str, topic: str, records: Iterable[tuple[bytes | None, bytes]]) -> int:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5}
    )
    count = 0
    for key, value in records:
        while True:
            try:
                producer.produce(topic, key=key, value=value)
                break
            except BufferError:
                producer.poll(0.05)
        count += 1
    assert producer.flush(30) == 0, "records not delivered"
    return count


def wait_until(predicate: Callable[[], bool], timeout_s: float, interval_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()


def end_offsets(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("probe")})
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(partitions)
        }
    finally:
        consumer.close()


def committed(
    bootstrap: str, group: str, topic: str, partitions: int = PARTITIONS
) -> list[TopicPartition]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        return consumer.committed(tps, timeout=10)
    finally:
        consumer.close()


def read_all(
    bootstrap: str,
    topic: str,
    *,
    expected: int,
    timeout_s: float,
    isolation: str = "read_committed",
    partitions: int = PARTITIONS,
) -> list[Any]:
    """Messages of `topic` from the start, until `expected` arrived or the time is up
    (then a short quiet period more, to see duplicates that arrive late)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique("reader"),
            "isolation.level": isolation,
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    messages: list[Any] = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            batch = consumer.consume(1000, 0.2)
            messages.extend(m for m in batch if m.error() is None)
            if len(messages) >= expected and not batch:
                break
        return messages
    finally:
        consumer.close()


def wait_for_values(bootstrap: str, topic: str, values: set[bytes], timeout_s: float) -> bool:
    """True once every value in `values` was read (read_committed) from `topic`."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": unique("waiter"), "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    missing = set(values)
    deadline = time.monotonic() + timeout_s
    try:
        while missing and time.monotonic() < deadline:
            for message in consumer.consume(1000, 0.2):
                if message.error() is None:
                    missing.discard(message.value())
        return not missing
    finally:
        consumer.close()


class Worker:
    """A processor in a child process (tests/processor/worker.py), to be SIGKILLed."""

    def __init__(self, args: list[str], log_path: Path) -> None:
        self.log_path = log_path
        self.process = subprocess.Popen(
            [sys.executable, str(WORKER), *args],
            stdout=subprocess.DEVNULL,
            stderr=open(log_path.with_suffix(".stderr"), "ab"),  # noqa: SIM115
        )

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self, timeout_s: float = 30) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout_s)

    def alive(self) -> bool:
        return self.process.poll() is None


def processed_lines(path: Path) -> list[tuple[int, int]]:
    """(partition, offset) pairs a worker logged, one line per processed record."""
    if not path.exists():
        return []
    pairs = []
    for line in path.read_text().splitlines():
        fields = line.split()
        if len(fields) == 2:  # a line cut by SIGKILL has fewer fields
            pairs.append((int(fields[0]), int(fields[1])))
    return pairs


class GroupAnchor:
    """A member that stays in a consumer group for a whole crash test, subscribed to a
    topic of its own so it owns none of the processor's partitions.

    On the mock cluster this keeps the group from becoming empty between a worker's
    death and its successor's join, which would cost the 3 s initial rebalance delay
    again. On a real broker it is just an idle member.
    """

    def __init__(self, bootstrap: str, group: str, *, mock: bool, session_timeout_ms: int) -> None:
        topic = unique("anchor")
        create_topic(bootstrap, topic, mock=mock)
        self._member = _Member(bootstrap, group, topic, session_timeout_ms)
        assert wait_until(lambda: self._member.assigned, 30), "anchor never joined"

    def close(self) -> None:
        self._member.close()


class _Member:
    """A group member polled by its own thread."""

    def __init__(self, bootstrap: str, group: str, topic: str, session_timeout_ms: int) -> None:
        self.assigned = False
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "partition.assignment.strategy": "cooperative-sticky",
                "session.timeout.ms": session_timeout_ms,
                "heartbeat.interval.ms": min(250, session_timeout_ms // 4),
            }
        )
        self._consumer.subscribe([topic], on_assign=self._on_assign)
        self._running = True
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _on_assign(self, _consumer: Any, partitions: Any) -> None:
        if partitions:
            self.assigned = True

    def _poll(self) -> None:
        while self._running:
            self._consumer.poll(0.05)

    def close(self) -> None:
        self._running = False
        self._thread.join(5)
        self._consumer.close()


def env_session_timeout_ms(on_mock: bool) -> int:
    # Kafka refuses session timeouts under group.min.session.timeout.ms (6 s by default);
    # the mock accepts shorter ones, and holds every rebalance for (session - 1 s), so a
    # short one keeps the rebalance and crash tests fast. It must stay above the mock's
    # 3 s initial rebalance delay, or a lone joining member times out while it waits.
    return 3500 if on_mock else 6000
