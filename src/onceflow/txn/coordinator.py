"""`TransactionCoordinator`: the one object per broker that answers the transaction APIs.

Theory of operation
-------------------
The coordinator owns the transactional ids of the `__transaction_state` partitions this
broker has loaded, one `Shard` per partition. It performs no I/O and reads no clock: every
call takes `now_ms`, every durable change leaves as an `Append`, every marker as a
`MarkerWrite`, and the producer ids it hands out come from an injected allocator.

Prepare, persist, apply:

1. A handler (`init_producer_id`, `add_partitions_to_txn`, `end_txn`, ...) validates the
   request against the id's current metadata (the rules are in handlers.py, the table in
   state.py) and either answers at once or returns a `Result` with the response to send on
   success and one `Append`: the target metadata's record. The id now has a *pending*
   transition (Kafka's pendingState): other requests for it get CONCURRENT_TRANSACTIONS.
2. The broker appends it to `__transaction_state` and waits until it is durable.
3. The broker calls `complete(result, outcomes, now_ms)`: a durable record is *replayed* -
   the very code `load_partition` runs over the whole partition at startup, so recovery is
   not a second code path - and the replayed value is checked to be exactly the target that
   was prepared. A failed append leaves the state untouched (nothing was applied) and
   answers Kafka's mapped error.

A durable PrepareCommit/PrepareAbort starts a `MarkerJob` (markers.py): `complete` returns
the markers to write. The EndTxn was already answered NONE (the outcome is decided). The
broker writes them and reports per-partition errors to `markers_written`; when every
partition has its marker, the Complete* record is appended like any other. After a restart,
`load_partition` returns the markers of every id it finds in Prepare* (written again;
idempotent).

Time: `tick(now_ms)` aborts transactions older than their timeout (with an epoch bump that
fences their producer), writes tombstones for ids idle longer than
transactional.id.expiration.ms, and retries markers and Complete* appends that failed;
`next_deadline_ms()` tells when to call it next.

Errors: Kafka's codes in responses; an illegal transition or a record that does not say
what was prepared is our bug and raises (IllegalTransition / AssertionError).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kio.schema.errors import ErrorCode

from onceflow.groups.records import LogRecord
from onceflow.groups.timers import Timers
from onceflow.protocol.records import NO_PRODUCER_ID
from onceflow.txn import handlers
from onceflow.txn.api import (
    CONSUMER_OFFSETS_TOPIC,
    Append,
    Appended,
    AppendFailed,
    AppendOutcome,
    DescribedTransaction,
    InitProducerIdResult,
    ListedTransaction,
    ListTransactionsResult,
    MarkerWrite,
    Result,
    TopicPartition,
    TxnResult,
    append_error,
)
from onceflow.txn.config import TxnConfig
from onceflow.txn.handlers import Decision, Expire, Kind, Transit
from onceflow.txn.markers import MarkerJob, MarkerOutcome
from onceflow.txn.metadata import TxnMetadata, check_replay, client_identity
from onceflow.txn.metadata import complete as complete_metadata
from onceflow.txn.records import decode_key, decode_value, encode_key, partition_for, txn_record
from onceflow.txn.state import (
    EXPIRATION_ALLOWED,
    PREPARE_STATES,
    TxnState,
    check_transition,
    parse_state_filters,
)

R = TypeVar("R")
S = TxnState
E = ErrorCode

# timer keys
ABORT_SCAN = ("abort-timed-out",)
EXPIRE_SCAN = ("expire-transactional-ids",)
MARKER_RETRY = "marker-retry"  # (MARKER_RETRY, transactional id, job seq)
COMPLETE_RETRY = "complete-retry"  # (COMPLETE_RETRY, transactional id, job seq)
# bytes a tombstone record adds to its batch besides its key (record header varints,
# attributes, timestamp/offset deltas, null value, headers count): a generous upper bound
TOMBSTONE_RECORD_OVERHEAD_BYTES = 32


_shard_seq = itertools.count()


class Shard:
    """The transactional ids of one __transaction_state partition, as loaded once."""

    def __init__(self, partition: int, coordinator_epoch: int) -> None:
        self.partition = partition
        self.coordinator_epoch = coordinator_epoch  # written into every marker
        self.seq = next(_shard_seq)  # this load of the partition (append intents name it)
        self.txns: dict[str, TxnMetadata] = {}


@dataclass(slots=True)
class _Out:
    """What one coordinator call produces besides its response."""

    appends: list[Append] = field(default_factory=list)
    markers: list[MarkerWrite] = field(default_factory=list)

    def result(self, response: R) -> Result[R]:
        return Result(response, tuple(self.appends), tuple(self.markers))


class TransactionCoordinator:
    def __init__(self, config: TxnConfig | None = None, *,
                 allocate_producer_id: Callable[[], int],
                 group_partition_for: Callable[[str], int]) -> None:
        """`allocate_producer_id`: a durable allocator (storage.producer_ids), never reusing
        an id. `group_partition_for`: the group coordinator's partition_for (AddOffsetsToTxn
        adds that __consumer_offsets partition to the transaction)."""
        self.config = config or TxnConfig()
        self._allocate_producer_id = allocate_producer_id
        self._group_partition_for = group_partition_for
        self._shards: dict[int, Shard] = {}
        self._loading: set[int] = set()
        self._pending: dict[str, TxnState] = {}  # id -> state a transition in flight heads to
        self._jobs: dict[str, MarkerJob] = {}
        self._timers = Timers()

    # ------------------------------------------------------------ partitions

    def partition_for(self, transactional_id: str) -> int:
        """The __transaction_state partition (hence coordinator) of an id (FindCoordinator)."""
        return partition_for(transactional_id, self.config.transaction_state_num_partitions)

    def loaded_partitions(self) -> frozenset[int]:
        return frozenset(self._shards)

    def begin_loading(self, partition: int) -> None:
        """Requests for the partition's ids get COORDINATOR_LOAD_IN_PROGRESS meanwhile."""
        self._loading.add(partition)

    def load_partition(self, partition: int, entries: Iterable[LogRecord], now_ms: int,
                       coordinator_epoch: int = 0) -> Result[None]:
        """Become coordinator for `partition`: replay its records (in offset order). Returns
        the markers of every transaction found in Prepare* (Kafka's
        transactionsPendingForCompletion). `coordinator_epoch` goes into every marker; it
        must not decrease across loads of the partition (partitions refuse markers of an
        older coordinator epoch with TRANSACTION_COORDINATOR_FENCED)."""
        assert partition not in self._shards, f"partition {partition} is already loaded"
        shard = Shard(partition, coordinator_epoch)
        for entry in entries:
            self._replay(shard, entry)
        self._shards[partition] = shard
        self._loading.discard(partition)
        out = _Out()
        for txn in list(shard.txns.values()):
            if txn.state in PREPARE_STATES:
                self._start_markers(shard, txn, out, now_ms)
        self._schedule_scans(now_ms)
        return out.result(None)

    def unload_partition(self, partition: int) -> None:
        """Stop coordinating `partition`: its ids, pending transitions and marker jobs are
        dropped; appends still in flight for it complete with NOT_COORDINATOR."""
        self._loading.discard(partition)
        shard = self._shards.pop(partition, None)
        if shard is None:
            return
        for transactional_id in [t for t in self._pending if self.partition_for(t) == partition]:
            del self._pending[transactional_id]
            self._jobs.pop(transactional_id, None)

    def metadata(self, transactional_id: str) -> TxnMetadata | None:
        """The id's current (durable) metadata, if loaded here."""
        shard = self._shards.get(self.partition_for(transactional_id))
        return None if shard is None else shard.txns.get(transactional_id)

    # ------------------------------------------------------------ client APIs

    def init_producer_id(self, *, transactional_id: str | None, transaction_timeout_ms: int,
                         producer_id: int = NO_PRODUCER_ID, producer_epoch: int = -1,
                         now_ms: int, enable_2pc: bool = False,
                         keep_prepared_txn: bool = False) -> Result[InitProducerIdResult]:
        """InitProducerId (any version). `producer_id`/`producer_epoch` (v3+, KIP-360) are the
        caller's current ones, or -1/-1. `enable_2pc`/`keep_prepared_txn` are v6's (KIP-939):
        a two-phase-commit transaction has no timeout (stored as INT32_MAX, as Kafka marks
        it), and keeping its open transaction hands the new instance a bumped epoch and the
        transaction's own (producer id, epoch), so it can commit or abort it."""
        if transactional_id is None:  # idempotent producer: a fresh id, nothing to remember
            if enable_2pc or keep_prepared_txn:
                return Result(InitProducerIdResult(E.invalid_request))
            return Result(InitProducerIdResult(E.none, self._allocate_producer_id(), 0))
        if not handlers.valid_id(transactional_id) or (
                (producer_id == NO_PRODUCER_ID) != (producer_epoch == -1)):
            return Result(InitProducerIdResult(E.invalid_request))
        if enable_2pc and not self.config.transaction_two_phase_commit_enable:
            # Kafka: 2PC switched off on the broker reads as not being allowed to use it
            return Result(InitProducerIdResult(E.transactional_id_authorization_failed))
        if enable_2pc:
            transaction_timeout_ms = handlers.TWO_PHASE_COMMIT_TIMEOUT_MS
        elif not 0 < transaction_timeout_ms <= self.config.transaction_max_timeout_ms:
            return Result(InitProducerIdResult(E.invalid_transaction_timeout))
        error, shard = self._check(transactional_id)
        if error is not None:
            return Result(InitProducerIdResult(error))
        assert shard is not None
        expected = None if producer_id == NO_PRODUCER_ID else (producer_id, producer_epoch)
        current = shard.txns.get(transactional_id)
        decision = handlers.decide_init(
            transactional_id, current, self._is_pending(transactional_id),
            transaction_timeout_ms, expected, now_ms, self._allocate_producer_id,
            keep_prepared_txn=keep_prepared_txn)
        if isinstance(decision, ErrorCode):
            return Result(InitProducerIdResult(decision))
        target = decision.target
        if decision.kind is Kind.FENCE:
            response = InitProducerIdResult(E.concurrent_transactions)
        elif decision.kind is Kind.KEEP:
            assert current is not None
            response = InitProducerIdResult(E.none, target.producer_id, target.producer_epoch,
                                            current.producer_id, current.producer_epoch)
        else:
            response = InitProducerIdResult(E.none, target.producer_id, target.producer_epoch)
        return self._write(shard, decision, response)

    def add_partitions_to_txn(self, *, transactional_id: str, producer_id: int,
                              producer_epoch: int, partitions: Iterable[tuple[str, int]],
                              now_ms: int, client_transaction_version: int | None = None
                              ) -> Result[TxnResult]:
        """AddPartitionsToTxn for one transaction (v0-v3 carry one; the broker loops over the
        transactions of a v4+ request). One error for all partitions, as in Kafka's
        coordinator; topic existence and authorization are the broker handler's business."""
        wanted = frozenset(TopicPartition(*tp) for tp in partitions)
        if not handlers.valid_id(transactional_id) or not handlers.valid_partitions(wanted):
            return Result(TxnResult(E.invalid_request))
        error, shard = self._check(transactional_id)
        if error is not None:
            return Result(TxnResult(error))
        assert shard is not None
        decision = handlers.decide_add(
            shard.txns.get(transactional_id), self._is_pending(transactional_id), producer_id,
            producer_epoch, wanted, now_ms, client_transaction_version)
        if isinstance(decision, ErrorCode):
            return Result(TxnResult(decision))
        return self._write(shard, decision, TxnResult(E.none))

    def add_offsets_to_txn(self, *, transactional_id: str, producer_id: int,
                           producer_epoch: int, group_id: str, now_ms: int) -> Result[TxnResult]:
        """AddOffsetsToTxn: the group's __consumer_offsets partition joins the transaction
        (KafkaApis.handleAddOffsetsToTxnRequest)."""
        offsets_partition = (CONSUMER_OFFSETS_TOPIC, self._group_partition_for(group_id))
        return self.add_partitions_to_txn(
            transactional_id=transactional_id, producer_id=producer_id,
            producer_epoch=producer_epoch, partitions=[offsets_partition], now_ms=now_ms)

    def end_txn(self, *, transactional_id: str, producer_id: int, producer_epoch: int,
                commit: bool, now_ms: int, transactions_v2: bool = False) -> Result[TxnResult]:
        """EndTxn. Answered once Prepare* is durable; the markers follow (see complete).
        `transactions_v2` (EndTxn v5+): the epoch is bumped by every end and answered."""
        if not handlers.valid_id(transactional_id):
            return Result(TxnResult(E.invalid_request))
        error, shard = self._check(transactional_id)
        if error is not None:
            return Result(TxnResult(error))
        assert shard is not None
        current = shard.txns.get(transactional_id)
        pending = self._is_pending(transactional_id)
        if not transactions_v2:
            decision = handlers.decide_end(current, pending, producer_id, producer_epoch, commit,
                                           now_ms)
        else:
            decision = handlers.decide_end_v2(current, pending, producer_id, producer_epoch,
                                              commit, now_ms, self._allocate_producer_id)
        if decision is E.none and transactions_v2 and current is not None:
            return Result(TxnResult(E.none, current.producer_id, current.producer_epoch))
        if isinstance(decision, ErrorCode):
            return Result(TxnResult(decision))
        identity = client_identity(decision.target) if transactions_v2 else (-1, -1)
        return self._write(shard, decision, TxnResult(E.none, *identity))

    def verify_partitions(self, *, transactional_id: str, producer_id: int, producer_epoch: int,
                          partitions: Iterable[tuple[str, int]]) -> dict[TopicPartition, ErrorCode]:
        """AddPartitionsToTxn v4+ verify_only / the produce path's KIP-890 check: NONE for
        partitions of the open transaction, TRANSACTION_ABORTABLE for others, or one error."""
        wanted = frozenset(TopicPartition(*tp) for tp in partitions)
        if not handlers.valid_id(transactional_id):
            return {tp: E.invalid_request for tp in wanted}
        error, shard = self._check(transactional_id)
        if error is not None:
            return {tp: error for tp in wanted}
        assert shard is not None
        return handlers.decide_verify(shard.txns.get(transactional_id), producer_id,
                                      producer_epoch, wanted)

    # ------------------------------------------------------------ effects

    def complete(self, result: Result[R], outcomes: Sequence[AppendOutcome],
                 now_ms: int) -> Result[R]:
        """Apply the outcomes of `result.appends` (same order). Returns the response to send,
        and follow-up appends and markers (`result.markers` are not repeated)."""
        assert len(outcomes) == len(result.appends), "one outcome per append"
        out = _Out()
        response = result.response
        for append, outcome in zip(result.appends, outcomes, strict=True):
            if isinstance(outcome, AppendFailed):
                response = self._append_failed(append, outcome.error, response, now_ms)
            else:
                response = self._append_durable(append, outcome, response, out, now_ms)
        return out.result(response)

    def markers_written(self, write: MarkerWrite, errors: dict[TopicPartition, ErrorCode],
                        now_ms: int) -> Result[None]:
        """The broker wrote (or failed to write) `write`'s markers: one error per partition
        (NONE = durable). Returns the Complete* append once every partition has its marker."""
        out = _Out()
        job = self._jobs.get(write.transactional_id)
        if job is None or not job.matches(write):
            return out.result(None)  # obsolete: the partition was unloaded or reloaded
        verdict = job.record(write, {TopicPartition(*tp): e for tp, e in errors.items()})
        if verdict is MarkerOutcome.CANCEL:
            # Kafka's removeMarkersForTxnId: stop; the pending transition stays, so the id
            # answers CONCURRENT_TRANSACTIONS until its partition is loaded again
            del self._jobs[write.transactional_id]
        elif verdict is MarkerOutcome.RETRY:
            self._timers.schedule((MARKER_RETRY, job.transactional_id, job.seq),
                                  now_ms + self.config.retry_backoff_ms)
        else:
            self._maybe_complete(job, out, now_ms)
        return out.result(None)

    def tick(self, now_ms: int) -> Result[None]:
        """Fire every deadline due at `now_ms`."""
        out = _Out()
        for key, seq in self._timers.due(now_ms):
            if not self._timers.claim(key, seq):
                continue
            if key == ABORT_SCAN:
                self._abort_timed_out(out, now_ms)
                self._timers.schedule(ABORT_SCAN,
                                      now_ms + self.config.abort_timed_out_cleanup_interval_ms)
            elif key == EXPIRE_SCAN:
                self._expire(out, now_ms)
                self._timers.schedule(EXPIRE_SCAN,
                                      now_ms + self.config.remove_expired_cleanup_interval_ms)
            else:
                self._retry(key, out, now_ms)
        return out.result(None)

    def next_deadline_ms(self) -> int | None:
        return self._timers.next_deadline_ms()

    # ------------------------------------------------------------ admin APIs

    def describe_transactions(self, transactional_ids: Sequence[str]) -> list[DescribedTransaction]:
        return [self._describe(t) for t in transactional_ids]

    def list_transactions(self, *, state_filters: Sequence[str] = (),
                          producer_id_filters: Sequence[int] = (), duration_filter_ms: int = -1,
                          transactional_id_pattern: str | None = None,
                          now_ms: int) -> ListTransactionsResult:
        """ListTransactions v0-v2: exact state names (unknown ones echoed back), producer ids,
        "running longer than" (now - start > duration; Kafka applies it in every state), and
        a regular expression that must match the whole id (Java's Matcher.matches)."""
        states, unknown = parse_state_filters(tuple(state_filters))
        if self._loading:
            return ListTransactionsResult(E.coordinator_load_in_progress)
        try:
            pattern = re.compile(transactional_id_pattern) if transactional_id_pattern else None
        except re.error:
            return ListTransactionsResult(E.invalid_request)  # (not verified against Kafka)
        pids = frozenset(producer_id_filters)

        def wanted(m: TxnMetadata) -> bool:
            return ((not pids or m.producer_id in pids)
                    and (not state_filters or m.state in states)
                    and (duration_filter_ms < 0
                         or now_ms - m.txn_start_timestamp_ms > duration_filter_ms)
                    and (pattern is None or pattern.fullmatch(m.transactional_id) is not None))

        listed = tuple(ListedTransaction(m.transactional_id, m.producer_id, m.state.value)
                       for shard in self._shards.values() for m in shard.txns.values()
                       if wanted(m))
        return ListTransactionsResult(E.none, listed, unknown)

    # ------------------------------------------------------------ internals: requests

    def _check(self, transactional_id: str) -> tuple[ErrorCode | None, Shard | None]:
        """Kafka's getTransactionState errors: loading here, or not ours."""
        partition = self.partition_for(transactional_id)
        if partition in self._loading:
            return E.coordinator_load_in_progress, None
        shard = self._shards.get(partition)
        if shard is None:
            return E.not_coordinator, None
        return None, shard

    def _is_pending(self, transactional_id: str) -> bool:
        return transactional_id in self._pending

    def _write(self, shard: Shard, decision: Decision, response: R) -> Result[R]:
        """Persist `decision.target`: one append; the id is pending until it completes."""
        target = decision.target
        assert target.transactional_id not in self._pending
        self._pending[target.transactional_id] = target.state
        record = txn_record(target.transactional_id, target.to_value())
        intent = Transit(decision.kind, target, shard.seq)
        return Result(response, (Append(shard.partition, (record,), intent),))

    # ------------------------------------------------------------ internals: replay

    def _replay(self, shard: Shard, entry: LogRecord,
                live: TxnMetadata | None = None) -> TxnMetadata | None:
        """Apply one __transaction_state record: what loading does for every record, and
        what `complete` does for each durable one. `live` is the target that was prepared
        for it (it carries the soft fields a record does not)."""
        transactional_id = decode_key(entry.key)
        if self.partition_for(transactional_id) != shard.partition:
            raise RuntimeError(
                f"{transactional_id!r} found in partition {shard.partition}, belongs to "
                f"{self.partition_for(transactional_id)}: transaction.state.log.num.partitions "
                "changed?")
        current = shard.txns.get(transactional_id)
        if entry.value is None:  # tombstone: the id expired
            if current is not None:
                check_transition(transactional_id, current.state, S.DEAD)
                del shard.txns[transactional_id]
            return None
        new = TxnMetadata.from_value(transactional_id, decode_value(entry.value))
        check_replay(current, new)
        if live is not None:
            assert new == live.durable(), f"record {new} is not the prepared {live}"
            new = live
        shard.txns[transactional_id] = new
        return new

    def _append_durable(self, append: Append, outcome: Appended, response: Any, out: _Out,
                        now_ms: int) -> Any:
        intent = append.intent
        shard = self._shards.get(append.partition)
        if shard is None or shard.seq != intent.shard_seq:
            # unloaded (and maybe reloaded) meanwhile: the partition's owner replays the log
            return self._error_response(intent, E.not_coordinator, response)
        entries = [LogRecord(outcome.base_offset + i, outcome.timestamp_ms, NO_PRODUCER_ID,
                             record.key, record.value)
                   for i, record in enumerate(append.records)]
        if isinstance(intent, Expire):
            for entry in entries:
                self._replay(shard, entry)
            for transactional_id in intent.transactional_ids:
                self._pending.pop(transactional_id, None)
            return response
        (entry,) = entries
        new = self._replay(shard, entry, live=intent.target)
        assert new is not None
        self._pending.pop(new.transactional_id, None)
        if intent.kind is Kind.COMPLETE:
            job = self._jobs.pop(new.transactional_id, None)
            assert job is not None and job.completing, f"no completion was pending for {new}"
        elif new.state in PREPARE_STATES:
            self._start_markers(shard, new, out, now_ms)
        return response

    def _append_failed(self, append: Append, error: ErrorCode, response: Any,
                       now_ms: int) -> Any:
        intent = append.intent
        shard = self._shards.get(append.partition)
        if shard is None or shard.seq != intent.shard_seq:
            return self._error_response(intent, append_error(error), response)
        if isinstance(intent, Expire):
            for transactional_id in intent.transactional_ids:
                self._pending.pop(transactional_id, None)
            return response
        transactional_id = intent.target.transactional_id
        if intent.kind is Kind.COMPLETE:
            # Kafka retries this append when the log is unavailable; with a single node a
            # storage error would otherwise strand the id in Prepare* until a restart, so
            # every failure is retried while the partition stays loaded
            job = self._jobs[transactional_id]
            job.completing = False
            self._timers.schedule((COMPLETE_RETRY, transactional_id, job.seq),
                                  now_ms + self.config.retry_backoff_ms)
            return response
        self._pending.pop(transactional_id, None)
        return self._error_response(intent, append_error(error), response)

    @staticmethod
    def _error_response(intent: Transit | Expire, error: ErrorCode, response: Any) -> Any:
        if isinstance(intent, Expire) or intent.kind in (Kind.TIMEOUT, Kind.COMPLETE):
            return response  # no client waits for these
        if intent.kind in (Kind.INIT, Kind.FENCE, Kind.KEEP):
            return InitProducerIdResult(error)
        return TxnResult(error)

    # ------------------------------------------------------------ internals: markers

    def _start_markers(self, shard: Shard, txn: TxnMetadata, out: _Out, now_ms: int) -> None:
        """Prepare* is durable: write the markers (Kafka's addTxnMarkersToSend)."""
        commit = txn.state is S.PREPARE_COMMIT
        job = MarkerJob(txn.transactional_id, txn.producer_id, txn.producer_epoch, commit,
                        shard.coordinator_epoch, set(txn.partitions),
                        txn.client_transaction_version)
        self._jobs[txn.transactional_id] = job
        self._pending[txn.transactional_id] = S.COMPLETE_COMMIT if commit else S.COMPLETE_ABORT
        if job.remaining:
            out.markers.append(job.send(set(job.remaining)))
        else:
            self._maybe_complete(job, out, now_ms)

    def _maybe_complete(self, job: MarkerJob, out: _Out, now_ms: int) -> None:
        """Every marker is durable: append Complete* (Kafka's maybeWriteTxnCompletion)."""
        if not job.all_written() or job.completing:
            return
        shard = self._shards[self.partition_for(job.transactional_id)]
        current = shard.txns[job.transactional_id]
        target = complete_metadata(current, now_ms)
        record = txn_record(target.transactional_id, target.to_value())
        out.appends.append(Append(shard.partition, (record,),
                                  Transit(Kind.COMPLETE, target, shard.seq)))
        job.completing = True

    def _retry(self, key: tuple, out: _Out, now_ms: int) -> None:
        kind, transactional_id, seq = key
        job = self._jobs.get(transactional_id)
        if job is None or job.seq != seq:
            return  # the job finished, was cancelled or replaced meanwhile
        if kind == MARKER_RETRY:
            waiting = job.waiting()
            if waiting:
                out.markers.append(job.send(waiting))
        else:
            assert kind == COMPLETE_RETRY, key
            self._maybe_complete(job, out, now_ms)

    # ------------------------------------------------------------ internals: time

    def _schedule_scans(self, now_ms: int) -> None:
        for key, interval_ms in ((ABORT_SCAN, self.config.abort_timed_out_cleanup_interval_ms),
                                 (EXPIRE_SCAN, self.config.remove_expired_cleanup_interval_ms)):
            if self._timers.deadline_ms(key) is None:
                self._timers.schedule(key, now_ms + interval_ms)

    def _abort_timed_out(self, out: _Out, now_ms: int) -> None:
        for shard in self._shards.values():
            for txn in list(shard.txns.values()):
                decision = handlers.decide_timeout(
                    txn, self._is_pending(txn.transactional_id), now_ms)
                if decision is not None:
                    out.appends.extend(self._write(shard, decision, None).appends)

    def _expire(self, out: _Out, now_ms: int) -> None:
        """Tombstones for ids idle too long (Kafka's removeExpiredTransactionalIds), in
        batches no larger than the topic's max.message.bytes."""
        horizon_ms = now_ms - self.config.transactional_id_expiration_ms
        for shard in self._shards.values():
            expired = [t.transactional_id for t in shard.txns.values()
                       if t.state in EXPIRATION_ALLOWED and not self._is_pending(t.transactional_id)
                       and t.txn_last_update_timestamp_ms <= horizon_ms]
            for batch in self._tombstone_batches(expired):
                for transactional_id in batch:
                    self._pending[transactional_id] = S.DEAD
                records = tuple(txn_record(t, None) for t in batch)
                out.appends.append(Append(shard.partition, records,
                                          Expire(tuple(batch), shard.seq)))

    def _tombstone_batches(self, transactional_ids: list[str]) -> list[list[str]]:
        batches: list[list[str]] = []
        size = self.config.tombstone_batch_bytes_max  # forces a new batch first
        for transactional_id in transactional_ids:
            record_bytes = len(encode_key(transactional_id)) + TOMBSTONE_RECORD_OVERHEAD_BYTES
            if size + record_bytes > self.config.tombstone_batch_bytes_max:
                batches.append([])
                size = 0
            batches[-1].append(transactional_id)
            size += record_bytes
        return batches

    # ------------------------------------------------------------ internals: admin

    def _describe(self, transactional_id: str) -> DescribedTransaction:
        if not transactional_id:
            return DescribedTransaction(transactional_id, E.invalid_request)
        error, shard = self._check(transactional_id)
        if error is not None:
            return DescribedTransaction(transactional_id, error)
        assert shard is not None
        txn = shard.txns.get(transactional_id)
        if txn is None:
            return DescribedTransaction(transactional_id, E.transactional_id_not_found)
        partitions: Iterable[TopicPartition] = txn.partitions
        job = self._jobs.get(transactional_id)
        if job is not None and txn.state in PREPARE_STATES:
            partitions = job.remaining  # Kafka lists only partitions still without a marker
        topics: dict[str, list[int]] = {}
        for tp in sorted(partitions):
            topics.setdefault(tp.topic, []).append(tp.partition)
        return DescribedTransaction(
            transactional_id, E.none, txn.state.value, txn.txn_timeout_ms,
            txn.txn_start_timestamp_ms, txn.producer_id, txn.producer_epoch,
            tuple((topic, tuple(ps)) for topic, ps in topics.items()))
