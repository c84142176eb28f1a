"""The records browser: a partition's records with their transaction structure drawn.

Theory of operation. A Kafka consumer sees records, never the structure around them:
which producer wrote a batch, whether it was transactional, the COMMIT/ABORT control
batches, which transactions aborted. The console reads both sides over the protocol:

1. a raw Fetch (read_uncommitted) from the start offset gives the batch headers of a
   window of at most `WINDOW_BYTES` - producer id and epoch, the transactional and
   control flags, the control batches themselves - plus the partition's log start,
   high watermark (HW) and last stable offset (LSO);
2. a raw Fetch (read_committed) from the same offset gives the aborted transactions
   overlapping the window (producer id, first offset), as a `read_committed` consumer
   receives them;
3. a confluent-kafka consumer (read_uncommitted) reads the records of the window
   decompressed: keys, values, headers, timestamps.

`classify` is a pure function from batch headers to a status per batch:

* a transactional batch followed, in the window, by a control batch of its producer takes
  that marker's outcome (committed / aborted);
* otherwise below the LSO its transaction is decided: aborted when the aborted-transaction
  list says so (the consumer's own rule: a producer id becomes "aborting" at its first
  offset and stops at its ABORT marker), else committed;
* otherwise (at or above the LSO, no marker yet) it is open when the partition's producer
  state (DescribeProducers) shows that producer's transaction open at or before it, else
  "pending": decided after the window's end.

The `read_committed` view shows what a read_committed consumer receives: committed and
non-transactional records below the LSO; the page counts what it hides. The
`read_uncommitted` view shows every record, the markers (which no consumer receives) and
each record's status.
"""

from __future__ import annotations

import dataclasses
import enum
import time
from collections.abc import Mapping, Sequence

from confluent_kafka import KafkaError, TopicPartition
from confluent_kafka.admin import OffsetSpec
from kio.schema.errors import ErrorCode

from onceflow.client.admin import ClientError, NotFoundError
from onceflow.client.cluster import Partition, list_offsets
from onceflow.client.transactions import NO_OFFSET, describe_producers, error_name
from onceflow.console.backend import Backend
from onceflow.console.decode import PREVIEW_BYTES, Decoded, decode
from onceflow.protocol.apis import ApiKey
from onceflow.protocol.errors import ProtocolError
from onceflow.protocol.records import BatchHeader, end_txn_marker, iter_batches

# Bytes of log one page reads: bounds the broker's answer and our memory whatever the
# record sizes (a single larger batch still comes whole: KIP-74).
WINDOW_BYTES = 1024 * 1024
# Records one page shows; the next page starts after the last one shown.
RECORDS_PER_PAGE = 50
# How long reading a window's records may take before the page says what it has.
READ_TIMEOUT_S = 5.0
POLL_S = 0.1
# Fetch v4 has isolation levels and record format v2; v13 names topics by id.
FETCH_VERSIONS = (4, 12)
READ_UNCOMMITTED, READ_COMMITTED = 0, 1


class Status(str, enum.Enum):
    plain = "plain"            # not transactional
    committed = "committed"
    aborted = "aborted"
    open = "open"              # its transaction is still open: holds the LSO
    pending = "pending"        # above the LSO, decided after the window's end


@dataclasses.dataclass(frozen=True, slots=True)
class Batch:
    base_offset: int
    last_offset: int          # inclusive
    producer_id: int
    producer_epoch: int
    transactional: bool
    marker: bool | None       # control batch: True COMMIT, False ABORT; None: data
    records_count: int
    size_bytes: int
    max_timestamp_ms: int


@dataclasses.dataclass(frozen=True, slots=True)
class RecordRow:
    offset: int
    timestamp_ms: int
    key: Decoded
    value: Decoded
    headers: tuple[tuple[str, Decoded], ...]
    status: Status
    producer_id: int
    producer_epoch: int


@dataclasses.dataclass(frozen=True, slots=True)
class MarkerRow:
    offset: int
    commit: bool
    producer_id: int
    producer_epoch: int
    timestamp_ms: int


@dataclasses.dataclass
class RecordsPage:
    topic: str
    partition: int
    start: int
    isolation: str                       # "read_committed" | "read_uncommitted"
    log_start: int
    high_watermark: int
    last_stable: int
    rows: list[RecordRow | MarkerRow]
    next_offset: int | None              # where the next page starts; None: at the end
    hidden: dict[str, int]               # read_committed: rows not shown, by reason
    notes: list[str]


# ---------------------------------------------------------------- pure parts


def read_batches(records: bytes | None) -> list[Batch]:
    """The complete batches of a Fetch answer's records (a partial last one is dropped,
    as every consumer does)."""
    batches = []
    try:
        for header, raw in iter_batches(records or b""):
            batches.append(_batch(header, raw))
    except ProtocolError:  # the partial batch at the end of a size-capped answer
        pass
    return batches


