"""Transaction metadata of one transactional id, and its transitions as pure functions.

Theory of operation
-------------------
`TxnMetadata` is an immutable value: Kafka's TransactionMetadata fields, nothing else. The
functions below are Kafka's `prepare*` methods (TransactionMetadata.scala): each takes the
current metadata and returns the *target* metadata - the value to write - after checking the
edge against the state table. They never mutate anything; the coordinator writes the target's
record, and once it is durable, replaying the record (the code that also loads the log)
makes it the current metadata. A failed write therefore leaves nothing behind to undo (which
is why Kafka's `hasFailedEpochFence` flag has no counterpart here: the bumped epoch of a
failed fence was never applied, so the next fence bumps from the same epoch).

What is durable: everything in TransactionLogValue - producer id, previous producer id
(the id before the last transition: after a rotation, the exhausted one), next producer id
(transactions V2: the id that takes over at epoch exhaustion, until then -1), epoch, timeout, state, partitions, start and
last-update timestamps. What is not: `last_producer_epoch`, the epoch before a KIP-360
bump, which Kafka keeps only in memory and loads as -1. It exists so that a *retry* of a
successful InitProducerId(pid, epoch) is answered with the same epoch instead of bumping
again; after a restart such a retry is fenced, exactly as in Kafka. `durable()` drops it:
the live state, `durable()`-ed, always equals a replay of the log.

Epochs are int16. An epoch >= 32766 (Short.MAX_VALUE - 1) is exhausted: InitProducerId then
issues a new producer id with epoch 0, and 32767 stays free so a fence can always bump once
more (Kafka's isEpochExhausted).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from itertools import groupby

from kio.schema.errors import ErrorCode

from onceflow.protocol.records import NO_PRODUCER_EPOCH, NO_PRODUCER_ID
from onceflow.txn.api import TopicPartition
from onceflow.txn.records import RecordFormatError, TxnLogValue
from onceflow.txn.state import TxnState, check_transition

S = TxnState

EPOCH_MAX = 0x7FFF  # producer epochs are int16
TRANSACTION_VERSION_2 = 2  # ClientTransactionVersion of transactions V2 (KIP-890 part 2)
EPOCH_EXHAUSTED = EPOCH_MAX - 1  # see the module docstring
NO_TIMESTAMP = -1  # txn_start_timestamp_ms when no transaction started since InitProducerId


def is_epoch_exhausted(epoch: int) -> bool:
    return epoch >= EPOCH_EXHAUSTED


@dataclass(frozen=True, slots=True)
class TxnMetadata:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    txn_timeout_ms: int
    state: TxnState
    partitions: frozenset[TopicPartition]
    txn_start_timestamp_ms: int
    txn_last_update_timestamp_ms: int
    previous_producer_id: int = NO_PRODUCER_ID
    next_producer_id: int = NO_PRODUCER_ID
    last_producer_epoch: int = NO_PRODUCER_EPOCH  # soft: not in the log
    client_transaction_version: int = 0

    def durable(self) -> TxnMetadata:
        """What a replay of this metadata's record rebuilds (soft fields at their defaults)."""
        return replace(self, last_producer_epoch=NO_PRODUCER_EPOCH)

    def to_value(self) -> TxnLogValue:
        topics = None
        if self.state is not S.EMPTY:  # Kafka writes null partitions in Empty
            ordered = sorted(self.partitions)
            topics = tuple((topic, tuple(tp.partition for tp in group))
                           for topic, group in groupby(ordered, key=lambda tp: tp.topic))
        return TxnLogValue(
            self.producer_id, self.producer_epoch, self.txn_timeout_ms, self.state.id, topics,
            self.txn_last_update_timestamp_ms, self.txn_start_timestamp_ms,
            previous_producer_id=self.previous_producer_id,
            next_producer_id=self.next_producer_id,
            client_transaction_version=self.client_transaction_version,
        )

    @classmethod
    def from_value(cls, transactional_id: str, value: TxnLogValue,
                   last_producer_epoch: int = NO_PRODUCER_EPOCH) -> TxnMetadata:
        try:
            state = TxnState.from_id(value.transaction_status)
        except ValueError as exc:
            raise RecordFormatError(str(exc)) from None
        partitions: frozenset[TopicPartition] = frozenset()
        if state is not S.EMPTY and value.transaction_partitions:  # Kafka ignores them in Empty
            partitions = frozenset(TopicPartition(topic, p)
                                   for topic, ids in value.transaction_partitions for p in ids)
        return cls(
            transactional_id, value.producer_id, value.producer_epoch,
            value.transaction_timeout_ms, state, partitions,
            value.transaction_start_timestamp_ms, value.transaction_last_update_timestamp_ms,
            previous_producer_id=value.previous_producer_id,
            next_producer_id=value.next_producer_id,
            last_producer_epoch=last_producer_epoch,
            client_transaction_version=value.client_transaction_version,
        )


