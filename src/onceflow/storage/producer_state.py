"""Producer state of one partition: idempotence and transactions, as Kafka's broker keeps it.

Theory of operation
-------------------
Every batch of an idempotent or transactional producer carries its producer id (PID), epoch
and the sequence number of its first record. Per PID the partition keeps a `ProducerEntry`:
the epoch, the metadata of the last `BATCHES_RETAINED` (5) appended batches, the epoch of the
coordinator that wrote the last marker, and the first offset of the open transaction, if any.
That is enough to answer a retry of any of the 5 cached batches with its *original* offsets
(`Duplicate`, the lost-ACK case); to reject a gap or a retry older than the window
(OUT_OF_ORDER_SEQUENCE_NUMBER); to fence zombies (an older epoch gets INVALID_PRODUCER_EPOCH, a
new epoch must start at sequence 0); and to know which transactions are open (for the last
stable offset) and which completed (for the aborted-transaction index).

Prepare, append, commit (Kafka's `prepareUpdate`/`update`). `prepare()` validates the batches
of one append and *mutates nothing*; it returns an `AppendPlan`, a `Duplicate` or a
`Rejected`. The partition appends the plan's batches to its log, then calls
`commit(plan, first_offset, last_offset)`, which runs the same pure transition (`_apply_batch`)
with the real offsets and stores the result. Several batches of one PID in one append are each
validated against the state left by the previous ones.

Commit as soon as the bytes are in the log, before waiting for fsync, as Kafka does: a producer
pipelines up to 5 requests and the next one must be validated against the previous one. That
is safe because the invariant is "producer state == replay of the log": a crash that loses
unflushed bytes loses them from both. A response (a `Duplicate`'s too) must still wait until
the offsets it names are durable. Prepare-append-commit of one partition must not interleave
with another append to it; `commit` asserts the state is the one the plan was prepared against.

Recovery is not a second code path: `load_latest_snapshot` restores the newest valid snapshot,
then the caller feeds every later batch of the log to `replay()`, which is `prepare` with
origin REPLICATION (nothing rejected: the log is the truth) followed by `commit`.

Snapshot file `<offset:020d>.snapshot`, big-endian; the offset is exclusive (the state of the
log below it). Unlike Kafka's, which keeps only the last batch per PID, it keeps all 5, so each
is still recognised as a duplicate after a restart:

    magic "OFPS" | version u16 | crc32c u32 of all that follows | offset i64 | count u32 |
    count x ( producer_id i64 | epoch i16 | coordinator_epoch i32 | last_timestamp_ms i64 |
              txn_first_offset i64 (-1: none) | batch_count u8 (<= 5) | batch_count x
              ( first_seq i32 | last_seq i32 | first_offset i64 | last_offset i64 | ts_ms i64 ) )
"""
from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import NamedTuple, Protocol

import crc32c
from kio.schema.errors import ErrorCode

# NO_PRODUCER_ID: a plain producer's batch; NO_PRODUCER_EPOCH: a PID we know nothing about, so
# any first sequence is accepted; NO_SEQUENCE: coordinator writes (transactional offset
# commits); SEQUENCE_MAX: sequences are int32, after it comes 0. EndTxnMarker: the decoded
# record of a control batch (`records.end_txn_marker`).
from onceflow.protocol.records import (
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    SEQUENCE_MAX,
    EndTxnMarker,
    last_sequence,
)
from onceflow.storage.layout import replace_file

BATCHES_RETAINED = 5  # Kafka's NUM_BATCHES_TO_RETAIN: why max.in.flight <= 5 is safe
PRODUCER_ID_EXPIRATION_MS_DEFAULT = 86_400_000  # producer.id.expiration.ms, 1 day
SNAPSHOTS_RETAINED = 2  # the newest valid one, plus one to fall back on if it is corrupt
SNAPSHOT_SUFFIX = ".snapshot"
SNAPSHOT_TMP_SUFFIX = ".snapshot.tmp"
SNAPSHOT_MAGIC = b"OFPS"
SNAPSHOT_VERSION = 1

