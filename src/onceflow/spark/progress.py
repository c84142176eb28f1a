"""The progress topic of the exactly-once Kafka sink: which micro-batch each write partition
of each query has committed, and how a write task finds out cheaply and correctly.

Theory of operation. A write task for (query, batch, partition) commits its rows and one
progress record in the same Kafka transaction, so "the progress record of batch n is
committed" and "the rows of batch n are committed" are the same fact. When Spark replays a
batch (the driver died after the tasks committed but before its commit log said so), the
replayed task asks for the latest committed progress record of its key and skips the batch
if that record is for batch n or later.

The record. Key `"<query id>/<partition id>"` (UTF-8), so a compacted topic keeps the latest
record per key. Value: a JSON object `{"v": 1, "query", "batch", "partition", "records",
"time_ms", "transactional_id"}`; `v` is the format version, and a reader refuses a version it
does not know rather than guess. Kafka's record batch CRC-32C covers the bytes.

Where it goes. Partition `(crc32(query id) + partition id) mod N` of the progress topic, N
being the topic's partition count read from the cluster (not the option, which only sizes a
new topic). The partitions of one query thus land on different progress partitions while
the write stage has at most N partitions, so its tasks never wait for each other below.
Adding partitions to an existing progress topic moves keys and breaks the lookup: don't.

The lookup, after the task's `init_transactions()` returned. That call completed (commit
or abort) every earlier transaction of our transactional id, so our previous progress
record, if any, is decided and lies below the partition's high watermark HW0 observed now.
A read_committed reader sees only up to the last stable offset (LSO): another task's open
transaction on the same progress partition keeps the LSO below its first record, hiding
our committed record above it. So we wait until LSO >= HW0; then everything below HW0 is
decided and visible. No separate wait is needed: a read_committed read of [start, HW0) that
reaches HW0 has seen the LSO pass it, and one that stops below keeps polling. The wait is
short and cannot deadlock: other writers add their
progress record only right before their commit, never wait for us while their transaction
is open, and the broker aborts any transaction older than its transaction timeout - which
bounds the wait (a clear error after that). Our previous record is recent (the partition
gets a record and a marker per task and batch), so we read backwards from HW0 in doubling
windows [HW0 - w, HW0) until a record of our key appears or the log start is reached: the
last record of our key in the first window that has one is the latest.

Batch decisions (`atomicity=batch`, batch_commit.py). The driver records, before it commits
a micro-batch's prepared transactions, one `BatchDecision` under key `"<query id>/batch"`
in partition `crc32(query id) mod N`: `{"v": 1, "query", "batch", "transactions":
[[transactional id, producer id, epoch], ...], "time_ms"}`. It is written by a plain
idempotent producer with acks=all, so it is durable before any transaction commits; the
latest one is found with the same backward read as above (`latest_decision`).
"""

from __future__ import annotations

import dataclasses
import json
import time
import zlib
from collections.abc import Mapping

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

FORMAT_VERSION = 1
DEFAULT_TOPIC = "_onceflow_spark_progress"
# More partitions, fewer tasks sharing one (they wait briefly for each other's commit).
DEFAULT_PARTITIONS = 16
# -1: the broker's default.replication.factor.
DEFAULT_REPLICATION_FACTOR = -1
# First lookup window, in offsets below HW0. Each task and batch adds two offsets (record
# and marker) to its progress partition, so 256 covers the last batches of ~100 tasks.
LOOKUP_WINDOW_OFFSETS = 256
# How long one metadata, watermark or consume call may block before we re-check deadlines.
CALL_TIMEOUT_S = 10.0
POLL_WAIT_S = 0.05
# A topic just created may be missing from metadata for a moment on a real cluster.
METADATA_ATTEMPTS_MAX = 20
METADATA_RETRY_S = 0.25
# The broker checks for timed-out transactions periodically (Kafka: every 10 s), so the
# LSO may stay held this long after a dead writer's transaction timeout has passed.
ABORT_CHECK_MARGIN_MS = 15_000


class ProgressError(RuntimeError):
    """The progress topic could not be read or created, or holds a record we cannot read."""


@dataclasses.dataclass(frozen=True, slots=True)
class ProgressRecord:
    query: str
    partition: int
    batch: int
    records: int
    time_ms: int
    transactional_id: str

    def key(self) -> bytes:
        return progress_key(self.query, self.partition)

    def encode(self) -> bytes:
        fields = {"v": FORMAT_VERSION, **dataclasses.asdict(self)}
        return json.dumps(fields, separators=(",", ":")).encode()

    @staticmethod
    def decode(value: bytes) -> ProgressRecord:
        try:
            fields = json.loads(value)
            version = fields.pop("v")
        except (ValueError, TypeError, KeyError, AttributeError) as error:
            raise ProgressError(f"unreadable progress record {value[:200]!r}: {error}") from None
        if version != FORMAT_VERSION:
            raise ProgressError(f"progress record format v{version} is not known to this "
                                f"onceflow (v{FORMAT_VERSION}): {value[:200]!r}")
        return ProgressRecord(**fields)


