"""Spark pipelines, from the exactly-once sink's progress topic.

Theory of operation: every write task of an `onceflow-kafka` sink commits one progress
record per micro-batch and write partition (`onceflow.spark.progress`: key
"<query id>/<partition>", value {query, partition, batch, records, time_ms,
transactional_id}) in the same transaction as its rows. Reading the committed records
of the progress topic therefore tells, per query (one sink of a pipeline), which batch
each write partition has committed, how many rows it wrote, and when. Only the newest
`PROGRESS_OFFSETS_READ` offsets of each progress partition are read (the topic is
compacted; its tail holds the recent batches), so the page costs the same however long
the pipelines have run.

A batch's duration is measured from the commits: the time from the last commit of the
previous batch to the last commit of this one (micro-batches run one after another), so
it needs both batches in the records read.
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict

from confluent_kafka import KafkaError, TopicPartition

from onceflow.client.admin import ClientError, NotFoundError
from onceflow.console.backend import Backend
from onceflow.spark.progress import DEFAULT_TOPIC, ProgressError, ProgressRecord

# Newest offsets read per progress partition (records and markers: about two per task and
# batch), enough for the last batches of ~100 write tasks.
PROGRESS_OFFSETS_READ = 2_000
READ_TIMEOUT_S = 5.0
POLL_S = 0.1


@dataclasses.dataclass(frozen=True, slots=True)
class SinkPartition:
    partition: int
    batch: int
    records: int
    time_ms: int


@dataclasses.dataclass
class QueryProgress:
    query: str
    transactional_id_prefix: str
    partitions: list[SinkPartition]
    last_batch: int
    batches_seen: int
    last_batch_records: int
    last_batch_duration_ms: int | None
    last_commit_ms: int


@dataclasses.dataclass
class PipelinesView:
    topic: str
    queries: list[QueryProgress]
    notes: list[str]


def pipelines_view(backend: Backend, topic: str = DEFAULT_TOPIC) -> PipelinesView:
    try:
        partitions = backend.partitions_of(topic)
    except NotFoundError:
        note = (f"no progress topic '{topic}': no exactly-once Spark sink has written to "
                "this cluster yet")
        return PipelinesView(topic, [], [note])
    notes: list[str] = []
    records = _read_progress(backend, topic, partitions, notes)
    by_query: dict[str, list[ProgressRecord]] = defaultdict(list)
    for record in records:
        by_query[record.query].append(record)
    queries = [_query(query, found_records) for query, found_records in sorted(by_query.items())]
    queries.sort(key=lambda q: -q.last_commit_ms)
    return PipelinesView(topic, queries, notes)


def _query(query: str, records: list[ProgressRecord]) -> QueryProgress:
    latest: dict[int, ProgressRecord] = {}
    batch_end_ms: dict[int, int] = defaultdict(int)
    batch_records: dict[int, int] = defaultdict(int)
    for r in records:
        if r.partition not in latest or r.batch >= latest[r.partition].batch:
            latest[r.partition] = r
        batch_end_ms[r.batch] = max(batch_end_ms[r.batch], r.time_ms)
        batch_records[r.batch] += r.records
    last_batch = max(batch_end_ms)
    previous = [b for b in batch_end_ms if b < last_batch]
    duration = batch_end_ms[last_batch] - batch_end_ms[max(previous)] if previous else None
    sample = next(iter(latest.values()))
    prefix = sample.transactional_id.removesuffix(f"-{query}-{sample.partition}")
    return QueryProgress(query, prefix,
                         [SinkPartition(p, r.batch, r.records, r.time_ms)
                          for p, r in sorted(latest.items())],
                         last_batch, len(batch_end_ms), batch_records[last_batch], duration,
                         batch_end_ms[last_batch])


def _read_progress(backend: Backend, topic: str, partitions: list[int],
                   notes: list[str]) -> list[ProgressRecord]:
    consumer = backend.reader("read_committed", **{"fetch.wait.max.ms": 10})
    try:
        ends = {}
        assignment = []
        for p in partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p),
                                                       timeout=READ_TIMEOUT_S, cached=False)
            if high > low:
                ends[p] = high
                assignment.append(TopicPartition(topic, p, max(low, high - PROGRESS_OFFSETS_READ)))
        if not assignment:
            return []
        consumer.assign(assignment)
        return _consume(consumer, topic, ends, notes)
    except ClientError:
        raise
    except Exception as exc:  # noqa: BLE001 - librdkafka errors: said on the page
        raise ClientError(f"reading {topic}: {exc}") from None
    finally:
        consumer.close()


def _consume(consumer, topic: str, ends: dict[int, int], notes: list[str]) -> list[ProgressRecord]:
    records = []
    remaining = set(ends)
    deadline = time.monotonic() + READ_TIMEOUT_S
    while remaining and time.monotonic() < deadline:
        for message in consumer.consume(500, POLL_S):
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    remaining.discard(message.partition())
                    continue
                raise ClientError(f"reading {topic}: {error.str()}")
            try:
                records.append(ProgressRecord.decode(message.value()))
            except ProgressError as exc:
                notes.append(str(exc))
            if message.offset() >= ends[message.partition()] - 1:
                remaining.discard(message.partition())
    if remaining:
        notes.append(f"partitions {sorted(remaining)} of {topic} were not read to their end "
                     "(an open transaction holds their last stable offset back)")
    return records