# ---------------------------------------------------------------- transitions


def _transit(current: TxnMetadata, target: TxnMetadata) -> TxnMetadata:
    """Kafka's prepareTransitionTo: check the edge and the values; the previous producer id
    of the target is the current producer id."""
    check_transition(current.transactional_id, current.state, target.state)
    assert target.producer_id >= 0, f"illegal producer id {target.producer_id}"
    assert target.producer_epoch >= 0, f"illegal producer epoch {target.producer_epoch}"
    return replace(target, previous_producer_id=current.producer_id)


def new_transactional_id(transactional_id: str, producer_id: int, txn_timeout_ms: int,
                         now_ms: int) -> TxnMetadata:
    """The first metadata of an id: Empty, a fresh producer id, epoch 0."""
    assert producer_id >= 0
    return TxnMetadata(transactional_id, producer_id, 0, txn_timeout_ms, S.EMPTY,
                       frozenset(), NO_TIMESTAMP, now_ms, previous_producer_id=producer_id)


def increment_epoch(current: TxnMetadata, txn_timeout_ms: int, expected_epoch: int | None,
                    now_ms: int) -> TxnMetadata | ErrorCode:
    """InitProducerId on a known id in Empty/Complete* (Kafka's prepareIncrementProducerEpoch).

    No expected epoch: a new instance -> epoch + 1, last epoch forgotten (fences the rest).
    Expected == current: KIP-360 bump by the current instance -> epoch + 1, last = current.
    Expected == last: a retry of a bump that succeeded -> same epoch again.
    Otherwise PRODUCER_FENCED. The caller rotates the producer id instead when the epoch is
    exhausted and a bump is asked for. (Kafka throws IllegalStateException for *any* call
    with an exhausted epoch, so its retry-of-a-bump and stale-producer answers become
    UNKNOWN_SERVER_ERROR there; here they get the same epoch again and PRODUCER_FENCED.)
    """
    epoch, last = current.producer_epoch, NO_PRODUCER_EPOCH
    if expected_epoch is None or expected_epoch == current.producer_epoch:
        assert not is_epoch_exhausted(current.producer_epoch), "rotate the producer id instead"
        epoch = current.producer_epoch + 1
        last = NO_PRODUCER_EPOCH if expected_epoch is None else current.producer_epoch
    elif expected_epoch == current.last_producer_epoch:
        last = current.last_producer_epoch
    else:
        return ErrorCode.producer_fenced
    return _transit(current, replace(
        current, producer_epoch=epoch, last_producer_epoch=last, txn_timeout_ms=txn_timeout_ms,
        state=S.EMPTY, partitions=frozenset(), txn_start_timestamp_ms=NO_TIMESTAMP,
        txn_last_update_timestamp_ms=now_ms))


def rotate_producer_id(current: TxnMetadata, new_producer_id: int, txn_timeout_ms: int,
                       now_ms: int, record_last_epoch: bool) -> TxnMetadata:
    """The epoch is exhausted: a new producer id with epoch 0 (prepareProducerIdRotation).
    When the request carried the exhausted epoch, it is remembered as the last epoch so a
    retry of this request is recognised."""
    assert current.state not in (S.ONGOING, S.PREPARE_COMMIT, S.PREPARE_ABORT)
    return _transit(current, replace(
        current, producer_id=new_producer_id, producer_epoch=0,
        last_producer_epoch=current.producer_epoch if record_last_epoch else NO_PRODUCER_EPOCH,
        txn_timeout_ms=txn_timeout_ms, state=S.EMPTY, partitions=frozenset(),
        txn_start_timestamp_ms=NO_TIMESTAMP, txn_last_update_timestamp_ms=now_ms))


def add_partitions(current: TxnMetadata, partitions: Iterable[TopicPartition],
                   now_ms: int, client_transaction_version: int | None = None) -> TxnMetadata:
    """AddPartitionsToTxn / AddOffsetsToTxn -> Ongoing; the first one starts the transaction.
    A partition added by the broker for a V2 client (Produce v12, TxnOffsetCommit v5)
    records the client's transaction version, as Kafka does."""
    starting = current.state in (S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT)
    version = (current.client_transaction_version if client_transaction_version is None
               else client_transaction_version)
    return _transit(current, replace(
        current, state=S.ONGOING, partitions=current.partitions | frozenset(partitions),
        client_transaction_version=version,
        txn_start_timestamp_ms=now_ms if starting else current.txn_start_timestamp_ms,
        txn_last_update_timestamp_ms=now_ms))