_PREFIX = struct.Struct(">4sHI")  # magic, version, crc32c of the rest of the file
_BODY_HEAD = struct.Struct(">qI")  # snapshot offset, entry count
_ENTRY = struct.Struct(">qhiqqB")  # pid, epoch, coordinator epoch, last ts, txn first, batch count
_BATCH = struct.Struct(">iiqqq")  # first seq, last seq, first offset, last offset, timestamp


class BatchHeaderLike(Protocol):
    """The fields of a record batch header (protocol.records.BatchHeader) used here."""
    @property
    def producer_id(self) -> int: ...
    @property
    def producer_epoch(self) -> int: ...
    @property
    def base_sequence(self) -> int: ...
    @property
    def last_offset_delta(self) -> int: ...
    @property
    def max_timestamp(self) -> int: ...
    @property
    def is_transactional(self) -> bool: ...
    @property
    def is_control(self) -> bool: ...


class BatchFields(NamedTuple):
    """A minimal `BatchHeaderLike`, for callers and tests without a parsed header."""
    producer_id: int
    producer_epoch: int
    base_sequence: int
    last_offset_delta: int = 0
    max_timestamp: int = 0
    is_transactional: bool = False
    is_control: bool = False


class AppendOrigin(Enum):
    CLIENT = "client"  # Produce: duplicates detected, epochs and sequences checked
    COORDINATOR = "coordinator"  # markers, coordinator writes: epochs checked, not sequences
    REPLICATION = "replication"  # replay of our own log: nothing rejected, the log is the truth


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    first_seq: int
    last_seq: int
    first_offset: int  # inclusive
    last_offset: int  # inclusive
    timestamp_ms: int  # the batch's max timestamp (the log append time on LogAppendTime topics)


@dataclass(frozen=True, slots=True)
class ProducerEntry:
    """What this partition knows of one PID. Immutable: a transition builds a new one."""
    producer_id: int
    producer_epoch: int = NO_PRODUCER_EPOCH
    batches: tuple[BatchMetadata, ...] = ()  # oldest first, at most BATCHES_RETAINED
    coordinator_epoch: int = -1
    last_timestamp_ms: int = -1
    current_txn_first_offset: int | None = None

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    def find_duplicate(self, epoch: int, first_seq: int, last_seq: int, *,
                       transactional: bool) -> BatchMetadata | None:
        """The cached batch that a batch with these fields retries, if any.

        A transactional batch can only retry a batch of the producer's *open* transaction:
        a cached batch below the open transaction's first offset, or any cached batch when
        no transaction is open, belongs to a transaction that a marker has already ended.
        Under transactions V1 a client may reuse the sequence of a batch it purged on abort
        (librdkafka does), so the same (epoch, sequence) in the next transaction is new data,
        and answering it as a duplicate would acknowledge a record that was never written.
        """
        if epoch != self.producer_epoch:
            return None
        for batch in self.batches:
            if batch.first_seq == first_seq and batch.last_seq == last_seq:
                if transactional and not self.in_open_transaction(batch):
                    return None
                return batch
        return None

    def in_open_transaction(self, batch: BatchMetadata) -> bool:
        first = self.current_txn_first_offset
        return first is not None and batch.first_offset >= first

    def ended_batch_with_sequence(self, first_seq: int) -> BatchMetadata | None:
        """A cached batch starting at `first_seq` whose transaction has ended (for messages)."""
        for batch in self.batches:
            if batch.first_seq == first_seq and not self.in_open_transaction(batch):
                return batch
        return None


class CompletedTxn(NamedTuple):
    """A transaction ended by a marker; offsets inclusive. An aborted one goes in the index."""
    producer_id: int
    first_offset: int
    last_offset: int  # the marker's offset
    aborted: bool
    last_stable_offset: int  # the LSO once this one is complete (Kafka's AbortedTxn field)