def _batch(header: BatchHeader, raw: memoryview) -> Batch:
    marker = None
    if header.is_control:
        found = end_txn_marker(raw)
        marker = None if found is None else found.commit
    return Batch(header.base_offset, header.last_offset, header.producer_id,
                 header.producer_epoch, header.is_transactional,
                 marker if header.is_control else None, header.records_count,
                 header.size_bytes, header.max_timestamp)


def classify(batches: Sequence[Batch], aborted: Sequence[tuple[int, int]], last_stable: int,
             open_starts: Mapping[int, int]) -> dict[int, Status]:
    """Status per data batch (by base offset); see the module docstring.

    `aborted`: (producer id, first offset) as a read_committed Fetch returns them;
    `open_starts`: producer id -> first offset of its open transaction (DescribeProducers).
    """
    below = _below_stable(batches, aborted)
    statuses: dict[int, Status] = {}
    later_marker: dict[int, bool] = {}
    for batch in reversed(batches):
        if batch.marker is not None:
            later_marker[batch.producer_id] = batch.marker
            continue
        if not batch.transactional:
            statuses[batch.base_offset] = Status.plain
        elif batch.producer_id in later_marker:
            statuses[batch.base_offset] = (Status.committed if later_marker[batch.producer_id]
                                           else Status.aborted)
        elif batch.base_offset < last_stable:
            statuses[batch.base_offset] = below[batch.base_offset]
        elif open_starts.get(batch.producer_id, NO_OFFSET) not in (NO_OFFSET,) \
                and open_starts[batch.producer_id] <= batch.base_offset:
            statuses[batch.base_offset] = Status.open
        else:
            statuses[batch.base_offset] = Status.pending
    return statuses


def _below_stable(batches: Sequence[Batch], aborted: Sequence[tuple[int, int]]) -> dict[int, Status]:
    """A read_committed consumer's verdict per transactional batch (Kafka's rule)."""
    pending = sorted(aborted, key=lambda a: a[1])
    aborting: set[int] = set()
    verdicts = {}
    next_index = 0
    for batch in batches:
        while next_index < len(pending) and pending[next_index][1] <= batch.last_offset:
            aborting.add(pending[next_index][0])
            next_index += 1
        if batch.marker is False:
            aborting.discard(batch.producer_id)
        elif batch.marker is None and batch.transactional:
            verdicts[batch.base_offset] = (Status.aborted if batch.producer_id in aborting
                                           else Status.committed)
    return verdicts


def visible_to_read_committed(row: RecordRow | MarkerRow, last_stable: int) -> str | None:
    """None when a read_committed consumer receives the row, else why not."""
    if isinstance(row, MarkerRow):
        return "markers"
    if row.offset >= last_stable:
        return "at or above the last stable offset"
    if row.status is Status.aborted:
        return "aborted"
    return None


# ---------------------------------------------------------------- reading


@dataclasses.dataclass
class _Window:
    log_start: int
    high_watermark: int
    last_stable: int
    batches: list[Batch]
    aborted: list[tuple[int, int]]


def _fetch(backend: Backend, partition: Partition, offset: int, isolation: int) -> object:
    cluster = backend.cluster()
    topic, index = partition
    answer = cluster.call(cluster.leader(partition), ApiKey.FETCH, FETCH_VERSIONS,
                          replica_id=-1, max_wait=0, min_bytes=0, max_bytes=WINDOW_BYTES,
                          isolation_level=isolation, session_id=0, session_epoch=-1,
                          topics=[{"topic": topic, "partitions": [{
                              "partition": index, "current_leader_epoch": -1,
                              "fetch_offset": offset, "last_fetched_epoch": -1,
                              "log_start_offset": -1, "partition_max_bytes": WINDOW_BYTES}]}],
                          forgotten_topics_data=[], rack_id="")
    (found,) = [p for t in answer.responses for p in t.partitions]
    if found.error_code == ErrorCode.offset_out_of_range:
        start, end = _log_range(backend, partition)
        raise NotFoundError(f"offset {offset} is outside {topic}-{index}'s log, which holds "
                            f"offsets {start} to {end - 1}" if end > start else
                            f"offset {offset} is outside {topic}-{index}'s log, which is empty "
                            f"(its next offset is {end})")
    if found.error_code != ErrorCode.none:
        raise ClientError(f"reading {topic}-{index}: {error_name(found.error_code)}")
    return found


def read_window(backend: Backend, partition: Partition, offset: int) -> _Window:
    raw = _fetch(backend, partition, offset, READ_UNCOMMITTED)
    committed = _fetch(backend, partition, offset, READ_COMMITTED)
    aborted = [(a.producer_id, a.first_offset) for a in committed.aborted_transactions or ()]
    return _Window(raw.log_start_offset, raw.high_watermark, raw.last_stable_offset,
                   read_batches(raw.records), aborted)


