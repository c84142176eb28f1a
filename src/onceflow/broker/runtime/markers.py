"""Writing a decided transaction's COMMIT/ABORT markers into its partitions.

Theory of operation
-------------------
Once PrepareCommit/PrepareAbort is durable the coordinator hands the broker a `MarkerWrite`:
the partitions of the transaction, the producer's id and epoch, and the coordinator epoch.
Into each partition goes one control batch (`build_control_batch`), appended through the
partition's producer state with origin COORDINATOR and the decoded marker. So the partition
checks it (a marker of an older producer epoch, or of an older coordinator epoch, is
refused) and closes the producer's open transaction there: the last stable offset moves
past it and, for an ABORT, the aborted-transaction index gets its entry
(`PartitionState.append`). A partition without an open transaction of that producer just
gains a marker that changes nothing, which is why writing markers again after a restart is
harmless.

The appends happen synchronously, in partition order; then `settle` waits until each is
durable, tells the group coordinator about markers written into `__consumer_offsets`
(pending transactional offsets become visible on COMMIT, are dropped on ABORT - only once
the marker is durable, so a crash never shows offsets that replay would hide), and returns
one error per partition for `TransactionCoordinator.markers_written`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING

from kio.schema.errors import ErrorCode

from onceflow.broker.runtime.groups import OFFSETS_TOPIC
from onceflow.protocol.records import EndTxnMarker, build_control_batch, iter_batches
from onceflow.storage.layout import StorageError
from onceflow.storage.producer_state import AppendOrigin, Rejected
from onceflow.txn import MarkerWrite, TopicPartition

if TYPE_CHECKING:
    from onceflow.broker.state import BrokerState
    from onceflow.groups import GroupCoordinator

log = logging.getLogger("onceflow.txns")


def append_marker(state: BrokerState, write: MarkerWrite, tp: TopicPartition,
                  now_ms: int) -> tuple[ErrorCode, Future | None]:
    """Append `write`'s marker to `tp` (no fsync): its error and the flush to wait for."""
    partition = state.partition(tp.topic, tp.partition)
    if partition is None:  # deleted since it joined the transaction: nothing to settle
        return ErrorCode.unknown_topic_or_partition, None
    batch = build_control_batch(producer_id=write.producer_id,
                                producer_epoch=write.producer_epoch, commit=write.commit,
                                coordinator_epoch=write.coordinator_epoch, timestamp_ms=now_ms)
    header, _ = next(iter_batches(batch))
    marker = EndTxnMarker(write.commit, write.coordinator_epoch)
    try:
        appended = partition.append([header], [batch], now_ms, origin=AppendOrigin.COORDINATOR,
                                    marker=marker, transaction_version=write.transaction_version)
        if isinstance(appended, Rejected):
            log.warning("marker for %s refused by %s-%d: %s", write.transactional_id, tp.topic,
                        tp.partition, appended.message)
            return appended.error_code, None
        return ErrorCode.none, state.committer.request_flush(partition.log)
    except (StorageError, RuntimeError) as exc:  # failed or closed log, closed committer
        log.error("marker for %s into %s-%d failed: %s", write.transactional_id, tp.topic,
                  tp.partition, exc)
        return ErrorCode.kafka_storage_error, None


def append_markers(state: BrokerState, write: MarkerWrite, now_ms: int,
                   ) -> tuple[dict[TopicPartition, ErrorCode], dict[TopicPartition, Future]]:
    """Append every marker of `write` now: the errors so far and the flushes to wait for."""
    errors: dict[TopicPartition, ErrorCode] = {}
    flushes: dict[TopicPartition, Future] = {}
    for tp in write.partitions:
        errors[tp], flush = append_marker(state, write, tp, now_ms)
        if flush is not None:
            flushes[tp] = flush
    return errors, flushes


async def settle(state: BrokerState, groups: GroupCoordinator, write: MarkerWrite,
                 errors: dict[TopicPartition, ErrorCode], flushes: dict[TopicPartition, Future],
                 flushed: Callable[[Future], Awaitable[bool]],
                 now_ms: Callable[[], int]) -> dict[TopicPartition, ErrorCode]:
    """Wait until the appended markers are durable; settle pending offsets of the groups in
    `__consumer_offsets` partitions. Returns the final error of every partition."""
    for tp, flush in flushes.items():
        if not await flushed(flush):
            errors[tp] = ErrorCode.kafka_storage_error
    offsets_partitions = [tp.partition for tp in flushes
                          if tp.topic == OFFSETS_TOPIC and errors[tp] is ErrorCode.none]
    if offsets_partitions:
        groups.complete_txn(write.producer_id, write.commit, offsets_partitions, now_ms())
    return errors