class ProducerDescription(NamedTuple):
    """One row of DescribeProducers."""
    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp_ms: int
    coordinator_epoch: int
    current_txn_start_offset: int  # -1: no open transaction


class Duplicate(NamedTuple):
    """A retry of a cached batch: answer success with these original offsets, append nothing."""
    first_offset: int
    last_offset: int
    timestamp_ms: int


class Rejected(NamedTuple):
    """The whole append is refused with `error_code`; `batch_index` is the offending batch."""
    error_code: ErrorCode
    batch_index: int
    message: str


@dataclass(frozen=True, slots=True)
class AppendPlan:
    """Validated batches, to be committed once they are in the log."""
    batches: tuple[BatchHeaderLike, ...]
    origin: AppendOrigin
    marker: EndTxnMarker | None
    transaction_version: int
    state_version: int  # the manager's version when prepared; commit asserts it is unchanged
    offset_count: int  # offsets the batches occupy: sum of (last_offset_delta + 1)


class CorruptSnapshot(Exception):
    """A snapshot file failed its checks; it is skipped and deleted."""


class _Reject(Exception):
    def __init__(self, error_code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code


class _Step(NamedTuple):
    entry: ProducerEntry
    started_txn: bool  # this batch opened a transaction at its first offset
    completed: tuple[int, int, bool] | None  # (first offset, marker offset, aborted)


# --- the transition function: one batch applied to one entry -------------------------------


def _in_sequence(last_seq: int, next_seq: int) -> bool:
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == SEQUENCE_MAX)


def _apply_batch(entry: ProducerEntry, batch: BatchHeaderLike, first_offset: int,
                 timestamp_ms: int, origin: AppendOrigin, marker: EndTxnMarker | None,
                 transaction_version: int) -> _Step:
    """The entry after appending `batch` at `first_offset`; raises `_Reject` if not allowed."""
    if batch.is_control:
        assert marker is not None, "a control batch needs its decoded EndTxnMarker"
        return _apply_marker(entry, batch, first_offset, timestamp_ms, origin, marker,
                             transaction_version)
    return _apply_data(entry, batch, first_offset, timestamp_ms, origin)


def _apply_data(entry: ProducerEntry, batch: BatchHeaderLike, first_offset: int,
                timestamp_ms: int, origin: AppendOrigin) -> _Step:
    epoch = batch.producer_epoch
    if epoch < entry.producer_epoch and origin is not AppendOrigin.REPLICATION:
        # Since Kafka 2.7 (KIP-588, KAFKA-10687) Produce answers INVALID_PRODUCER_EPOCH, never
        # PRODUCER_FENCED, in every version: older clients do not know PRODUCER_FENCED.
        raise _Reject(ErrorCode.invalid_producer_epoch,
                      f"epoch {epoch} is older than the current epoch {entry.producer_epoch}")
    if origin is AppendOrigin.CLIENT:
        _check_sequence(entry, epoch, batch.base_sequence, batch.is_transactional)
    metadata = BatchMetadata(batch.base_sequence,
                             last_sequence(batch.base_sequence, batch.last_offset_delta),
                             first_offset, first_offset + batch.last_offset_delta, timestamp_ms)
    kept = entry.batches if epoch == entry.producer_epoch else ()  # a new epoch starts afresh
    txn_first_offset = entry.current_txn_first_offset
    if txn_first_offset is not None and not batch.is_transactional:
        raise _Reject(ErrorCode.invalid_txn_state,
                      "non-transactional batch while the producer has an open transaction")
    started = txn_first_offset is None and batch.is_transactional
    new_entry = replace(
        entry,
        producer_epoch=epoch,
        batches=(*kept, metadata)[-BATCHES_RETAINED:],
        last_timestamp_ms=timestamp_ms,
        current_txn_first_offset=first_offset if started else txn_first_offset,
    )
    return _Step(new_entry, started, None)


