"""The relay's progress: the next outbox sequence number to publish, kept in Kafka.

The relay writes one record per published batch to a compacted topic (default
`next-outbox-seq`), key = relay name, value = JSON {"next_seq": ..., "outbox_id": ...},
inside the Kafka transaction that holds the batch's records. So the records and the
progress commit together: a reader of the progress record never sees a position that the
records before it did not reach, nor the other way round.

Reading it back (`read`) uses a read_committed consumer up to each partition's last stable
offset (LSO): an open or aborted transaction's progress record is never taken. The relay
reads it only after `init_transactions()`, which ends (aborts) whatever its predecessor
left open, so what it reads is final. To avoid scanning a topic that compaction may
never have shortened, it reads backwards in growing windows from the LSO and stops at the
first window that holds a record of its name.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
import uuid
from collections.abc import Mapping

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

DEFAULT_PROGRESS_TOPIC = "next-outbox-seq"
FORMAT_VERSION = 1
# The first window read back from the LSO, and its growth factor while nothing is found.
WINDOW_OFFSETS_FIRST = 256
WINDOW_GROWTH = 8
READ_TIMEOUT_S = 60.0
CONSUME_BATCH_MAX = 500
CONSUME_WAIT_S = 0.2
ADMIN_TIMEOUT_S = 30.0

_LOG = logging.getLogger("onceflow.outbox.librdkafka")
_LOG.addHandler(logging.NullHandler())
_LOG.propagate = False


class ProgressError(Exception):
    """The progress topic cannot be read, or holds a record we cannot trust."""


@dataclasses.dataclass(frozen=True)
class Progress:
    next_seq: int          # the first outbox sequence number not yet published
    outbox_id: str         # which outbox (database) these numbers belong to
    table: str

    def encode(self) -> bytes:
        return json.dumps({"version": FORMAT_VERSION, "next_seq": self.next_seq,
                           "outbox_id": self.outbox_id, "table": self.table}).encode()

    @classmethod
    def decode(cls, value: bytes | None) -> Progress:
        try:
            record = json.loads(value or b"")
            return cls(int(record["next_seq"]), str(record["outbox_id"]), str(record["table"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise ProgressError(f"unreadable progress record {value[:200]!r}: {exc}") from None


def client_config(bootstrap_servers: str,
                  properties: Mapping[str, str] | None = None) -> dict[str, object]:
    """librdkafka settings: `properties` (security.protocol, sasl.*, ssl.* ...) first."""
    return {**(properties or {}), "bootstrap.servers": bootstrap_servers, "logger": _LOG}


def ensure_topic(bootstrap_servers: str, topic: str,
                 properties: Mapping[str, str] | None = None) -> None:
    """Create the compacted progress topic unless it exists."""
    admin = AdminClient(client_config(bootstrap_servers, properties))
    if topic in admin.list_topics(timeout=ADMIN_TIMEOUT_S).topics:
        return
    new_topic = NewTopic(topic, 1, 1, config={"cleanup.policy": "compact"})
    future = admin.create_topics([new_topic])[topic]
    try:
        future.result(ADMIN_TIMEOUT_S)
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise


def read(bootstrap_servers: str, topic: str, name: str,
         timeout_s: float = READ_TIMEOUT_S,
         properties: Mapping[str, str] | None = None) -> Progress | None:
    """The latest committed progress record of relay `name`; None if it has none."""
    consumer = Consumer({**client_config(bootstrap_servers, properties),
                         "group.id": f"onceflow-outbox-reader-{uuid.uuid4().hex[:12]}",
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "enable.partition.eof": True})
    deadline = time.monotonic() + timeout_s
    try:
        metadata = consumer.list_topics(topic, timeout=timeout_s).topics[topic]
        if metadata.error is not None:
            if metadata.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                return None
            raise ProgressError(f"progress topic '{topic}': {metadata.error.str()}")
        found = [_latest_in_partition(consumer, topic, p, name.encode(), deadline)
                 for p in sorted(metadata.partitions)]
    finally:
        consumer.close()
    progress = [p for p in found if p is not None]
    # One relay writes one partition; were the topic re-partitioned, the highest wins
    # (next_seq only grows).
    return max(progress, key=lambda p: p.next_seq) if progress else None


def _latest_in_partition(consumer: Consumer, topic: str, partition: int, key: bytes,
                         deadline: float) -> Progress | None:
    low, stable = consumer.get_watermark_offsets(TopicPartition(topic, partition),
                                                 timeout=max(deadline - time.monotonic(), 1))
    window = WINDOW_OFFSETS_FIRST
    while True:
        start = max(low, stable - window)
        value = _last_value_for(consumer, TopicPartition(topic, partition, start), stable, key,
                                deadline)
        if value is not None:
            return Progress.decode(value)
        if start <= low:
            return None
        window *= WINDOW_GROWTH


def _last_value_for(consumer: Consumer, start: TopicPartition, end: int, key: bytes,
                    deadline: float) -> bytes | None:
    """The value of the last committed record with `key` in [start.offset, end)."""
    if start.offset >= end:
        return None
    consumer.assign([start])
    last = None
    while True:
        for message in consumer.consume(CONSUME_BATCH_MAX, CONSUME_WAIT_S):
            error = message.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(error)
                if message.offset() >= end:  # read_committed EOF: the LSO is reached
                    return last
                continue
            if message.offset() >= end:
                return last
            if message.key() == key:
                last = message.value()
            if message.offset() + 1 >= end:
                return last
        if time.monotonic() > deadline:
            raise ProgressError(f"reading {start.topic}-{start.partition} up to offset {end} "
                                f"took too long")
