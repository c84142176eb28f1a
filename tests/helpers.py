"""Small helpers shared by the integration tests."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

TIMEOUT_S = 15


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def create_topic(bootstrap: str, name: str, partitions: int = 1, replication_factor: int = 1,
                 config: dict[str, str] | None = None) -> str:
    # Keep the AdminClient referenced until the result arrives: a collected client
    # cancels its pending requests.
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, partitions, replication_factor, config=config or {})])
    futures[name].result(TIMEOUT_S)
    return name


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float, poll_s: float = 0.1) -> None:
    """Poll `condition` until it holds; AssertionError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(poll_s)


def read_partition(bootstrap: str, topic: str, partition: int = 0,
                   timeout_s: float = 30) -> list[Message]:
    """Every record of one partition from its start to its end (read_uncommitted's end:
    the high watermark); AssertionError on a consumer error or no end within `timeout_s`."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("r"),
                         "enable.auto.commit": False, "enable.partition.eof": True})
    try:
        consumer.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
        out: list[Message] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            message = consumer.poll(1)
            if message is None:
                continue
            if message.error() is not None:
                if message.error().code() == KafkaError._PARTITION_EOF:
                    return out
                raise AssertionError(message.error())
            out.append(message)
        raise AssertionError(f"no end of partition within {timeout_s:g} s")
    finally:
        consumer.close()