def _check_sequence(entry: ProducerEntry, epoch: int, first_seq: int,
                    transactional: bool) -> None:
    """Kafka's ProducerAppendInfo.checkSequence, for batches from clients, plus one case
    Kafka lets through: a transactional batch reusing the sequence of a batch whose
    transaction has ended (see `ProducerEntry.find_duplicate` and docs/transactions.md)."""
    if entry.producer_epoch == NO_PRODUCER_EPOCH:
        # Unknown PID (never wrote here, or expired): any sequence is accepted. Since KIP-360
        # the broker no longer answers UNKNOWN_PRODUCER_ID here.
        return
    if epoch != entry.producer_epoch:
        if first_seq != 0:
            raise _Reject(ErrorCode.out_of_order_sequence_number,
                          f"new epoch {epoch} must start at sequence 0, not {first_seq}")
        return
    if _in_sequence(entry.last_seq, first_seq):
        return
    ended = entry.ended_batch_with_sequence(first_seq) if transactional else None
    if ended is not None:
        # The client rewound its sequence to a batch it gave up on (purged on abort) that the
        # log holds in an ended transaction. UNKNOWN_PRODUCER_ID is the answer every client
        # turns into "abort the transaction and bump the epoch" (librdkafka treats an
        # OUT_OF_ORDER_SEQUENCE_NUMBER at the head of its queue as fatal); the new epoch
        # restarts the sequences at 0, so the next transaction goes through.
        raise _Reject(ErrorCode.unknown_producer_id,
                      f"sequence {first_seq} was used by the batch at offset "
                      f"{ended.first_offset}, in a transaction that has already ended; the "
                      f"last sequence is {entry.last_seq}: abort and bump the epoch")
    raise _Reject(ErrorCode.out_of_order_sequence_number,
                  f"sequence {first_seq} does not follow the last sequence {entry.last_seq}")


def _apply_marker(entry: ProducerEntry, batch: BatchHeaderLike, offset: int, timestamp_ms: int,
                  origin: AppendOrigin, marker: EndTxnMarker, transaction_version: int) -> _Step:
    epoch = batch.producer_epoch
    if origin is not AppendOrigin.REPLICATION:
        _check_marker_epochs(entry, epoch, marker, transaction_version)
    txn_first_offset = entry.current_txn_first_offset
    # A marker closing no data writes nothing in the index and does not move the LSO.
    completed = None if txn_first_offset is None else (txn_first_offset, offset,
                                                       not marker.commit)
    new_entry = replace(
        entry,
        producer_epoch=epoch,
        batches=entry.batches if epoch == entry.producer_epoch else (),
        coordinator_epoch=marker.coordinator_epoch,
        last_timestamp_ms=timestamp_ms,
        current_txn_first_offset=None,
    )
    return _Step(new_entry, False, completed)


def _check_marker_epochs(entry: ProducerEntry, epoch: int, marker: EndTxnMarker,
                         transaction_version: int) -> None:
    current = entry.producer_epoch
    if transaction_version >= 2:
        # TV2: the coordinator bumps the epoch before every marker, so a valid one is newer.
        # Equal epoch with no open transaction is a retried marker that already took effect.
        stale = epoch <= current
        retried = epoch == current and entry.current_txn_first_offset is None
        if stale and not retried:
            raise _Reject(ErrorCode.invalid_producer_epoch,
                          f"marker epoch {epoch} is not newer than {current} (TV2)")
    elif epoch < current:
        raise _Reject(ErrorCode.invalid_producer_epoch,
                      f"marker epoch {epoch} is older than the current epoch {current}")
    if entry.coordinator_epoch > marker.coordinator_epoch:
        raise _Reject(ErrorCode.transaction_coordinator_fenced,
                      f"coordinator epoch {marker.coordinator_epoch} is older than "
                      f"{entry.coordinator_epoch}")


