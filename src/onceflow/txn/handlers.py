"""The decisions of the client APIs: pure functions of (current metadata, request).

Each `decide_*` function is Kafka's TransactionCoordinator handler logic with the I/O taken
out: it looks at the id's current metadata (None = unknown id) and whether a transition is
already in flight for it (`pending`, Kafka's pendingState), and returns either an ErrorCode
to answer at once (NONE included: "nothing to write") or a `Decision` - the kind of write and
the target metadata to write. The coordinator turns a Decision into an `Append` whose intent
is a `Transit`, and applies it by replay once durable.

The order of the checks is Kafka's, because a client that breaks several rules at once sees
the first one (e.g. AddPartitionsToTxn checks the producer id, then the epoch, then a
pending transition, then the state).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from onceflow.protocol.records import NO_PRODUCER_ID
from onceflow.txn import metadata as md
from onceflow.txn.api import TopicPartition
from onceflow.txn.metadata import TxnMetadata, is_epoch_exhausted
from onceflow.txn.records import STRING_BYTES_MAX
from onceflow.txn.state import PREPARE_STATES, TxnState

S = TxnState
E = ErrorCode


class Kind(enum.Enum):
    """What a written record is for (decides the response once it is durable)."""

    INIT = "init"  # InitProducerId: Empty (new id, epoch bump, or producer id rotation)
    FENCE = "fence"  # InitProducerId while Ongoing: PrepareAbort with epoch + 1
    KEEP = "keep"  # InitProducerId keepPreparedTxn while a 2PC txn is Ongoing: epoch + 1
    ADD = "add"  # AddPartitionsToTxn / AddOffsetsToTxn: Ongoing
    END = "end"  # EndTxn: PrepareCommit / PrepareAbort
    TIMEOUT = "timeout"  # the transaction timed out: PrepareAbort with epoch + 1
    COMPLETE = "complete"  # every marker is durable: CompleteCommit / CompleteAbort


@dataclass(frozen=True, slots=True)
class Decision:
    kind: Kind
    target: TxnMetadata


@dataclass(frozen=True, slots=True)
class Transit:
    """Append intent: `target` becomes the id's metadata once its record is durable.
    `shard_seq` names the loaded partition it was prepared on: a completion that arrives
    after the partition was unloaded (and maybe loaded again) stands aside."""

    kind: Kind
    target: TxnMetadata
    shard_seq: int


@dataclass(frozen=True, slots=True)
class Expire:
    """Append intent: tombstones of these expired ids."""

    transactional_ids: tuple[str, ...]
    shard_seq: int


# Kafka marks a two-phase-commit transaction (KIP-939) by this timeout: never timed out.
TWO_PHASE_COMMIT_TIMEOUT_MS = 2**31 - 1


def is_two_phase_commit(current: TxnMetadata) -> bool:
    return current.txn_timeout_ms == TWO_PHASE_COMMIT_TIMEOUT_MS


def valid_id(transactional_id: str | None) -> bool:
    """Kafka answers INVALID_REQUEST for a null or empty id; an id whose UTF-8 does not fit
    the key's int16 length could not be written either."""
    return bool(transactional_id) and len(transactional_id.encode()) <= STRING_BYTES_MAX


def valid_partitions(partitions: Collection[TopicPartition]) -> bool:
    return all(tp.topic and len(tp.topic.encode()) <= STRING_BYTES_MAX and tp.partition >= 0
               for tp in partitions)


# ---------------------------------------------------------------- InitProducerId


def _expected_is_valid(current: TxnMetadata, producer_id: int, producer_epoch: int) -> bool:
    """Kafka's isValidProducerId: the request's producer id is the current one, or the
    previous one with an exhausted epoch (a retry of the request that rotated it)."""
    return (producer_id == current.producer_id
            or (producer_id == current.previous_producer_id
                and is_epoch_exhausted(producer_epoch)))


