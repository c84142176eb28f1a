"""Values exchanged between the transaction coordinator and the broker.

Inputs are plain Python values (ids, producer id/epoch, `TopicPartition`s); outputs are the
frozen dataclasses below, independent of the API version: the broker builds the kio
response of the version it answers (and maps PRODUCER_FENCED to INVALID_PRODUCER_EPOCH for
old versions, as KafkaApis does: InitProducerId < v4, AddPartitionsToTxn, AddOffsetsToTxn
and EndTxn < v2).

Every call that may change state returns a `Result`: the response to send once its effects
are done, the `Append`s to write to `__transaction_state` (the group coordinator's `Append`,
so the broker drives both coordinators with the same code), and the `MarkerWrite`s - the
COMMIT/ABORT control batches to write into data partitions. The broker:

1. appends each `Append` as one batch to its `__transaction_state` partition, waits until
   it is durable, and hands the outcomes (`Appended` / `AppendFailed`, same order) to
   `TransactionCoordinator.complete`, which replays the records and returns the response
   to send, plus follow-up appends and markers (handled the same way);
2. writes every marker of each `MarkerWrite` (a control batch per partition, appended with
   origin COORDINATOR so the partition's producer state checks it), waits until durable,
   and reports the per-partition errors to `TransactionCoordinator.markers_written`, whose
   `Result` carries the next step (the Complete* record once every partition has its
   marker; markers to retry come back from a later `tick`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, NamedTuple, TypeVar

from kio.schema.errors import ErrorCode

from onceflow.groups.api import Append, Appended, AppendFailed, AppendOutcome

__all__ = [
    "Append", "AppendFailed", "AppendOutcome", "Appended", "DescribedTransaction",
    "InitProducerIdResult", "ListTransactionsResult", "ListedTransaction", "MarkerWrite",
    "Result", "TopicPartition", "TxnMarker", "TxnResult", "append_error",
]

R = TypeVar("R")

CONSUMER_OFFSETS_TOPIC = "__consumer_offsets"  # AddOffsetsToTxn adds a partition of it


class TopicPartition(NamedTuple):
    topic: str
    partition: int


# ---------------------------------------------------------------- responses


@dataclass(frozen=True, slots=True)
class InitProducerIdResult:
    """InitProducerId's answer; v6 (KIP-939) with keepPreparedTxn also answers the producer
    id and epoch of the transaction kept open (-1/-1 when there is none)."""

    error: ErrorCode
    producer_id: int = -1
    producer_epoch: int = -1
    ongoing_txn_producer_id: int = -1
    ongoing_txn_producer_epoch: int = -1


@dataclass(frozen=True, slots=True)
class TxnResult:
    """AddPartitionsToTxn (one error for every partition of the transaction, as Kafka's
    coordinator answers), AddOffsetsToTxn, EndTxn. EndTxn v5 (transactions V2) also
    answers the producer id and epoch the client goes on with."""

    error: ErrorCode
    producer_id: int = -1
    producer_epoch: int = -1


@dataclass(frozen=True, slots=True)
class DescribedTransaction:
    """One entry of DescribeTransactions. In Prepare*, `topics` holds only the partitions
    whose marker is not written yet (Kafka's documented behaviour)."""

    transactional_id: str
    error: ErrorCode
    transaction_state: str = ""
    transaction_timeout_ms: int = 0
    transaction_start_time_ms: int = -1
    producer_id: int = -1
    producer_epoch: int = -1
    topics: tuple[tuple[str, tuple[int, ...]], ...] = ()


@dataclass(frozen=True, slots=True)
class ListedTransaction:
    transactional_id: str
    producer_id: int
    transaction_state: str


@dataclass(frozen=True, slots=True)
class ListTransactionsResult:
    error: ErrorCode
    transactions: tuple[ListedTransaction, ...] = ()
    unknown_state_filters: tuple[str, ...] = ()


# ---------------------------------------------------------------- effects


@dataclass(frozen=True, slots=True)
class TxnMarker:
    """One control batch to write: `build_control_batch(producer_id=..., producer_epoch=...,
    commit=..., coordinator_epoch=..., timestamp_ms=now)` appended to (topic, partition)."""

    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    commit: bool
    coordinator_epoch: int


@dataclass(frozen=True, slots=True)
class MarkerWrite:
    """Write the transaction's COMMIT (or ABORT) marker into each of `partitions`, then report
    the per-partition errors to `TransactionCoordinator.markers_written(this, errors, now)`."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: bool
    coordinator_epoch: int
    partitions: tuple[TopicPartition, ...]
    transaction_version: int = 0  # 2: the marker's epoch was bumped (transactions V2)

    def markers(self) -> tuple[TxnMarker, ...]:
        return tuple(TxnMarker(tp.topic, tp.partition, self.producer_id, self.producer_epoch,
                               self.commit, self.coordinator_epoch) for tp in self.partitions)


@dataclass(frozen=True, slots=True)
class Result(Generic[R]):
    """The response (sent once every append is durable; failures replace it), the records to
    append to __transaction_state, and the markers to write into data partitions."""

    response: R
    appends: tuple[Append, ...] = field(default=())
    markers: tuple[MarkerWrite, ...] = field(default=())


# Kafka's mapping of a failed __transaction_state append to the error a client understands
# (TransactionStateManager.appendTransactionToLog).
_APPEND_ERROR_FOR_CLIENT: dict[ErrorCode, ErrorCode] = {
    ErrorCode.unknown_topic_or_partition: ErrorCode.coordinator_not_available,
    ErrorCode.not_enough_replicas: ErrorCode.coordinator_not_available,
    ErrorCode.not_enough_replicas_after_append: ErrorCode.coordinator_not_available,
    ErrorCode.request_timed_out: ErrorCode.coordinator_not_available,
    ErrorCode.not_leader_or_follower: ErrorCode.not_coordinator,
    ErrorCode.kafka_storage_error: ErrorCode.not_coordinator,
    ErrorCode.message_too_large: ErrorCode.unknown_server_error,
    ErrorCode.record_list_too_large: ErrorCode.unknown_server_error,
}


def append_error(error: ErrorCode) -> ErrorCode:
    return _APPEND_ERROR_FOR_CLIENT.get(error, error)