def _client_batch_problem(batch: BatchHeaderLike) -> str | None:
    """Kafka's LogValidator refuses these from clients (INVALID_RECORD) before producer state."""
    if batch.is_control:
        return "clients are not allowed to write control batches"
    if batch.base_sequence < 0:
        return f"invalid sequence number {batch.base_sequence} in a batch with a producer id"
    return None


def _offsets_taken(batch: BatchHeaderLike) -> int:
    return batch.last_offset_delta + 1


# --- the manager ---------------------------------------------------------------------------


class ProducerStateManager:
    """The producer state of one partition. Not thread-safe: one partition, one caller."""

    def __init__(self) -> None:
        self._producers: dict[int, ProducerEntry] = {}
        self._ongoing: dict[int, int] = {}  # first offset of an open transaction -> PID
        # completed transactions whose marker is not yet below the high watermark:
        # first offset -> (PID, marker offset). They still hold the LSO back (as in Kafka).
        self._unreplicated: dict[int, tuple[int, int]] = {}
        self._end_offset = 0  # exclusive: the state reflects exactly the log below this offset
        self._version = 0  # bumped by every change (commit, expiry, load): stale plans fail

    # --- append ---

    def prepare(self, batches: Sequence[BatchHeaderLike], *,
                origin: AppendOrigin = AppendOrigin.CLIENT, marker: EndTxnMarker | None = None,
                transaction_version: int = 0) -> AppendPlan | Duplicate | Rejected:
        """Validate all batches of one append without changing anything.

        Pass every batch, also those without a producer id: they take offsets too. A control
        batch (written by the coordinator) is appended alone, with its decoded `marker`.
        """
        assert marker is None or len(batches) == 1, "a marker is appended alone"
        work: dict[int, ProducerEntry] = {}
        offset = self._end_offset  # provisional: validation does not depend on offsets
        for index, batch in enumerate(batches):
            if batch.producer_id > NO_PRODUCER_ID:
                outcome = self._check_one(work, index, batch, offset, origin, marker,
                                          transaction_version)
                if outcome is not None:
                    return outcome
            offset += _offsets_taken(batch)
        return AppendPlan(tuple(batches), origin, marker, transaction_version, self._version,
                          offset - self._end_offset)

    def _check_one(self, work: dict[int, ProducerEntry], index: int, batch: BatchHeaderLike,
                   offset: int, origin: AppendOrigin, marker: EndTxnMarker | None,
                   transaction_version: int) -> Duplicate | Rejected | None:
        pid = batch.producer_id
        committed = self._producers.get(pid)
        if origin is AppendOrigin.CLIENT:
            problem = _client_batch_problem(batch)
            if problem is not None:
                return Rejected(ErrorCode.invalid_record, index, problem)
            # Kafka looks for duplicates in the committed state only, batch by batch.
            last_seq = last_sequence(batch.base_sequence, batch.last_offset_delta)
            if committed is not None:
                cached = committed.find_duplicate(batch.producer_epoch, batch.base_sequence,
                                                  last_seq, transactional=batch.is_transactional)
                if cached is not None:
                    return Duplicate(cached.first_offset, cached.last_offset, cached.timestamp_ms)
        entry = work.get(pid) or committed or ProducerEntry(pid)
        try:
            step = _apply_batch(entry, batch, offset, batch.max_timestamp, origin, marker,
                                transaction_version)
        except _Reject as rejection:
            return Rejected(rejection.error_code, index, f"producer {pid}: {rejection}")
        work[pid] = step.entry
        return None

    def commit(self, plan: AppendPlan, first_offset: int, last_offset: int, *,
               log_append_time_ms: int | None = None) -> list[CompletedTxn]:
        """Apply a plan whose batches are now in the log at [first_offset, last_offset].

        `log_append_time_ms` replaces the batches' timestamps on LogAppendTime topics.
        Returns the transactions the append completed (for the aborted-transaction index).
        """
        assert plan.state_version == self._version, "producer state changed since prepare"
        assert last_offset - first_offset + 1 == plan.offset_count, "offsets do not match plan"
        assert first_offset >= self._end_offset, "appends must be monotonic"
        completed: list[CompletedTxn] = []
        offset = first_offset
        for batch in plan.batches:
            if batch.producer_id > NO_PRODUCER_ID:
                timestamp_ms = batch.max_timestamp if log_append_time_ms is None \
                    else log_append_time_ms
                txn = self._commit_one(plan, batch, offset, timestamp_ms)
                if txn is not None:
                    completed.append(txn)
            offset += _offsets_taken(batch)
        self._end_offset = last_offset + 1
        self._version += 1
        return completed

    def _commit_one(self, plan: AppendPlan, batch: BatchHeaderLike, offset: int,
                    timestamp_ms: int) -> CompletedTxn | None:
        pid = batch.producer_id
        entry = self._producers.get(pid) or ProducerEntry(pid)
        try:
            step = _apply_batch(entry, batch, offset, timestamp_ms, plan.origin, plan.marker,
                                plan.transaction_version)
        except _Reject as rejection:  # prepare accepted this very transition
            raise AssertionError(f"commit disagrees with prepare: {rejection}") from rejection
        self._producers[pid] = step.entry
        if step.started_txn:
            assert offset not in self._ongoing, "two transactions start at one offset"
            self._ongoing[offset] = pid
        if step.completed is None:
            return None
        txn_first_offset, marker_offset, aborted = step.completed
        owner = self._ongoing.pop(txn_first_offset, None)
        assert owner == pid, f"completed transaction at {txn_first_offset} was not open"
        self._unreplicated[txn_first_offset] = (pid, marker_offset)
        return CompletedTxn(pid, txn_first_offset, marker_offset, aborted,
                            self._last_stable_offset(pid, marker_offset))

    def _last_stable_offset(self, pid: int, marker_offset: int) -> int:
        """The LSO once `pid`'s transaction is complete: the next open one of another PID."""
        others = [first for first, owner in self._ongoing.items() if owner != pid]
        return min(others) if others else marker_offset + 1

    def replay(self, batch: BatchHeaderLike, first_offset: int,
               marker: EndTxnMarker | None = None) -> list[CompletedTxn]:
        """Rebuild from the log: one stored batch at its offset, through prepare and commit."""
        outcome = self.prepare([batch], origin=AppendOrigin.REPLICATION, marker=marker)
        if not isinstance(outcome, AppendPlan):
            raise RuntimeError(f"log batch at offset {first_offset} cannot be replayed: {outcome}")
        return self.commit(outcome, first_offset, first_offset + batch.last_offset_delta)

    # --- transactions ---

    def first_undecided_offset(self) -> int | None:
        """The first offset of the earliest open transaction, None if there is none."""
        return min(self._ongoing) if self._ongoing else None

    def first_unstable_offset(self) -> int | None:
        """Like `first_undecided_offset`, but a transaction counts until its marker is below
        the high watermark (Kafka's definition, which the LSO is computed from)."""
        firsts = [*self._ongoing, *self._unreplicated]
        return min(firsts) if firsts else None

    def on_high_watermark_updated(self, high_watermark: int) -> None:
        """Completed transactions whose marker is below the high watermark (exclusive) are
        stable. Call it after commit and after recovery, whenever the high watermark moves."""
        for first, (_, marker_offset) in list(self._unreplicated.items()):
            if marker_offset < high_watermark:
                del self._unreplicated[first]

    def has_ongoing_transaction(self, producer_id: int, producer_epoch: int) -> bool:
        entry = self._producers.get(producer_id)
        return (entry is not None and entry.producer_epoch == producer_epoch
                and entry.current_txn_first_offset is not None)

    # --- inspection and expiry ---

    @property
    def end_offset(self) -> int:
        return self._end_offset

    def last_entry(self, producer_id: int) -> ProducerEntry | None:
        return self._producers.get(producer_id)

    def entries(self) -> dict[int, ProducerEntry]:
        return dict(self._producers)

    def describe(self) -> list[ProducerDescription]:
        return [ProducerDescription(e.producer_id, e.producer_epoch, e.last_seq,
                                    e.last_timestamp_ms, e.coordinator_epoch,
                                    _or_minus_one(e.current_txn_first_offset))
                for e in sorted(self._producers.values(), key=lambda e: e.producer_id)]

    def remove_expired(self, now_ms: int,
                       producer_id_expiration_ms: int = PRODUCER_ID_EXPIRATION_MS_DEFAULT,
                       ) -> list[int]:
        """Forget PIDs idle for the expiration; returns them. As in Kafka, idle time counts
        from the last batch's max timestamp, and a PID with an open transaction stays."""
        expired = [pid for pid, e in self._producers.items()
                   if _is_expired(e, now_ms, producer_id_expiration_ms)]
        for pid in expired:
            del self._producers[pid]
        if expired:
            self._version += 1
        return expired

    # --- snapshots ---

    def write_snapshot(self, directory: Path, offset: int, *, fsync: bool = True) -> Path:
        """Write the state as of `offset` (exclusive; normally the log end offset) and keep only
        the newest SNAPSHOTS_RETAINED snapshots."""
        assert offset >= self._end_offset, "the state holds batches at or above the offset"
        data = encode_snapshot(offset, self._producers.values())
        assert decode_snapshot(data) == (offset, sorted(self._producers.values(),
                                                        key=lambda e: e.producer_id))
        path = directory / f"{offset:020d}{SNAPSHOT_SUFFIX}"
        _write_atomically(path, data, fsync)
        assert path.stat().st_size == len(data), "snapshot size differs after write"
        for old in _snapshot_files(directory)[:-SNAPSHOTS_RETAINED]:
            old.unlink(missing_ok=True)
        return path

    def load_latest_snapshot(self, directory: Path, *, log_start_offset: int,
                             log_end_offset: int, now_ms: int,
                             producer_id_expiration_ms: int = PRODUCER_ID_EXPIRATION_MS_DEFAULT,
                             names: list[str] | None = None) -> int:
        """Restore the newest valid snapshot in [log_start_offset, log_end_offset]; returns the
        offset from which the caller must `replay` the log. Deletes snapshots above the log end
        (the log was truncated), below the log start, corrupt ones and stray temporary files.
        `names`: the directory's listing if the caller just made it (the log's open)."""
        assert not self._producers and self._end_offset == 0, "load into an empty manager"
        if names is None:
            names = os.listdir(directory)  # one listing for both
        for name in names:
            if name.endswith(SNAPSHOT_TMP_SUFFIX):
                (directory / name).unlink(missing_ok=True)
        for path in reversed(_snapshot_files(directory, names)):
            offset = int(path.name.removesuffix(SNAPSHOT_SUFFIX))
            if not log_start_offset <= offset <= log_end_offset:
                path.unlink(missing_ok=True)
                continue
            try:
                stored_offset, entries = decode_snapshot(path.read_bytes())
                if stored_offset != offset:
                    raise CorruptSnapshot(f"{path.name} holds offset {stored_offset}")
            except CorruptSnapshot:
                path.unlink(missing_ok=True)
                continue
            self._restore(offset, entries, now_ms, producer_id_expiration_ms)
            return offset
        self._end_offset = log_start_offset
        return log_start_offset

    def _restore(self, offset: int, entries: list[ProducerEntry], now_ms: int,
                 expiration_ms: int) -> None:
        for entry in entries:
            if _is_expired(entry, now_ms, expiration_ms):
                continue
            self._producers[entry.producer_id] = entry
            if entry.current_txn_first_offset is not None:
                self._ongoing[entry.current_txn_first_offset] = entry.producer_id
        self._end_offset = offset
        self._version += 1