@dataclasses.dataclass(frozen=True, slots=True)
class BatchDecision:
    """The driver's decision to commit a micro-batch's prepared transactions."""

    query: str
    batch: int
    transactions: tuple[tuple[str, int, int], ...]  # (transactional id, producer id, epoch)
    time_ms: int

    def key(self) -> bytes:
        return decision_key(self.query)

    def encode(self) -> bytes:
        fields = {"v": FORMAT_VERSION, "query": self.query, "batch": self.batch,
                  "transactions": [list(t) for t in self.transactions], "time_ms": self.time_ms}
        return json.dumps(fields, separators=(",", ":")).encode()

    @staticmethod
    def decode(value: bytes) -> BatchDecision:
        try:
            fields = json.loads(value)
            version = fields.pop("v")
            if version == FORMAT_VERSION:
                return BatchDecision(
                    query=fields["query"], batch=int(fields["batch"]),
                    transactions=tuple((str(t), int(p), int(e))
                                       for t, p, e in fields["transactions"]),
                    time_ms=int(fields["time_ms"]))
        except (ValueError, TypeError, KeyError, AttributeError) as error:
            raise ProgressError(f"unreadable batch decision {value[:200]!r}: {error}") from None
        raise ProgressError(f"batch decision format v{version} is not known to this onceflow "
                            f"(v{FORMAT_VERSION}): {value[:200]!r}")


def decision_key(query: str) -> bytes:
    return f"{query}/batch".encode()


def decision_partition(query: str, partition_count: int) -> int:
    return zlib.crc32(query.encode()) % partition_count


def progress_key(query: str, partition: int) -> bytes:
    return f"{query}/{partition}".encode()


def progress_partition(query: str, partition: int, partition_count: int) -> int:
    """The progress partition of (query, write partition); see the module docstring."""
    return (zlib.crc32(query.encode()) + partition) % partition_count