def decide_init(transactional_id: str, current: TxnMetadata | None, pending: bool,
                txn_timeout_ms: int, expected: tuple[int, int] | None, now_ms: int,
                allocate_producer_id: Callable[[], int], *,
                keep_prepared_txn: bool = False) -> ErrorCode | Decision:
    """InitProducerId with a transactional id (timeout already validated). `expected` is the
    request's (producer id, epoch) when it carries one (KIP-360). `keep_prepared_txn`
    (KIP-939): an open transaction is kept - its epoch is bumped, which fences the instance
    that opened it, and the new instance may commit or abort it; its timeout becomes the
    request's (none with enable2Pc: KIP-939 allows keepPreparedTxn without enable2Pc, the
    transaction then stays subject to the timeout). With nothing open, keeping changes
    nothing."""
    if pending:
        return E.concurrent_transactions
    if current is None:
        # Kafka also gives a fresh id (epoch 0) when the request carries a producer id the
        # coordinator does not know (a producer recovering from UNKNOWN_PRODUCER_ID)
        return Decision(Kind.INIT, md.new_transactional_id(
            transactional_id, allocate_producer_id(), txn_timeout_ms, now_ms))
    if expected is not None and not _expected_is_valid(current, *expected):
        return E.producer_fenced
    if current.state in PREPARE_STATES:
        return E.concurrent_transactions  # the client retries once the markers are written
    if current.state is S.ONGOING and keep_prepared_txn:
        return Decision(Kind.KEEP, md.keep_epoch_bump(current, txn_timeout_ms, now_ms))
    if current.state is S.ONGOING:
        # abort the open transaction with a bumped epoch (never returned to anyone: the
        # client is told CONCURRENT_TRANSACTIONS and its retry bumps again)
        fenced = md.fence_epoch(current)
        return Decision(Kind.FENCE, md.prepare_end(fenced, commit=False, now_ms=now_ms))
    assert current.state in (S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT), current.state
    expected_epoch = None if expected is None else expected[1]
    if is_epoch_exhausted(current.producer_epoch) and expected_epoch in (
            None, current.producer_epoch):
        return Decision(Kind.INIT, md.rotate_producer_id(
            current, allocate_producer_id(), txn_timeout_ms, now_ms,
            record_last_epoch=expected is not None))
    target = md.increment_epoch(current, txn_timeout_ms, expected_epoch, now_ms)
    return target if isinstance(target, ErrorCode) else Decision(Kind.INIT, target)


# ---------------------------------------------------------------- the producer's own calls


def _check_producer(current: TxnMetadata | None, producer_id: int,
                    producer_epoch: int) -> ErrorCode | None:
    if current is None or current.producer_id != producer_id:
        return E.invalid_producer_id_mapping
    if current.producer_epoch != producer_epoch:
        return E.producer_fenced
    return None


def decide_add(current: TxnMetadata | None, pending: bool, producer_id: int,
               producer_epoch: int, partitions: frozenset[TopicPartition],
               now_ms: int, client_transaction_version: int | None = None
               ) -> ErrorCode | Decision:
    """AddPartitionsToTxn (and AddOffsetsToTxn, with the group's offsets partition); the
    broker's implicit add of transactions V2 passes client_transaction_version 2."""
    error = _check_producer(current, producer_id, producer_epoch)
    if error is not None:
        return error
    assert current is not None
    if pending or current.state in PREPARE_STATES:
        return E.concurrent_transactions
    if current.state is S.ONGOING and partitions <= current.partitions:
        return E.none  # already recorded: Kafka answers at once, writing nothing
    return Decision(Kind.ADD, md.add_partitions(current, partitions, now_ms,
                                                client_transaction_version))


# EndTxn in a state where it is not a transition: the answer for (state, commit?).
_END_TXN_ANSWERS: dict[tuple[TxnState, bool], ErrorCode] = {
    (S.COMPLETE_COMMIT, True): E.none,  # a retry of the commit that completed
    (S.COMPLETE_COMMIT, False): E.invalid_txn_state,
    (S.COMPLETE_ABORT, False): E.none,  # a retry of the abort that completed
    (S.COMPLETE_ABORT, True): E.invalid_txn_state,
    (S.PREPARE_COMMIT, True): E.concurrent_transactions,  # a retry, still completing
    (S.PREPARE_COMMIT, False): E.invalid_txn_state,
    (S.PREPARE_ABORT, False): E.concurrent_transactions,
    (S.PREPARE_ABORT, True): E.invalid_txn_state,
    (S.EMPTY, True): E.invalid_txn_state,  # nothing to end
    (S.EMPTY, False): E.invalid_txn_state,
}