def _or_minus_one(offset: int | None) -> int:
    return -1 if offset is None else offset


def _is_expired(entry: ProducerEntry, now_ms: int, expiration_ms: int) -> bool:
    return (entry.current_txn_first_offset is None
            and now_ms - entry.last_timestamp_ms >= expiration_ms)


# --- snapshot files --------------------------------------------------------------------------


def encode_snapshot(offset: int, entries: Iterable[ProducerEntry]) -> bytes:
    ordered = sorted(entries, key=lambda e: e.producer_id)
    parts = [_BODY_HEAD.pack(offset, len(ordered))]
    for e in ordered:
        assert len(e.batches) <= BATCHES_RETAINED
        parts.append(_ENTRY.pack(e.producer_id, e.producer_epoch, e.coordinator_epoch,
                                 e.last_timestamp_ms, _or_minus_one(e.current_txn_first_offset),
                                 len(e.batches)))
        parts.extend(_BATCH.pack(b.first_seq, b.last_seq, b.first_offset, b.last_offset,
                                 b.timestamp_ms) for b in e.batches)
    body = b"".join(parts)
    return _PREFIX.pack(SNAPSHOT_MAGIC, SNAPSHOT_VERSION, crc32c.crc32c(body)) + body


def decode_snapshot(data: bytes) -> tuple[int, list[ProducerEntry]]:
    """(offset, entries sorted by PID); raises CorruptSnapshot, never reads past `data`."""
    if len(data) < _PREFIX.size + _BODY_HEAD.size:
        raise CorruptSnapshot("snapshot too short")
    magic, version, crc = _PREFIX.unpack_from(data)
    if magic != SNAPSHOT_MAGIC or version != SNAPSHOT_VERSION:
        raise CorruptSnapshot(f"unknown snapshot format {magic!r} v{version}")
    if crc32c.crc32c(data[_PREFIX.size:]) != crc:
        raise CorruptSnapshot("snapshot CRC mismatch")
    offset, count = _BODY_HEAD.unpack_from(data, _PREFIX.size)
    position = _PREFIX.size + _BODY_HEAD.size
    if count * _ENTRY.size > len(data) - position:
        raise CorruptSnapshot(f"entry count {count} exceeds the file")
    entries = []
    for _ in range(count):
        entry, position = _decode_entry(data, position)
        entries.append(entry)
    if position != len(data):
        raise CorruptSnapshot("trailing bytes after the last entry")
    return offset, entries


