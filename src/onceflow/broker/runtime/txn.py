"""`TxnRuntime`: drives the sans-IO `TransactionCoordinator` on the broker's event loop.

Theory of operation
-------------------
The coordinator (onceflow.txn) decides; this class performs its effects, exactly as
tests/txn/harness.py plays the contract:

1. A handler calls the coordinator and gets a `Result`: the response, `Append`s for
   `__transaction_state`, and maybe `MarkerWrite`s.
2. Appends are written, made durable and completed by the machinery shared with the group
   runtime (`CoordinatorRuntime`: write in order now, wait for the fsync in a
   runtime-owned task, `complete`, perform the follow-ups). The EndTxn that decided a
   commit is answered once PrepareCommit is durable: the outcome is settled then.
3. Each `MarkerWrite` - from a completed Prepare*, a load, or a tick retrying a marker - is
   written by markers.py (one control batch per partition, through producer state), and
   once durable its per-partition errors go to `markers_written`, whose follow-up (the
   Complete* record) is performed the same way.
4. Timers: the coordinator's deadlines (timed-out transactions aborted with an epoch bump,
   expired ids, marker retries) re-arm the shared loop timer.
5. Compaction: the shared compactor keeps the newest record per transactional id, so the
   topic (and the load at startup) stays bounded by the number of ids.

Startup: an existing `__transaction_state` is loaded in the background; loading returns
the markers of every transaction left in PrepareCommit/PrepareAbort by a crash, which are
written again (idempotently) and complete those transactions. The coordinator epoch
written into markers is a constant: one broker process loads each partition once, so it
never decreases (with real replication it would be the partition's leader epoch).

Crash point (tests): `crash_points.reached("prepare_commit")` is called right after a
PrepareCommit is durable and before its markers are written; a `crash_after` fault rule
makes the broker process exit there (broker/faults.py).

Verification (KIP-890 part 1): `verify` tells the produce and TxnOffsetCommit paths whether
a partition was added to the producer's open transaction; the coordinator is in this
process, so what Kafka does with an inter-broker AddPartitionsToTxn(verify_only) is a call.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Protocol

from kio.schema.errors import ErrorCode

from onceflow.broker.runtime import markers
from onceflow.broker.runtime.common import CoordinatorRuntime, internal_topic_configs
from onceflow.broker.state import now_ms
from onceflow.groups import Appended, AppendOutcome, LogEntry, LogRecord
from onceflow.txn import (
    TRANSACTION_STATE_TOPIC,
    MarkerWrite,
    Result,
    TopicPartition,
    TransactionCoordinator,
    TxnConfig,
    TxnState,
)
from onceflow.txn.metadata import TRANSACTION_VERSION_2

if TYPE_CHECKING:
    from onceflow.broker.config import BrokerConfig
    from onceflow.broker.runtime.groups import GroupRuntime
    from onceflow.broker.state import BrokerState

log = logging.getLogger("onceflow.txns")

# See the module docstring: each partition is loaded once per process.
COORDINATOR_EPOCH = 0
# Kafka's delete.retention.ms default: compaction keeps a tombstone of an expired id this
# long, so a reader replaying slowly still sees the id go.
TOMBSTONE_RETENTION_MS = 24 * 3_600_000
CRASH_POINT_PREPARE_COMMIT = "prepare_commit"
# Kafka's add.partitions.to.txn.retry.backoff.ms / .backoff.max.ms: how a broker retries
# an implicit add (transactions V2) that met CONCURRENT_TRANSACTIONS before answering.
ADD_PARTITIONS_RETRY_BACKOFF_MS = 20
ADD_PARTITIONS_RETRY_BACKOFF_MAX_MS = 100


class CrashPoints(Protocol):
    def reached(self, point: str) -> None: ...


def txn_config(config: BrokerConfig, num_partitions: int) -> TxnConfig:
    return TxnConfig(
        transaction_state_num_partitions=num_partitions,
        transaction_max_timeout_ms=config.transaction_max_timeout_ms,
        transaction_two_phase_commit_enable=config.transaction_two_phase_commit_enable,
        transactional_id_expiration_ms=config.transactional_id_expiration_ms,
        abort_timed_out_cleanup_interval_ms=config.transaction_abort_timed_out_cleanup_interval_ms,
        remove_expired_cleanup_interval_ms=config.transaction_remove_expired_cleanup_interval_ms,
    )


class TxnRuntime(CoordinatorRuntime):
    topic_name = TRANSACTION_STATE_TOPIC
    log = log

    def __init__(self, state: BrokerState, groups: GroupRuntime) -> None:
        super().__init__(state, state.config.transaction_state_num_partitions)
        # Markers written into __consumer_offsets settle the groups' pending offsets, and
        # AddOffsetsToTxn needs the groups' partitioning.
        self._groups = groups.coordinator
        self.coordinator = TransactionCoordinator(
            txn_config(state.config, self.num_partitions),
            allocate_producer_id=state.producer_ids.next_id,  # the broker's one allocator
            group_partition_for=self._groups.partition_for)
        self.crash_points: CrashPoints | None = None  # set by the server (fault injection)
        self._gates: dict[str, asyncio.Future] = {}  # see gate()

    def topic_configs(self) -> dict[str, str]:
        return internal_topic_configs(self.broker_config.transaction_state_segment_bytes)

    @property
    def tombstone_retention_ms(self) -> int:
        return TOMBSTONE_RETENTION_MS

    # ------------------------------------------------------------ the coordinator's effects

    def load_partition(self, partition: int, entries: list[LogEntry], now: int) -> None:
        records = [entry for entry in entries if isinstance(entry, LogRecord)]
        self.follow(self.coordinator.load_partition(partition, records, now, COORDINATOR_EPOCH))

    def follow(self, result: Any) -> None:
        """Appends (response ignored) and markers of a result whose response is settled."""
        if self._closed:
            return
        if result.appends:
            self.submit(Result(None, result.appends))
        for write in result.markers:
            self.write_markers(write)

    def before_complete(self, result: Any, outcomes: list[AppendOutcome]) -> None:
        if self.crash_points is None:
            return
        for append, outcome in zip(result.appends, outcomes, strict=True):
            target = getattr(append.intent, "target", None)
            if (isinstance(outcome, Appended) and target is not None
                    and target.state is TxnState.PREPARE_COMMIT):
                self.crash_points.reached(CRASH_POINT_PREPARE_COMMIT)

    def write_markers(self, write: MarkerWrite) -> None:
        """Append `write`'s markers now; a task reports them once durable."""
        errors, flushes = markers.append_markers(self._state, write, now_ms())
        self.spawn(self._markers_durable(write, errors, flushes))

    async def write_markers_and_wait(self, write: MarkerWrite) -> dict[TopicPartition, ErrorCode]:
        """WriteTxnMarkers from a client (the admin's abortTransaction for a hanging
        transaction): the same appends, answered once durable; no coordinator is told."""
        errors, flushes = markers.append_markers(self._state, write, now_ms())
        return await markers.settle(self._state, self._groups, write, errors, flushes,
                                    self.flushed, now_ms)

    async def _markers_durable(self, write: MarkerWrite, errors, flushes) -> None:
        errors = await markers.settle(self._state, self._groups, write, errors, flushes,
                                      self.flushed, now_ms)
        if self._closed:
            return
        self.follow(self.coordinator.markers_written(write, errors, now_ms()))
        self.arm()

    # ------------------------------------------------------------ KIP-890 part 1

    # ------------------------------------------------------------ KIP-890 part 2

    def gate(self, transactional_id: str) -> asyncio.Future | None:
        """An implicit add of this producer still appending: later requests of the same
        transactional id wait for it, so appends keep the order the requests came in."""
        return self._gates.get(transactional_id)

    def open_gate(self, transactional_id: str) -> asyncio.Future:
        assert self._loop is not None and transactional_id not in self._gates
        gate = self._gates[transactional_id] = self._loop.create_future()
        return gate

    def close_gate(self, transactional_id: str, gate: asyncio.Future) -> None:
        if self._gates.get(transactional_id) is gate:
            del self._gates[transactional_id]
        if not gate.done():
            gate.set_result(None)

    async def add_implicitly(self, transactional_id: str, producer_id: int,
                             producer_epoch: int, partitions: list[TopicPartition]) -> ErrorCode:
        """Transactions V2 (Produce v12, TxnOffsetCommit v5): the broker adds partitions to
        the producer's transaction itself (Kafka's AddPartitionsToTxnManager with the
        ADD_PARTITION operation). Answers as `verify` does."""
        if self.topic() is None:
            return ErrorCode.coordinator_not_available
        backoff_ms, waited_ms = ADD_PARTITIONS_RETRY_BACKOFF_MS, 0
        while True:
            result = await self.persist(self.coordinator.add_partitions_to_txn(
                transactional_id=transactional_id, producer_id=producer_id,
                producer_epoch=producer_epoch, partitions=partitions, now_ms=now_ms(),
                client_transaction_version=TRANSACTION_VERSION_2))
            # the previous transaction's markers are still being written: Kafka retries
            # within the broker for a while before the producer sees a retriable error
            if result.error is not ErrorCode.concurrent_transactions \
                    or waited_ms >= ADD_PARTITIONS_RETRY_BACKOFF_MAX_MS:
                break
            await asyncio.sleep(backoff_ms / 1000)
            waited_ms += backoff_ms
            backoff_ms = min(2 * backoff_ms, ADD_PARTITIONS_RETRY_BACKOFF_MAX_MS)
        return ErrorCode.invalid_producer_epoch if result.error is ErrorCode.producer_fenced \
            else result.error

    def verify(self, transactional_id: str, producer_id: int, producer_epoch: int,
               tp: TopicPartition, *, abortable_ok: bool) -> ErrorCode:
        """Is `tp` in the open transaction of (producer_id, producer_epoch)? NONE if so,
        else the error Kafka's broker answers (AddPartitionsToTxnManager): PRODUCER_FENCED
        becomes INVALID_PRODUCER_EPOCH (what producers expect here), TRANSACTION_ABORTABLE
        becomes INVALID_TXN_STATE unless the request's version knows it (`abortable_ok`);
        coordinator errors (CONCURRENT_TRANSACTIONS, NOT_COORDINATOR, ...) pass through."""
        if self.topic() is None:
            return ErrorCode.coordinator_not_available
        errors = self.coordinator.verify_partitions(
            transactional_id=transactional_id, producer_id=producer_id,
            producer_epoch=producer_epoch, partitions=[tp])
        error = errors[tp]
        if error is ErrorCode.producer_fenced:
            return ErrorCode.invalid_producer_epoch
        if error is ErrorCode.transaction_abortable and not abortable_ok:
            return ErrorCode.invalid_txn_state
        return error