def decide_end(current: TxnMetadata | None, pending: bool, producer_id: int,
               producer_epoch: int, commit: bool, now_ms: int) -> ErrorCode | Decision:
    """EndTxn from the client (transactions V1: the epoch must be exactly the current one)."""
    error = _check_producer(current, producer_id, producer_epoch)
    if error is not None:
        return error
    assert current is not None
    if pending:
        return E.concurrent_transactions
    if current.state is S.ONGOING:
        return Decision(Kind.END, md.prepare_end(current, commit, now_ms))
    return _END_TXN_ANSWERS[(current.state, commit)]


def decide_end_v2(current: TxnMetadata | None, pending: bool, producer_id: int,
                  producer_epoch: int, commit: bool, now_ms: int,
                  allocate_producer_id: Callable[[], int]) -> ErrorCode | Decision:
    """EndTxn v5 (transactions V2; Kafka 4.0's endTransaction for TV2). Every end bumps the
    epoch, so a request at the current epoch is the *next* end and one at epoch - 1 is a
    retry of the last: see the table in state.py (Complete*) for how each is answered."""
    if current is None:
        return E.invalid_producer_id_mapping
    retry_on_overflow = (current.previous_producer_id == producer_id
                         and producer_epoch == md.EPOCH_EXHAUSTED and current.producer_epoch == 0)
    retry_on_bump = current.producer_epoch == producer_epoch + 1
    state = current.state
    if state in (S.ONGOING, S.EMPTY):
        valid = producer_epoch == current.producer_epoch
    elif state in PREPARE_STATES:
        valid = retry_on_bump
    else:
        valid = retry_on_bump or retry_on_overflow or producer_epoch == current.producer_epoch
    if current.producer_id != producer_id and not retry_on_overflow:
        return E.invalid_producer_id_mapping
    if not valid:
        return E.producer_fenced
    if pending:
        return E.concurrent_transactions
    retry = retry_on_bump or retry_on_overflow
    if state is S.ONGOING:
        return _end_v2(current, commit, now_ms, allocate_producer_id, no_partition_added=False)
    if state in PREPARE_STATES:
        same = (state is S.PREPARE_COMMIT) == commit
        return E.concurrent_transactions if same else E.invalid_txn_state
    if state in (S.COMPLETE_COMMIT, S.COMPLETE_ABORT) and retry:
        return E.none if (state is S.COMPLETE_COMMIT) == commit else E.invalid_txn_state
    if commit:
        return E.invalid_txn_state  # Empty, or a new commit with nothing open
    return _end_v2(current, commit, now_ms, allocate_producer_id, no_partition_added=True)


def _end_v2(current: TxnMetadata, commit: bool, now_ms: int,
            allocate_producer_id: Callable[[], int], no_partition_added: bool) -> Decision:
    next_producer_id = allocate_producer_id() if is_epoch_exhausted(current.producer_epoch) \
        else NO_PRODUCER_ID
    return Decision(Kind.END, md.prepare_end_v2(current, commit, now_ms, next_producer_id,
                                                no_partition_added))


def decide_timeout(current: TxnMetadata, pending: bool, now_ms: int) -> Decision | None:
    """The periodic check (Kafka's timedOutTransactions + abortTimedOutTransactions): an
    Ongoing transaction older than its timeout is aborted with a bumped epoch, so its
    producer's next request is fenced."""
    if pending or current.state is not S.ONGOING or is_two_phase_commit(current):
        return None  # KIP-939: a two-phase-commit transaction waits for its coordinator
    if current.txn_start_timestamp_ms + current.txn_timeout_ms >= now_ms:
        return None
    fenced = md.fence_epoch(current)
    return Decision(Kind.TIMEOUT, md.prepare_end(fenced, commit=False, now_ms=now_ms))


def decide_verify(current: TxnMetadata | None, producer_id: int, producer_epoch: int,
                  partitions: frozenset[TopicPartition]) -> dict[TopicPartition, ErrorCode]:
    """AddPartitionsToTxn v4+ with verify_only (KIP-890 part 1, Kafka's
    handleVerifyPartitionsInTransaction): is each partition in the open transaction?
    Pending transitions are not checked (partitions are recorded only once durable)."""
    error = _check_producer(current, producer_id, producer_epoch)
    if error is None and current is not None and current.state in PREPARE_STATES:
        error = E.concurrent_transactions
    if error is not None:
        return {tp: error for tp in partitions}
    assert current is not None
    return {tp: E.none if tp in current.partitions else E.transaction_abortable
            for tp in partitions}
