"""Topics and partitions: offsets (log start, last stable, high watermark), configs with
their sources, a partition's producers and segments.

Theory of operation: the topic list comes from the cached metadata alone, so it costs
nothing per page with thousands of topics. A topic page adds three ListOffsets answers
for its partitions (earliest; latest read_uncommitted = high watermark; latest
read_committed = last stable offset); its configs (DescribeConfigs) come in a fragment
of their own. A partition page adds
DescribeProducers (who holds the LSO back: the producer whose open transaction starts at
it) and, when the broker serving the console offers them, the segments.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from confluent_kafka import IsolationLevel
from confluent_kafka.admin import ConfigResource, ConfigSource, OffsetSpec

from onceflow.client.admin import ClientError, NotFoundError, describe_kafka_error
from onceflow.client.cluster import Partition, list_offsets
from onceflow.client.transactions import NO_OFFSET, ProducerState, describe_producers
from onceflow.console.backend import Backend, SegmentLike

ADMIN_TIMEOUT_S = 10.0
# What the console calls each DescribeConfigs source (Kafka's names, readable).
SOURCE_NAMES = {
    ConfigSource.DYNAMIC_TOPIC_CONFIG: "topic",
    ConfigSource.DYNAMIC_BROKER_CONFIG: "broker (dynamic)",
    ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG: "cluster default (dynamic)",
    ConfigSource.STATIC_BROKER_CONFIG: "broker (static)",
    ConfigSource.DEFAULT_CONFIG: "default",
}


def source_name(source: int | ConfigSource) -> str:
    """confluent-kafka gives the source as a plain int; Kafka's name, readable."""
    try:
        return SOURCE_NAMES.get(ConfigSource(source), ConfigSource(source).name.lower())
    except ValueError:
        return f"source {source}"


@dataclasses.dataclass(frozen=True, slots=True)
class TopicSummary:
    name: str
    partitions: int
    internal: bool
    error: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class PartitionRow:
    partition: int
    leader: int
    replicas: tuple[int, ...]
    isrs: tuple[int, ...]
    log_start: int | None
    last_stable: int | None
    high_watermark: int | None

    @property
    def held_back(self) -> int | None:
        """Records a read_committed consumer cannot read yet (HW - LSO)."""
        if self.high_watermark is None or self.last_stable is None:
            return None
        return self.high_watermark - self.last_stable

    @property
    def retained(self) -> int | None:
        if self.high_watermark is None or self.log_start is None:
            return None
        return self.high_watermark - self.log_start


@dataclasses.dataclass(frozen=True, slots=True)
class ConfigRow:
    name: str
    value: str | None
    source: str
    sensitive: bool
    read_only: bool


@dataclasses.dataclass
class TopicView:
    name: str
    internal: bool
    partitions: list[PartitionRow]


@dataclasses.dataclass
class PartitionView:
    topic: str
    row: PartitionRow
    producers: list[ProducerState]
    holder: ProducerState | None        # whose open transaction holds the LSO
    segments: Sequence[SegmentLike] | None   # None: the cluster does not offer them
    notes: list[str]


def topic_list(backend: Backend) -> list[TopicSummary]:
    metadata = backend.metadata()
    return [TopicSummary(name, len(topic.partitions), name.startswith("__"),
                         None if topic.error is None else describe_kafka_error(topic.error))
            for name, topic in sorted(metadata.topics.items())]


def partition_rows(backend: Backend, topic: str, indexes: Sequence[int]) -> list[PartitionRow]:
    metadata = backend.metadata()
    keys: list[Partition] = [(topic, i) for i in indexes]
    admin = backend.cluster().admin
    start = list_offsets(admin, keys, OffsetSpec.earliest())
    end = list_offsets(admin, keys, OffsetSpec.latest())
    stable = list_offsets(admin, keys, OffsetSpec.latest(), IsolationLevel.READ_COMMITTED)
    rows = []
    for key in keys:
        found = metadata.topics[topic].partitions[key[1]]
        rows.append(PartitionRow(key[1], found.leader, tuple(found.replicas), tuple(found.isrs),
                                 start.get(key), stable.get(key), end.get(key)))
    return rows


def topic_view(backend: Backend, topic: str) -> TopicView:
    indexes = backend.partitions_of(topic)
    return TopicView(topic, topic.startswith("__"), partition_rows(backend, topic, indexes))


def topic_configs(backend: Backend, topic: str, notes: list[str]) -> list[ConfigRow]:
    """DescribeConfigs of the topic; a cluster that does not answer it gets a note (the
    topic page loads them separately, so it never waits for them)."""
    backend.partitions_of(topic)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    futures = backend.cluster().admin.describe_configs([resource],
                                                        request_timeout=ADMIN_TIMEOUT_S)
    try:
        entries = futures[resource].result(timeout=ADMIN_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - a KafkaException or a timeout: shown, not fatal
        notes.append(f"configs unavailable: {describe_kafka_error(exc.args[0] if exc.args else exc)}")
        return []
    return [ConfigRow(name, None if entry.is_sensitive else entry.value,
                      source_name(entry.source),
                      entry.is_sensitive, entry.is_read_only)
            for name, entry in sorted(entries.items())]


def partition_view(backend: Backend, topic: str, partition: int) -> PartitionView:
    if partition not in backend.partitions_of(topic):
        raise NotFoundError(f"topic '{topic}' has no partition {partition}")
    (row,) = partition_rows(backend, topic, [partition])
    notes: list[str] = []
    producers: list[ProducerState] = []
    try:
        producers = describe_producers(backend.cluster(), [(topic, partition)]).get(
            (topic, partition), [])
    except ClientError as exc:
        notes.append(f"producers unavailable (DescribeProducers): {exc}")
    holder = next((p for p in producers if p.txn_start_offset != NO_OFFSET
                   and p.txn_start_offset == row.last_stable), None)
    segments = backend.extras.segments(topic, partition) if backend.extras else None
    return PartitionView(topic, row, sorted(producers, key=lambda p: p.producer_id), holder,
                         segments, notes)
