"""`__consumer_offsets` <-> record batches: what the coordinator appends and what it replays.

Theory of operation
-------------------
The coordinator speaks in `Append`s (records for one partition) and `LogEntry`s (records
and transaction markers read back, with their offsets). This module is the only place
that turns one into bytes and bytes back into the other:

* `append_batch`: one `Append` -> one uncompressed v2 batch. An append that carries a
  producer id (TxnOffsetCommit) becomes a *transactional* batch of that producer, so its
  COMMIT/ABORT marker later settles it, exactly as in Kafka.
* `batch_entries`: one stored batch -> its entries. A control batch becomes a `TxnMarker`;
  a data batch's records become `LogRecord`s that carry the batch's producer id only when
  the batch is transactional (that is what makes their offsets pending on replay).
* `read_entries`: a whole offset range of a partition log, read in bounded chunks.

Everything here is synchronous and does no fsync; `read_entries` may run on a worker
thread (PartitionLog.read takes the log's lock).
"""

from __future__ import annotations

from collections.abc import Iterator

from onceflow.groups import Append, LogEntry, LogRecord, TxnMarker
from onceflow.groups.records import NO_PRODUCER_ID
from onceflow.protocol.records import (
    BatchHeader,
    Compression,
    SimpleRecord,
    build_batch,
    decode_records,
    end_txn_marker,
    iter_batches,
)
from onceflow.storage.log import PartitionLog

# Bytes asked of the log per read while loading: bounds the memory held at once (a whole
# batch is always returned even if larger, KIP-74) and keeps each worker-thread hop short.
LOAD_READ_BYTES = 1024 * 1024


class OffsetsLogCorrupt(RuntimeError):
    """__consumer_offsets holds something the broker never writes (a bug or foreign data)."""


def append_batch(append: Append, timestamp_ms: int) -> bytes:
    """The batch that stores `append` (base offset 0: the log assigns the real one)."""
    records = [SimpleRecord(r.key, r.value) for r in append.records]
    transactional = append.producer_id != NO_PRODUCER_ID
    return build_batch(records, base_timestamp_ms=timestamp_ms,
                       producer_id=append.producer_id, producer_epoch=append.producer_epoch,
                       transactional=transactional)


def batch_entries(header: BatchHeader, batch: memoryview) -> list[LogEntry]:
    """The coordinator's view of one stored batch."""
    if header.compression != Compression.NONE:
        raise OffsetsLogCorrupt(f"compressed batch at offset {header.base_offset}")
    if header.is_control:
        marker = end_txn_marker(batch)
        if marker is None:  # another control type: nothing for the coordinator
            return []
        return [TxnMarker(header.base_offset, header.max_timestamp, header.producer_id,
                          marker.commit)]
    producer_id = header.producer_id if header.is_transactional else NO_PRODUCER_ID
    entries: list[LogEntry] = []
    for record in decode_records(batch):
        if record.key is None:
            raise OffsetsLogCorrupt(f"record without a key at offset {record.offset}")
        entries.append(LogRecord(record.offset, record.timestamp_ms, producer_id, record.key,
                                 record.value))
    return entries


def read_entries(log: PartitionLog, start_offset: int, end_offset: int) -> Iterator[LogEntry]:
    """Entries of the batches from the one holding `start_offset` up to `end_offset`
    (exclusive), in offset order."""
    offset = max(start_offset, log.log_start_offset)
    while offset < end_offset:
        chunk = log.read(offset, LOAD_READ_BYTES, end_offset)
        if not chunk:
            return
        for header, batch in iter_batches(chunk):
            yield from batch_entries(header, batch)
            offset = header.base_offset + header.last_offset_delta + 1