def read_records(backend: Backend, partition: Partition, start: int, end: int,
                 limit: int, cap_bytes: int = PREVIEW_BYTES) -> dict[int, tuple]:
    """offset -> (timestamp ms, key, value, headers) for the records in [start, end),
    at most `limit`, read by a read_uncommitted consumer."""
    found: dict[int, tuple] = {}
    if start >= end:
        return found
    consumer = backend.reader("read_uncommitted", **{"fetch.wait.max.ms": 10,
                                                     "max.partition.fetch.bytes": WINDOW_BYTES})
    try:
        consumer.assign([TopicPartition(partition[0], partition[1], start)])
        deadline = time.monotonic() + READ_TIMEOUT_S
        while len(found) < limit and time.monotonic() < deadline:
            for message in consumer.consume(limit, POLL_S):
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        return found
                    raise ClientError(f"reading {partition[0]}-{partition[1]}: {error.str()}")
                if message.offset() >= end or len(found) >= limit:
                    return found
                found[message.offset()] = (
                    message.timestamp()[1], decode(message.key(), cap_bytes),
                    decode(message.value(), cap_bytes),
                    tuple((k, decode(v, cap_bytes)) for k, v in message.headers() or ()))
            if consumer.position([TopicPartition(*partition)])[0].offset >= end:
                return found  # the rest of the range was markers or nothing
    finally:
        consumer.close()
    return found


def _open_starts(backend: Backend, partition: Partition, notes: list[str]) -> dict[int, int]:
    try:
        states = describe_producers(backend.cluster(), [partition]).get(partition, [])
    except ClientError as exc:
        notes.append(f"open transactions unknown (DescribeProducers: {exc})")
        return {}
    return {s.producer_id: s.txn_start_offset for s in states if s.txn_start_offset != NO_OFFSET}


def records_page(backend: Backend, partition: Partition, start: int | None,
                 isolation: str) -> RecordsPage:
    """One page of the records browser from `start` (None: the last page)."""
    if start is None:
        start = last_page_start(backend, partition)
    window, notes = read_window(backend, partition, start), []
    statuses = classify(window.batches, window.aborted, window.last_stable,
                        _open_starts(backend, partition, notes))
    window_end = window.batches[-1].last_offset + 1 if window.batches else start
    contents = read_records(backend, partition, start, window_end, RECORDS_PER_PAGE)
    rows = _rows(window.batches, statuses, contents, start)
    next_offset = _next_offset(rows, window_end, window.high_watermark)
    hidden: dict[str, int] = {}
    if isolation == "read_committed":
        kept = []
        for row in rows:
            reason = visible_to_read_committed(row, window.last_stable)
            if reason is None:
                kept.append(row)
            else:
                hidden[reason] = hidden.get(reason, 0) + 1
        rows = kept
    return RecordsPage(partition[0], partition[1], start, isolation, window.log_start,
                       window.high_watermark, window.last_stable, rows, next_offset, hidden, notes)


def last_page_start(backend: Backend, partition: Partition) -> int:
    """Where the newest page starts: RECORDS_PER_PAGE offsets below the high watermark."""
    start, end = _log_range(backend, partition)
    return max(start, end - RECORDS_PER_PAGE)


def _log_range(backend: Backend, partition: Partition) -> tuple[int, int]:
    """(log start, high watermark) of the partition."""
    admin = backend.cluster().admin
    earliest = list_offsets(admin, [partition], OffsetSpec.earliest())
    latest = list_offsets(admin, [partition], OffsetSpec.latest())
    if partition not in earliest or partition not in latest:
        raise ClientError(f"cannot read the offsets of {partition[0]}-{partition[1]}")
    return earliest[partition], latest[partition]


def offset_for_time(backend: Backend, partition: Partition, timestamp_ms: int) -> int | None:
    """The first offset whose timestamp is at or after `timestamp_ms`; None: no such record."""
    found = list_offsets(backend.cluster().admin, [partition],
                         OffsetSpec.for_timestamp(timestamp_ms))
    if partition not in found:
        raise ClientError(f"cannot look up times in {partition[0]}-{partition[1]}")
    return None if found[partition] < 0 else found[partition]


def _rows(batches: Sequence[Batch], statuses: Mapping[int, Status],
          contents: Mapping[int, tuple], start: int) -> list[RecordRow | MarkerRow]:
    rows: list[RecordRow | MarkerRow] = []
    shown = 0
    for batch in batches:
        if shown >= RECORDS_PER_PAGE:
            break
        if batch.marker is not None:
            if batch.base_offset >= start:
                rows.append(MarkerRow(batch.base_offset, batch.marker, batch.producer_id,
                                      batch.producer_epoch, batch.max_timestamp_ms))
            continue
        for offset in range(max(batch.base_offset, start), batch.last_offset + 1):
            content = contents.get(offset)
            if content is None:
                continue  # compacted away, or past what the reader returned
            rows.append(RecordRow(offset, content[0], content[1], content[2], content[3],
                                  statuses[batch.base_offset], batch.producer_id,
                                  batch.producer_epoch))
            shown += 1
            if shown >= RECORDS_PER_PAGE:
                break
    return rows


def _next_offset(rows: Sequence[RecordRow | MarkerRow], window_end: int,
                 high_watermark: int) -> int | None:
    last = rows[-1].offset + 1 if rows else window_end
    return None if last >= high_watermark else last