class ProgressLog:
    """One progress topic as seen from a write task: created on first use, then looked up.

    Holds two plain consumers (never in a group): a read_uncommitted one for the high
    watermark and a read_committed one for the LSO and the reads. Safe to keep for the life
    of a Python worker; not thread-safe.
    """

    def __init__(self, bootstrap: str, topic: str, *, partitions: int = DEFAULT_PARTITIONS,
                 replication_factor: int = DEFAULT_REPLICATION_FACTOR,
                 client_config: Mapping[str, str] | None = None) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.partitions_wanted = partitions
        self.replication_factor = replication_factor
        self.client_config = dict(client_config or {})
        self._partition_count: int | None = None
        base = {**self.client_config, "bootstrap.servers": bootstrap,
                "group.id": "onceflow-spark-progress", "enable.auto.commit": False,
                "enable.partition.eof": True, "fetch.wait.max.ms": 10}
        self._uncommitted = Consumer({**base, "isolation.level": "read_uncommitted"})
        self._committed = Consumer({**base, "isolation.level": "read_committed"})
        self._producer: Producer | None = None  # the driver's, for batch decisions

    def close(self) -> None:
        self._uncommitted.close()
        self._committed.close()
        if self._producer is not None:
            self._producer.flush(CALL_TIMEOUT_S)
            self._producer = None

    def partition_count(self) -> int:
        """The topic's partition count, creating it (compacted) if it does not exist."""
        if self._partition_count is None:
            count = self._describe()
            if count is None:
                self._create()
            for _ in range(METADATA_ATTEMPTS_MAX):
                count = count or self._describe()  # a new topic may take a moment to show
                if count is not None:
                    break
                time.sleep(METADATA_RETRY_S)
            else:
                raise ProgressError(f"progress topic {self.topic!r} still missing after creation")
            self._partition_count = count
        return self._partition_count

    def _describe(self) -> int | None:
        # A consumer's metadata request never auto-creates the topic (a producer's may, with
        # the broker's default partition count and without compaction).
        metadata = self._uncommitted.list_topics(self.topic, timeout=CALL_TIMEOUT_S)
        topic = metadata.topics.get(self.topic)
        if topic is None or topic.error is not None and topic.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            return None
        if topic.error is not None:
            raise ProgressError(f"progress topic {self.topic!r}: {topic.error}")
        return len(topic.partitions)

    def _create(self) -> None:
        admin = AdminClient({**self.client_config, "bootstrap.servers": self.bootstrap})
        new = NewTopic(self.topic, self.partitions_wanted, self.replication_factor,
                       config={"cleanup.policy": "compact"})
        try:
            admin.create_topics([new])[self.topic].result(CALL_TIMEOUT_S)
        except KafkaException as error:
            # Another task created it first: fine.
            if error.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise ProgressError(f"cannot create progress topic {self.topic!r}: {error}") from None

    def latest(self, query: str, partition: int, stable_timeout_ms: int) -> ProgressRecord | None:
        """The latest committed progress record of (query, partition), or None.

        Call only after `init_transactions()` of the key's transactional id returned. Waits
        while another writer's transaction keeps the partition's LSO below HW0, at most
        `stable_timeout_ms` plus the broker's abort check margin.
        """
        tp = TopicPartition(self.topic, progress_partition(query, partition, self.partition_count()))
        value = self._latest_value(tp, progress_key(query, partition), stable_timeout_ms)
        return None if value is None else ProgressRecord.decode(value)

    def latest_decision(self, query: str, stable_timeout_ms: int) -> BatchDecision | None:
        """The latest batch decision recorded for `query`, or None (same wait as `latest`)."""
        tp = TopicPartition(self.topic, decision_partition(query, self.partition_count()))
        value = self._latest_value(tp, decision_key(query), stable_timeout_ms)
        return None if value is None else BatchDecision.decode(value)

    def record_decision(self, decision: BatchDecision) -> None:
        """Write `decision` and wait until it is acknowledged by every in-sync replica."""
        if self._producer is None:
            self._producer = Producer({**self.client_config, "bootstrap.servers": self.bootstrap,
                                       "enable.idempotence": True, "acks": "all",
                                       "linger.ms": 0})
        failures: list = []
        target = decision_partition(decision.query, self.partition_count())
        self._producer.produce(self.topic, decision.encode(), decision.key(), partition=target,
                               on_delivery=lambda error, _m: failures.append(error))
        left = self._producer.flush(CALL_TIMEOUT_S * 3)
        if left or failures != [None]:
            raise ProgressError(f"recording the decision of batch {decision.batch} failed: "
                                f"{failures or f'{left} unacknowledged'}")

    def _latest_value(self, tp: TopicPartition, key: bytes, stable_timeout_ms: int) -> bytes | None:
        low, hw0 = self._uncommitted.get_watermark_offsets(tp, timeout=CALL_TIMEOUT_S, cached=False)
        deadline = time.monotonic() + (stable_timeout_ms + ABORT_CHECK_MARGIN_MS) / 1000
        window = LOOKUP_WINDOW_OFFSETS
        while True:
            start = max(low, hw0 - window)
            value = self._last_value_of(tp, key, start, hw0, deadline)
            if value is not None or start <= low:
                return value
            window *= 2

    def _last_value_of(self, tp: TopicPartition, key: bytes, start: int, end: int,
                       deadline: float) -> bytes | None:
        """The value of the last committed record with `key` in [start, end), or None.

        A read_committed consumer delivers records up to the LSO only, so reaching `end`
        also proves that the LSO has reached it (no separate wait for the LSO).
        """
        if start >= end:
            return None
        consumer = self._committed
        consumer.assign([TopicPartition(tp.topic, tp.partition, start)])
        try:
            found = None
            while time.monotonic() < deadline:
                # poll, not consume(n): consume waits for n messages or its whole timeout.
                message = consumer.poll(POLL_WAIT_S)
                if message is None or message.error() is not None:
                    self._check(message, tp)
                    # The tail of the range may be markers or aborted records, never
                    # delivered; the position moves past them. Below `end`: the LSO is
                    # still held by an open transaction, keep polling.
                    if consumer.position([tp])[0].offset >= end:
                        return found
                    continue
                if message.offset() >= end:
                    return found
                if message.key() == key:
                    found = message.value()
                if message.offset() == end - 1:
                    return found
        finally:
            consumer.unassign()
        raise ProgressError(
            f"progress partition {tp.topic}[{tp.partition}] stayed unstable: committed reads did "
            f"not reach offset {end} in time. Another writer's transaction is open there longer "
            "than its transaction timeout; check the broker (onceflow txn hanging).")

    @staticmethod
    def _check(message, tp: TopicPartition) -> None:
        if message is not None and message.error().code() != KafkaError._PARTITION_EOF:
            raise ProgressError(f"reading {tp.topic}[{tp.partition}]: {message.error()}")
