"""Producer state of one partition: every broker rule with exact expectations, snapshots,
recovery by replay, expiry, and a Hypothesis run against a simple reference model."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from onceflow.protocol.records import (
    SimpleRecord,
    build_batch,
    build_control_batch,
    end_txn_marker,
    iter_batches,
)
from onceflow.storage.producer_state import (
    BATCHES_RETAINED,
    SEQUENCE_MAX,
    AppendOrigin,
    AppendPlan,
    BatchFields,
    CompletedTxn,
    CorruptSnapshot,
    Duplicate,
    EndTxnMarker,
    ProducerDescription,
    ProducerStateManager,
    Rejected,
    decode_snapshot,
    encode_snapshot,
)

PID = 7000
OTHER = 7001
DAY_MS = 86_400_000


def data(pid: int = PID, epoch: int = 0, seq: int = 0, count: int = 1, ts: int = 1_000,
         txn: bool = False) -> BatchFields:
    return BatchFields(pid, epoch, seq, count - 1, ts, txn, False)


def plain(count: int = 1) -> BatchFields:
    """A batch of a non-idempotent producer: takes offsets, has no producer state."""
    return BatchFields(-1, -1, -1, count - 1, 1_000, False, False)


@dataclass
class Appended:
    first_offset: int
    last_offset: int
    completed: list[CompletedTxn]


@dataclass
class FakeLog:
    """Stands in for PartitionLog: assigns offsets, keeps what was appended for replay."""

    manager: ProducerStateManager = field(default_factory=ProducerStateManager)
    log_end_offset: int = 0
    stored: list[tuple[int, BatchFields, EndTxnMarker | None]] = field(default_factory=list)

    def append(self, *batches: BatchFields, origin: AppendOrigin = AppendOrigin.CLIENT,
               marker: EndTxnMarker | None = None, transaction_version: int = 0,
               log_append_time_ms: int | None = None) -> Appended | Duplicate | Rejected:
        outcome = self.manager.prepare(batches, origin=origin, marker=marker,
                                       transaction_version=transaction_version)
        if not isinstance(outcome, AppendPlan):
            return outcome
        first = self.log_end_offset
        offset = first
        for batch in batches:
            if log_append_time_ms is not None:
                batch = batch._replace(max_timestamp=log_append_time_ms)
            self.stored.append((offset, batch, marker))
            offset += batch.last_offset_delta + 1
        self.log_end_offset = offset
        completed = self.manager.commit(outcome, first, offset - 1,
                                        log_append_time_ms=log_append_time_ms)
        return Appended(first, offset - 1, completed)

    def marker(self, pid: int, epoch: int, *, aborted: bool, coordinator_epoch: int = 0,
               ts: int = 2_000, transaction_version: int = 0) -> Appended | Duplicate | Rejected:
        control = BatchFields(pid, epoch, -1, 0, ts, True, True)
        return self.append(control, origin=AppendOrigin.COORDINATOR,
                           marker=EndTxnMarker(not aborted, coordinator_epoch),
                           transaction_version=transaction_version)

    def replayed(self, manager: ProducerStateManager | None = None,
                 from_offset: int = 0) -> ProducerStateManager:
        rebuilt = manager or ProducerStateManager()
        for offset, batch, marker in self.stored:
            if offset >= from_offset:
                rebuilt.replay(batch, offset, marker)
        return rebuilt


def state_of(m: ProducerStateManager) -> tuple:
    return (m.entries(), m.end_offset, m.first_undecided_offset(), m.first_unstable_offset(),
            m.describe())


def rejected(outcome: object, code: ErrorCode) -> bool:
    return isinstance(outcome, Rejected) and outcome.error_code == code


# --- sequences and duplicates --------------------------------------------------------------


def test_in_sequence_batches_are_appended_at_consecutive_offsets() -> None:
    log = FakeLog()
    assert log.append(data(seq=0, count=3)) == Appended(0, 2, [])
    assert log.append(plain(2)) == Appended(3, 4, [])
    assert log.append(data(seq=3, count=1)) == Appended(5, 5, [])
    assert log.manager.last_entry(PID).last_seq == 3


@pytest.mark.parametrize("first_sequence", [0, 1, 42, SEQUENCE_MAX])
def test_unknown_producer_is_accepted_at_any_sequence(first_sequence: int) -> None:
    # KIP-360: no UNKNOWN_PRODUCER_ID for a PID without state (e.g. after expiry)
    log = FakeLog()
    assert isinstance(log.append(data(seq=first_sequence)), Appended)


@pytest.mark.parametrize("cached_index", range(BATCHES_RETAINED))
def test_duplicate_of_each_cached_batch_returns_its_original_offsets(cached_index: int) -> None:
    log = FakeLog()
    originals = []
    for i in range(BATCHES_RETAINED):
        log.append(plain(i + 1))  # other producers' batches between ours
        originals.append((data(seq=3 * i, count=3, ts=5_000 + i), log.append(
            data(seq=3 * i, count=3, ts=5_000 + i))))
    before = state_of(log.manager)
    leo = log.log_end_offset
    retry, appended = originals[cached_index]
    outcome = log.append(retry)
    assert outcome == Duplicate(appended.first_offset, appended.last_offset, 5_000 + cached_index)
    assert log.log_end_offset == leo and state_of(log.manager) == before


def test_retry_six_batches_old_is_out_of_order() -> None:
    log = FakeLog()
    for i in range(BATCHES_RETAINED + 1):
        log.append(data(seq=i))
    before = state_of(log.manager)
    assert rejected(log.append(data(seq=0)), ErrorCode.out_of_order_sequence_number)
    assert isinstance(log.append(data(seq=1)), Duplicate)  # the oldest still cached
    assert state_of(log.manager) == before


def test_gap_is_out_of_order_and_changes_nothing() -> None:
    log = FakeLog()
    log.append(data(seq=0, count=5))
    before, leo = state_of(log.manager), log.log_end_offset
    outcome = log.append(data(seq=6))
    assert rejected(outcome, ErrorCode.out_of_order_sequence_number)
    assert outcome.batch_index == 0
    assert state_of(log.manager) == before and log.log_end_offset == leo
    assert isinstance(log.append(data(seq=5)), Appended)


def test_partial_overlap_with_a_cached_batch_is_out_of_order() -> None:
    log = FakeLog()
    log.append(data(seq=0, count=4))
    assert rejected(log.append(data(seq=0, count=2)), ErrorCode.out_of_order_sequence_number)


def test_sequence_wraps_after_int32_max() -> None:
    log = FakeLog()
    assert isinstance(log.append(data(seq=SEQUENCE_MAX - 1, count=2)), Appended)
    assert log.manager.last_entry(PID).last_seq == SEQUENCE_MAX
    assert isinstance(log.append(data(seq=0, count=3)), Appended)
    assert rejected(log.append(data(seq=SEQUENCE_MAX)), ErrorCode.out_of_order_sequence_number)


def test_batch_spanning_the_wrap_has_last_sequence_after_zero() -> None:
    log = FakeLog()
    spanning = log.append(data(seq=SEQUENCE_MAX - 1, count=4))  # MAX-1, MAX, 0, 1
    assert log.manager.last_entry(PID).last_seq == 1
    assert log.append(data(seq=SEQUENCE_MAX - 1, count=4)) == Duplicate(
        spanning.first_offset, spanning.last_offset, 1_000)
    assert isinstance(log.append(data(seq=2)), Appended)


# --- epochs ---------------------------------------------------------------------------------


def test_older_epoch_is_rejected_with_invalid_producer_epoch() -> None:
    # Produce answers INVALID_PRODUCER_EPOCH (47) in every version, also for transactional
    # producers: Kafka >= 2.7 never puts PRODUCER_FENCED (90) in a Produce response.
    log = FakeLog()
    log.append(data(epoch=3, seq=0))
    before = state_of(log.manager)
    assert rejected(log.append(data(epoch=2, seq=1)), ErrorCode.invalid_producer_epoch)
    assert rejected(log.append(data(epoch=2, seq=0, txn=True)), ErrorCode.invalid_producer_epoch)
    assert state_of(log.manager) == before


def test_new_epoch_must_start_at_sequence_zero() -> None:
    log = FakeLog()
    log.append(data(epoch=0, seq=0, count=10))
    assert rejected(log.append(data(epoch=1, seq=10)), ErrorCode.out_of_order_sequence_number)
    assert isinstance(log.append(data(epoch=1, seq=0)), Appended)
    entry = log.manager.last_entry(PID)
    assert entry.producer_epoch == 1 and len(entry.batches) == 1  # the old epoch's cache is gone


def test_retry_from_before_an_epoch_bump_is_fenced_not_a_duplicate() -> None:
    log = FakeLog()
    log.append(data(epoch=0, seq=0))
    log.append(data(epoch=1, seq=0))
    assert rejected(log.append(data(epoch=0, seq=0)), ErrorCode.invalid_producer_epoch)


# --- several batches in one append ------------------------------------------------------------


def test_several_batches_of_one_producer_each_follow_the_previous() -> None:
    log = FakeLog()
    outcome = log.append(data(seq=0, count=2), plain(3), data(seq=2, count=3),
                         data(pid=OTHER, seq=9))
    assert outcome == Appended(0, 8, [])
    assert log.manager.last_entry(PID).last_seq == 4
    assert [b.first_offset for b in log.manager.last_entry(PID).batches] == [0, 5]
    assert log.manager.last_entry(OTHER).batches[0].first_offset == 8


def test_one_bad_batch_rejects_the_whole_append() -> None:
    log = FakeLog()
    log.append(data(seq=0))
    before, leo = state_of(log.manager), log.log_end_offset
    outcome = log.append(data(seq=1), data(seq=3))
    assert rejected(outcome, ErrorCode.out_of_order_sequence_number)
    assert outcome.batch_index == 1
    assert state_of(log.manager) == before and log.log_end_offset == leo


def test_unknown_producer_second_batch_must_follow_first() -> None:
    log = FakeLog()
    assert rejected(log.append(data(seq=10), data(seq=12)),
                    ErrorCode.out_of_order_sequence_number)
    assert isinstance(log.append(data(seq=10), data(seq=11)), Appended)


def test_duplicate_anywhere_in_an_append_answers_for_the_whole_append() -> None:
    # Kafka stops at the first batch that duplicates a cached one and appends nothing.
    log = FakeLog()
    first = log.append(data(seq=0))
    leo = log.log_end_offset
    assert log.append(data(pid=OTHER, seq=0), data(seq=0)) == Duplicate(0, 0, 1_000)
    assert log.log_end_offset == leo and log.manager.last_entry(OTHER) is None
    assert first == Appended(0, 0, [])


# --- prepare does not mutate; commit checks its plan ------------------------------------------


def test_prepare_mutates_nothing() -> None:
    log = FakeLog()
    log.append(data(seq=0, count=2, txn=True))
    log.append(data(pid=OTHER, seq=0))
    before = state_of(log.manager)
    entry_before = log.manager.last_entry(PID)
    for batches in ([data(seq=2)], [data(seq=2, txn=True)], [data(epoch=1, seq=0)],
                    [data(seq=5)], [data(seq=0, count=2)], [data(pid=OTHER, seq=1), plain()],
                    [data(pid=9999, seq=4, txn=True)]):
        log.manager.prepare(batches)
        assert state_of(log.manager) == before
    log.manager.prepare([BatchFields(PID, 0, -1, 0, 5, True, True)],
                        origin=AppendOrigin.COORDINATOR, marker=EndTxnMarker(True, 0))
    assert state_of(log.manager) == before
    assert log.manager.last_entry(PID) is entry_before


def test_commit_of_a_stale_plan_is_refused() -> None:
    m = ProducerStateManager()
    plan = m.prepare([data(seq=0)])
    other = m.prepare([data(pid=OTHER, seq=0)])
    m.commit(plan, 0, 0)
    with pytest.raises(AssertionError):
        m.commit(other, 1, 1)


def test_commit_checks_the_offsets_match_the_plan() -> None:
    m = ProducerStateManager()
    plan = m.prepare([data(seq=0, count=3)])
    with pytest.raises(AssertionError):
        m.commit(plan, 0, 1)


def test_log_append_time_is_the_cached_timestamp() -> None:
    log = FakeLog()
    log.append(data(seq=0, ts=1_000), log_append_time_ms=99_000)
    assert log.append(data(seq=0, ts=1_000)) == Duplicate(0, 0, 99_000)


def test_client_control_batch_and_negative_sequence_are_invalid_records() -> None:
    log = FakeLog()
    control = BatchFields(PID, 0, 0, 0, 1_000, True, True)
    assert rejected(log.append(control), ErrorCode.invalid_record)
    assert rejected(log.append(data(seq=-5)), ErrorCode.invalid_record)


def test_coordinator_writes_skip_sequence_checks() -> None:
    log = FakeLog()
    log.append(data(seq=0))
    no_seq = BatchFields(PID, 0, -1, 0, 1_000, True, False)  # e.g. a TxnOffsetCommit record
    assert isinstance(log.append(no_seq, origin=AppendOrigin.COORDINATOR), Appended)
    assert rejected(log.append(BatchFields(PID, -1, -1, 0, 1, True, False),
                               origin=AppendOrigin.COORDINATOR), ErrorCode.invalid_producer_epoch)


def test_real_batch_headers_drive_prepare_commit_and_replay() -> None:
    """protocol.records.BatchHeader is a BatchHeaderLike; markers come from end_txn_marker."""
    records = [SimpleRecord(b"k", b"v", timestamp_ms=t) for t in (10, 30, 20)]
    blob = build_batch(records, producer_id=PID, producer_epoch=2, base_sequence=SEQUENCE_MAX,
                       transactional=True)
    ((header, _),) = iter_batches(blob)
    m = ProducerStateManager()
    plan = m.prepare([header])
    assert isinstance(plan, AppendPlan) and plan.offset_count == 3
    assert m.commit(plan, 100, 102) == []
    assert m.last_entry(PID).batches[0].last_seq == 1 and m.first_undecided_offset() == 100
    assert m.prepare([header]) == Duplicate(100, 102, 30)
    control_blob = build_control_batch(producer_id=PID, producer_epoch=2, commit=False,
                                       coordinator_epoch=4, timestamp_ms=40)
    ((control, batch),) = iter_batches(control_blob)
    marker = end_txn_marker(batch)
    assert m.prepare([control]).error_code == ErrorCode.invalid_record  # not from clients
    plan = m.prepare([control], origin=AppendOrigin.COORDINATOR, marker=marker)
    assert m.commit(plan, 103, 103) == [CompletedTxn(PID, 100, 103, True, 104)]
    rebuilt = ProducerStateManager()
    rebuilt.replay(header, 100)
    assert rebuilt.replay(control, 103, marker) == [CompletedTxn(PID, 100, 103, True, 104)]
    assert rebuilt.entries() == m.entries()


# --- transactions ---------------------------------------------------------------------------


def test_transaction_open_and_commit_moves_the_unstable_offset() -> None:
    log = FakeLog()
    log.append(plain(2))  # offsets 0-1
    log.append(data(seq=0, count=2, txn=True))  # 2-3 opens PID's transaction at 2
    log.append(data(pid=OTHER, seq=0, txn=True))  # 4 opens OTHER's at 4
    log.append(data(seq=2, txn=True))  # 5 inside the open transaction
    m = log.manager
    assert m.first_undecided_offset() == 2 and m.first_unstable_offset() == 2
    assert m.has_ongoing_transaction(PID, 0) and not m.has_ongoing_transaction(PID, 1)
    assert log.marker(PID, 0, aborted=False, coordinator_epoch=3) == Appended(
        6, 6, [CompletedTxn(PID, 2, 6, False, 4)])  # LSO: OTHER's open transaction at 4
    assert m.first_undecided_offset() == 4
    assert m.first_unstable_offset() == 2  # the marker is not yet below the high watermark
    m.on_high_watermark_updated(7)
    assert m.first_unstable_offset() == 4
    assert log.marker(OTHER, 0, aborted=True) == Appended(
        7, 7, [CompletedTxn(OTHER, 4, 7, True, 8)])
    m.on_high_watermark_updated(8)
    assert m.first_unstable_offset() is None and m.first_undecided_offset() is None
    entry = m.last_entry(PID)
    assert entry.current_txn_first_offset is None and entry.coordinator_epoch == 3
    assert isinstance(log.append(data(seq=3)), Appended)  # idempotent again after the marker


def test_non_transactional_batch_during_a_transaction_is_invalid_txn_state() -> None:
    log = FakeLog()
    log.append(data(seq=0, txn=True))
    before = state_of(log.manager)
    assert rejected(log.append(data(seq=1)), ErrorCode.invalid_txn_state)
    assert state_of(log.manager) == before


def test_marker_without_data_completes_nothing() -> None:
    log = FakeLog()
    outcome = log.marker(PID, 0, aborted=True, coordinator_epoch=1)
    assert outcome == Appended(0, 0, [])
    assert log.manager.last_entry(PID).coordinator_epoch == 1


def test_marker_from_an_older_coordinator_is_fenced() -> None:
    log = FakeLog()
    log.append(data(seq=0, txn=True))
    log.marker(PID, 0, aborted=False, coordinator_epoch=5)
    log.append(data(seq=1, txn=True))
    before = state_of(log.manager)
    assert rejected(log.marker(PID, 0, aborted=False, coordinator_epoch=4),
                    ErrorCode.transaction_coordinator_fenced)
    assert state_of(log.manager) == before


def test_marker_with_an_older_producer_epoch_is_rejected() -> None:
    log = FakeLog()
    log.append(data(epoch=2, seq=0, txn=True))
    assert rejected(log.marker(PID, 1, aborted=True), ErrorCode.invalid_producer_epoch)
    assert isinstance(log.marker(PID, 2, aborted=True), Appended)


def test_bumped_marker_epoch_clears_the_batch_cache() -> None:
    # TV2: the coordinator bumps the epoch before writing the marker
    log = FakeLog()
    log.append(data(epoch=2, seq=0, txn=True))
    assert rejected(log.marker(PID, 2, aborted=False, transaction_version=2),
                    ErrorCode.invalid_producer_epoch)
    assert isinstance(log.marker(PID, 3, aborted=False, transaction_version=2), Appended)
    assert log.manager.last_entry(PID).batches == ()
    # a retried TV2 marker (same epoch, transaction already closed) is accepted
    assert log.marker(PID, 3, aborted=False, transaction_version=2) == Appended(2, 2, [])
    assert rejected(log.append(data(epoch=3, seq=1, txn=True)),
                    ErrorCode.out_of_order_sequence_number)
    assert isinstance(log.append(data(epoch=3, seq=0, txn=True)), Appended)


def test_retry_within_the_open_transaction_is_a_duplicate() -> None:
    log = FakeLog()
    log.append(data(seq=0, txn=True))
    log.marker(PID, 0, aborted=False)
    first = log.append(data(seq=1, count=2, txn=True))  # the next transaction, still open
    assert log.append(data(seq=1, count=2, txn=True)) == Duplicate(
        first.first_offset, first.last_offset, 1_000)


@pytest.mark.parametrize("aborted", [True, False])
def test_sequence_of_an_ended_transaction_is_never_a_duplicate(aborted: bool) -> None:
    # Issue 11: librdkafka purges an in-flight batch on abort and sends the next
    # transaction's first batch with the same epoch and sequence. Taking it for a retry would
    # acknowledge a record that is never written.
    log = FakeLog()
    log.append(data(seq=0, txn=True))  # c0, committed
    log.marker(PID, 0, aborted=False)
    a1 = log.append(data(seq=1, txn=True))  # performed, its answer lost
    log.marker(PID, 0, aborted=aborted)
    end = log.log_end_offset
    b1 = log.append(data(seq=1, txn=True))
    assert rejected(b1, ErrorCode.unknown_producer_id), b1
    assert f"offset {a1.first_offset}" in b1.message
    assert log.log_end_offset == end and log.manager.first_undecided_offset() is None
    # after the client's epoch bump the next transaction starts at sequence 0 and commits
    assert isinstance(log.append(data(epoch=1, seq=0, txn=True)), Appended)


def test_idempotent_retry_after_a_transaction_is_still_a_duplicate() -> None:
    # only transactional batches are confined to the open transaction
    log = FakeLog()
    first = log.append(data(seq=0))
    assert log.append(data(seq=0)) == Duplicate(first.first_offset, first.last_offset, 1_000)


def test_ended_transaction_is_recognised_after_a_restart(tmp_path: Path) -> None:
    log = FakeLog()
    log.append(data(seq=0, txn=True))
    log.marker(PID, 0, aborted=True)
    log.manager.write_snapshot(tmp_path, log.log_end_offset)
    restarted = FakeLog(log_end_offset=log.log_end_offset)
    restarted.manager.load_latest_snapshot(tmp_path, log_start_offset=0,
                                           log_end_offset=log.log_end_offset, now_ms=2_000)
    assert rejected(restarted.append(data(seq=0, txn=True)), ErrorCode.unknown_producer_id)
    assert rejected(log.replayed().prepare([data(seq=0, txn=True)]),
                    ErrorCode.unknown_producer_id)


# --- describe and expiry ----------------------------------------------------------------------


def test_describe_lists_each_producer() -> None:
    log = FakeLog()
    log.append(data(pid=OTHER, epoch=1, seq=0, count=4, ts=3_000))
    log.append(data(seq=0, txn=True, ts=4_000))
    assert log.manager.describe() == [
        ProducerDescription(PID, 0, 0, 4_000, -1, 4),
        ProducerDescription(OTHER, 1, 3, 3_000, -1, -1),
    ]


def test_idle_producers_expire_but_not_with_an_open_transaction() -> None:
    log = FakeLog()
    log.append(data(seq=0, ts=10_000))
    log.append(data(pid=OTHER, seq=0, ts=10_000, txn=True))
    m = log.manager
    assert m.remove_expired(now_ms=10_000 + DAY_MS - 1) == []
    assert m.remove_expired(now_ms=10_000 + DAY_MS) == [PID]
    assert m.last_entry(PID) is None and m.last_entry(OTHER) is not None
    assert m.remove_expired(now_ms=10_000 + 100 * DAY_MS) == []
    # an expired producer is unknown again: its next batch is accepted at any sequence
    assert isinstance(log.append(data(seq=77)), Appended)


def test_expiration_is_a_parameter() -> None:
    log = FakeLog()
    log.append(data(seq=0, ts=0))
    assert log.manager.remove_expired(now_ms=500, producer_id_expiration_ms=1_000) == []
    assert log.manager.remove_expired(now_ms=1_000, producer_id_expiration_ms=1_000) == [PID]


# --- recovery: replay and snapshots --------------------------------------------------------------


def busy_log() -> FakeLog:
    log = FakeLog()
    for i in range(8):
        log.append(data(seq=2 * i, count=2, ts=1_000 + i))
        log.append(plain())
    log.append(data(pid=OTHER, epoch=4, seq=0, txn=True))
    log.append(data(pid=9, seq=0, txn=True))
    log.marker(9, 0, aborted=True, coordinator_epoch=2)
    log.append(data(pid=OTHER, epoch=4, seq=1, count=3, txn=True))
    return log


def test_replay_builds_the_same_state_as_commit() -> None:
    log = busy_log()
    rebuilt = log.replayed()
    rebuilt.on_high_watermark_updated(log.log_end_offset)
    log.manager.on_high_watermark_updated(log.log_end_offset)
    assert state_of(rebuilt) == state_of(log.manager)


def test_replay_accepts_what_the_log_holds_even_if_a_client_could_not() -> None:
    m = ProducerStateManager()
    m.replay(data(epoch=3, seq=0), 0)
    m.replay(data(epoch=2, seq=9), 1)  # the log is the truth
    assert m.last_entry(PID).producer_epoch == 2


def test_snapshot_round_trip_and_replay_after_it(tmp_path: Path) -> None:
    log = busy_log()
    snapshot_at = log.log_end_offset
    log.manager.write_snapshot(tmp_path, snapshot_at)
    log.append(data(seq=16, count=2))
    log.marker(OTHER, 4, aborted=False)
    restored = ProducerStateManager()
    start = restored.load_latest_snapshot(tmp_path, log_start_offset=0,
                                          log_end_offset=log.log_end_offset, now_ms=5_000)
    assert start == snapshot_at
    log.replayed(restored, from_offset=start)
    assert restored.entries() == log.manager.entries()
    assert restored.first_undecided_offset() == log.manager.first_undecided_offset()


def test_all_five_cached_batches_are_duplicates_after_a_restart(tmp_path: Path) -> None:
    log = FakeLog()
    appended = [log.append(data(seq=i, ts=1_000 + i)) for i in range(BATCHES_RETAINED)]
    log.manager.write_snapshot(tmp_path, log.log_end_offset)
    restarted = FakeLog(log_end_offset=log.log_end_offset)
    restarted.manager.load_latest_snapshot(tmp_path, log_start_offset=0,
                                           log_end_offset=log.log_end_offset, now_ms=2_000)
    for i, original in enumerate(appended):
        assert restarted.append(data(seq=i, ts=1_000 + i)) == Duplicate(
            original.first_offset, original.last_offset, 1_000 + i)


def test_only_the_last_two_snapshots_are_kept(tmp_path: Path) -> None:
    log = FakeLog()
    for i in range(4):
        log.append(data(seq=i))
        log.manager.write_snapshot(tmp_path, log.log_end_offset, fsync=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "00000000000000000003.snapshot", "00000000000000000004.snapshot"]


def test_corrupt_newest_snapshot_falls_back_to_the_older_one(tmp_path: Path) -> None:
    log = FakeLog()
    log.append(data(seq=0))
    older = log.manager.write_snapshot(tmp_path, 1)
    log.append(data(seq=1))
    newest = log.manager.write_snapshot(tmp_path, 2)
    raw = bytearray(newest.read_bytes())
    raw[-1] ^= 0x01
    newest.write_bytes(bytes(raw))
    restored = ProducerStateManager()
    assert restored.load_latest_snapshot(tmp_path, log_start_offset=0, log_end_offset=2,
                                         now_ms=0) == 1
    assert not newest.exists() and older.exists()
    assert restored.last_entry(PID).last_seq == 0


def test_snapshots_beyond_a_truncated_log_are_deleted(tmp_path: Path) -> None:
    log = FakeLog()
    log.append(data(seq=0))
    log.manager.write_snapshot(tmp_path, 1)
    log.append(data(seq=1))
    beyond = log.manager.write_snapshot(tmp_path, 2)
    (tmp_path / "00000000000000000002.snapshot.tmp").write_bytes(b"half")
    restored = ProducerStateManager()
    assert restored.load_latest_snapshot(tmp_path, log_start_offset=0, log_end_offset=1,
                                         now_ms=0) == 1
    assert not beyond.exists() and not (tmp_path / "00000000000000000002.snapshot.tmp").exists()


def test_no_usable_snapshot_means_replay_from_the_log_start(tmp_path: Path) -> None:
    log = FakeLog()
    log.append(data(seq=0))
    stale = log.manager.write_snapshot(tmp_path, 1)
    restored = ProducerStateManager()
    assert restored.load_latest_snapshot(tmp_path, log_start_offset=5, log_end_offset=9,
                                         now_ms=0) == 5
    assert restored.entries() == {} and restored.end_offset == 5 and not stale.exists()


def test_expired_producers_are_not_loaded(tmp_path: Path) -> None:
    log = FakeLog()
    log.append(data(seq=0, ts=0))
    log.append(data(pid=OTHER, seq=0, ts=0, txn=True))
    log.manager.write_snapshot(tmp_path, log.log_end_offset)
    restored = ProducerStateManager()
    restored.load_latest_snapshot(tmp_path, log_start_offset=0, log_end_offset=2, now_ms=DAY_MS)
    assert list(restored.entries()) == [OTHER]
    assert restored.first_undecided_offset() == 1


def test_snapshot_of_an_empty_state(tmp_path: Path) -> None:
    m = ProducerStateManager()
    m.write_snapshot(tmp_path, 0)
    assert decode_snapshot((tmp_path / "00000000000000000000.snapshot").read_bytes()) == (0, [])


@given(st.binary(max_size=300))
def test_decoding_garbage_only_raises_corrupt_snapshot(garbage: bytes) -> None:
    try:
        decode_snapshot(garbage)
    except CorruptSnapshot:
        pass


@given(st.data())
def test_any_damaged_byte_is_detected(drawn: st.DataObject) -> None:
    encoded = encode_snapshot(42, busy_log().manager.entries().values())
    index = drawn.draw(st.integers(0, len(encoded) - 1))
    flip = drawn.draw(st.integers(1, 255))
    damaged = bytearray(encoded)
    damaged[index] ^= flip
    with pytest.raises(CorruptSnapshot):
        decode_snapshot(bytes(damaged))


# --- random histories against a reference model -------------------------------------------------


@dataclass
class ModelProducer:
    """Everything a PID ever appended in its current epoch: no window, no cleverness."""

    epoch: int = -1
    appended: list[tuple[int, int, int, int, int]] = field(default_factory=list)
    txn_first_offset: int | None = None
    coordinator_epoch: int = -1

    def in_open_txn(self, first_offset: int) -> bool:
        return self.txn_first_offset is not None and first_offset >= self.txn_first_offset

    def copy(self) -> ModelProducer:
        return ModelProducer(self.epoch, list(self.appended), self.txn_first_offset,
                             self.coordinator_epoch)


def model_last_seq(first_seq: int, count: int) -> int:
    return (first_seq + count - 1) % (SEQUENCE_MAX + 1)


def model_data(producers: dict[int, ModelProducer], b: BatchFields, offset: int) -> object:
    """Apply one data batch to `producers`, or return the error code."""
    p = producers.get(b.producer_id)
    if p is not None:
        if b.producer_epoch < p.epoch:
            return ErrorCode.invalid_producer_epoch
        if b.producer_epoch > p.epoch and b.base_sequence != 0:
            return ErrorCode.out_of_order_sequence_number
        expected = (p.appended[-1][1] + 1) % (SEQUENCE_MAX + 1) if p.appended else 0
        if b.producer_epoch == p.epoch and b.base_sequence != expected:
            if b.is_transactional and any(
                    first_seq == b.base_sequence and not p.in_open_txn(first)
                    for first_seq, _, first, _, _ in p.appended[-BATCHES_RETAINED:]):
                return ErrorCode.unknown_producer_id  # reuses an ended transaction's sequence
            return ErrorCode.out_of_order_sequence_number
        if p.txn_first_offset is not None and not b.is_transactional:
            return ErrorCode.invalid_txn_state
    p = producers.setdefault(b.producer_id, ModelProducer())
    if b.producer_epoch != p.epoch:
        p.epoch, p.appended = b.producer_epoch, []
    count = b.last_offset_delta + 1
    p.appended.append((b.base_sequence, model_last_seq(b.base_sequence, count), offset,
                       offset + count - 1, b.max_timestamp))
    if b.is_transactional and p.txn_first_offset is None:
        p.txn_first_offset = offset
    return None


def model_append(producers: dict[int, ModelProducer], batches: list[BatchFields],
                 leo: int) -> object:
    """Batch by batch, as Kafka: a duplicate of the state *before* the append answers for the
    whole append; an invalid batch rejects it."""
    work = {pid: p.copy() for pid, p in producers.items()}
    offset = leo
    for b in batches:
        p = producers.get(b.producer_id)
        last_seq = model_last_seq(b.base_sequence, b.last_offset_delta + 1)
        if p is not None and p.epoch == b.producer_epoch:
            for first_seq, cached_last, first, last, ts in p.appended[-BATCHES_RETAINED:]:
                # a transactional batch only retries a batch of the open transaction
                if ((first_seq, cached_last) == (b.base_sequence, last_seq)
                        and (not b.is_transactional or p.in_open_txn(first))):
                    return Duplicate(first, last, ts)
        error = model_data(work, b, offset)
        if error is not None:
            return error
        offset += b.last_offset_delta + 1
    producers.clear()
    producers.update(work)
    return None


def model_marker(producers: dict[int, ModelProducer], pid: int, epoch: int,
                 coordinator_epoch: int) -> object:
    p = producers.get(pid, ModelProducer())
    if epoch < p.epoch:
        return ErrorCode.invalid_producer_epoch
    if coordinator_epoch < p.coordinator_epoch:
        return ErrorCode.transaction_coordinator_fenced
    if epoch != p.epoch:
        p.epoch, p.appended = epoch, []
    p.coordinator_epoch, p.txn_first_offset = coordinator_epoch, None
    producers[pid] = p
    return None


PIDS = [1, 2]
abstract_batch = st.tuples(
    st.sampled_from(PIDS),
    st.sampled_from(["same", "same", "same", "older", "newer"]),
    st.sampled_from(["next", "next", "next", "gap", "dup", "zero", "near_max"]),
    st.integers(1, BATCHES_RETAINED + 2),  # which cached batch a "dup" repeats
    st.integers(1, 3),  # records
    st.booleans(),  # transactional
)
abstract_op = st.one_of(
    st.tuples(st.just("append"), st.lists(abstract_batch, min_size=1, max_size=2)),
    st.tuples(st.just("marker"), st.sampled_from(PIDS), st.sampled_from(["same", "newer"]),
              st.integers(0, 3), st.booleans()),
    st.tuples(st.just("restart")),
)


def concrete_batch(producers: dict[int, ModelProducer], spec: tuple, ts: int) -> BatchFields:
    pid, epoch_kind, seq_kind, back, count, txn = spec
    p = producers.get(pid, ModelProducer(epoch=0))
    epoch = max(0, max(0, p.epoch) + {"same": 0, "older": -1, "newer": 1}[epoch_kind])
    next_seq = (p.appended[-1][1] + 1) % (SEQUENCE_MAX + 1) if p.appended else 0
    if seq_kind == "dup" and len(p.appended) >= back:
        first_seq, last_seq = p.appended[-back][:2]
        count = (last_seq - first_seq) % (SEQUENCE_MAX + 1) + 1
        return BatchFields(pid, epoch, first_seq, count - 1, ts, txn, False)
    seq = {"gap": next_seq + 1, "zero": 0, "near_max": SEQUENCE_MAX - 1}.get(seq_kind, next_seq)
    return BatchFields(pid, epoch, seq % (SEQUENCE_MAX + 1), count - 1, ts, txn, False)


def assert_matches_model(m: ProducerStateManager, producers: dict[int, ModelProducer]) -> None:
    assert sorted(m.entries()) == sorted(producers)
    for pid, p in producers.items():
        entry = m.last_entry(pid)
        cached = [(b.first_seq, b.last_seq, b.first_offset, b.last_offset, b.timestamp_ms)
                  for b in entry.batches]
        assert (entry.producer_epoch, cached, entry.current_txn_first_offset,
                entry.coordinator_epoch) == (p.epoch, p.appended[-BATCHES_RETAINED:],
                                             p.txn_first_offset, p.coordinator_epoch)
    open_txns = [p.txn_first_offset for p in producers.values() if p.txn_first_offset is not None]
    assert m.first_undecided_offset() == (min(open_txns) if open_txns else None)


@settings(max_examples=300, deadline=None)
@given(st.lists(abstract_op, max_size=40))
def test_random_histories_match_the_reference_model(tmp_path_factory, ops: list) -> None:
    log = FakeLog()
    producers: dict[int, ModelProducer] = {}
    snapshot_dir = tmp_path_factory.mktemp("snapshots")
    for ts, op in enumerate(ops, start=1_000):
        if op[0] == "restart":  # snapshot, "crash", reload, carry on with the new manager
            log.manager.write_snapshot(snapshot_dir, log.log_end_offset, fsync=False)
            log.manager = ProducerStateManager()
            log.manager.load_latest_snapshot(snapshot_dir, log_start_offset=0,
                                             log_end_offset=log.log_end_offset, now_ms=ts)
            event("restart")
        elif op[0] == "marker":
            _, pid, epoch_kind, coordinator_epoch, aborted = op
            epoch = max(0, producers.get(pid, ModelProducer()).epoch) + (epoch_kind == "newer")
            expected = model_marker(producers, pid, epoch, coordinator_epoch)
            outcome = log.marker(pid, epoch, aborted=aborted,
                                 coordinator_epoch=coordinator_epoch, ts=ts)
            event(f"marker: {type(outcome).__name__} {getattr(outcome, 'error_code', '')}")
            assert rejected(outcome, expected) if expected else isinstance(outcome, Appended)
        else:
            batches = [concrete_batch(producers, spec, ts) for spec in op[1]]
            leo = log.log_end_offset
            expected = model_append(producers, batches, leo)
            outcome = log.append(*batches)
            event(f"append: {type(outcome).__name__} {getattr(outcome, 'error_code', '')}")
            if isinstance(expected, Duplicate):
                assert outcome == expected and log.log_end_offset == leo
            elif expected is not None:
                assert rejected(outcome, expected) and log.log_end_offset == leo
            else:
                assert isinstance(outcome, Appended)
        assert_matches_model(log.manager, producers)
    assert log.replayed().entries() == log.manager.entries()