def fence_epoch(current: TxnMetadata) -> TxnMetadata:
    """Ongoing -> PrepareEpochFence with epoch + 1 (never written; see state.py). The epoch
    stays at EPOCH_MAX if already there (cannot happen: Ongoing epochs are never above
    EPOCH_EXHAUSTED, since InitProducerId rotates the producer id first)."""
    epoch = min(current.producer_epoch + 1, EPOCH_MAX)
    return _transit(current, replace(current, state=S.PREPARE_EPOCH_FENCE, producer_epoch=epoch,
                                     last_producer_epoch=NO_PRODUCER_EPOCH))


def keep_epoch_bump(current: TxnMetadata, txn_timeout_ms: int, now_ms: int) -> TxnMetadata:
    """InitProducerId with keepPreparedTxn (KIP-939) on an Ongoing transaction: it stays
    Ongoing with its partitions and start time, under epoch + 1 and the request's timeout,
    so the instance that opened it is fenced and the new one ends it (its markers carry the
    new epoch, which the partitions accept: a marker's epoch may be newer than the data's)."""
    assert current.state is S.ONGOING
    assert current.producer_epoch < EPOCH_MAX, "Ongoing epochs stay below EPOCH_MAX"
    return _transit(current, replace(
        current, producer_epoch=current.producer_epoch + 1, txn_timeout_ms=txn_timeout_ms,
        last_producer_epoch=current.producer_epoch, txn_last_update_timestamp_ms=now_ms))


def prepare_end(current: TxnMetadata, commit: bool, now_ms: int) -> TxnMetadata:
    """EndTxn (or a fence) -> PrepareCommit / PrepareAbort (prepareAbortOrCommit, V1: the
    epoch does not change here)."""
    target = S.PREPARE_COMMIT if commit else S.PREPARE_ABORT
    return _transit(current, replace(current, state=target, txn_last_update_timestamp_ms=now_ms))


def prepare_end_v2(current: TxnMetadata, commit: bool, now_ms: int, next_producer_id: int,
                   no_partition_added: bool) -> TxnMetadata:
    """EndTxn v5 (transactions V2, Kafka's prepareAbortOrCommit with TV2): the epoch is
    bumped now, so every marker carries the new epoch and fences the old one; when the old
    epoch was exhausted the next producer id is taken at completion. An abort with no
    partition added starts (and ends) its transaction now."""
    target = S.PREPARE_COMMIT if commit else S.PREPARE_ABORT
    assert current.producer_epoch < EPOCH_MAX, "an exhausted epoch rotates the producer id"
    return _transit(current, replace(
        current, state=target, producer_epoch=current.producer_epoch + 1,
        last_producer_epoch=current.producer_epoch, next_producer_id=next_producer_id,
        client_transaction_version=TRANSACTION_VERSION_2,
        txn_start_timestamp_ms=now_ms if no_partition_added else current.txn_start_timestamp_ms,
        txn_last_update_timestamp_ms=now_ms))


def client_identity(target: TxnMetadata) -> tuple[int, int]:
    """The producer id and epoch a V2 client uses after `target` (EndTxn v5's answer):
    the next producer id with epoch 0 when the epoch was exhausted."""
    if target.next_producer_id != NO_PRODUCER_ID:
        return target.next_producer_id, 0
    return target.producer_id, target.producer_epoch


def complete(current: TxnMetadata, now_ms: int) -> TxnMetadata:
    """Every marker is written: Prepare* -> Complete*, partitions cleared, start timestamp
    kept (prepareComplete; Kafka also sets the last epoch to the current one). Transactions
    V2 with an exhausted epoch: the next producer id takes over with epoch 0."""
    target = S.COMPLETE_COMMIT if current.state is S.PREPARE_COMMIT else S.COMPLETE_ABORT
    producer_id, epoch = current.producer_id, current.producer_epoch
    last = current.producer_epoch
    if current.next_producer_id != NO_PRODUCER_ID:
        producer_id, epoch = current.next_producer_id, 0
        last = current.last_producer_epoch  # the last epoch the client saw of the old id
    return _transit(current, replace(
        current, state=target, partitions=frozenset(), next_producer_id=NO_PRODUCER_ID,
        producer_id=producer_id, producer_epoch=epoch,
        last_producer_epoch=last, txn_last_update_timestamp_ms=now_ms))


def check_replay(current: TxnMetadata | None, new: TxnMetadata) -> None:
    """Invariants of applying `new` (a record) over `current`: a legal edge, and the epoch
    of a producer id never goes back. Raises IllegalTransition / AssertionError."""
    if current is None:
        return  # the first record of an id, or the newest one left by compaction
    check_transition(new.transactional_id, current.state, new.state)
    if new.producer_id == current.producer_id:
        assert new.producer_epoch >= current.producer_epoch, (
            f"{new.transactional_id!r}: epoch went back "
            f"{current.producer_epoch} -> {new.producer_epoch}")