def _decode_entry(data: bytes, position: int) -> tuple[ProducerEntry, int]:
    if position + _ENTRY.size > len(data):
        raise CorruptSnapshot("truncated entry")
    pid, epoch, coordinator_epoch, last_ts, txn, batch_count = _ENTRY.unpack_from(data, position)
    position += _ENTRY.size
    if batch_count > BATCHES_RETAINED or position + batch_count * _BATCH.size > len(data):
        raise CorruptSnapshot(f"bad batch count {batch_count} for producer {pid}")
    batches = []
    for _ in range(batch_count):
        batches.append(BatchMetadata(*_BATCH.unpack_from(data, position)))
        position += _BATCH.size
    entry = ProducerEntry(pid, epoch, tuple(batches), coordinator_epoch, last_ts,
                          None if txn < 0 else txn)
    return entry, position


def _snapshot_files(directory: Path, names: list[str] | None = None) -> list[Path]:
    """Snapshot files, oldest first; names that are not `<digits>.snapshot` are ignored.
    `names`: the directory's listing, if the caller has it."""
    found = sorted((int(stem), name)
                   for name in (os.listdir(directory) if names is None else names)
                   if name.endswith(SNAPSHOT_SUFFIX)
                   and (stem := name.removesuffix(SNAPSHOT_SUFFIX)).isdigit())
    return [directory / name for _, name in found]


def _write_atomically(path: Path, data: bytes, fsync: bool) -> None:
    """The old or the new snapshot, never half (layout.replace_file)."""
    tmp = path.with_name(path.name.removesuffix(SNAPSHOT_SUFFIX) + SNAPSHOT_TMP_SUFFIX)
    replace_file(path, data, fsync, tmp)
