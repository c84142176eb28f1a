"""AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, markers, and the fencing of old epochs."""

import pytest
from kio.schema.errors import ErrorCode

from onceflow.groups.records import partition_for as group_partition_for
from onceflow.txn import TopicPartition, TxnState
from tests.txn.harness import FakeBroker

E = ErrorCode
S = TxnState
A0, A1, B0 = ("a", 0), ("a", 1), ("b", 0)


def started(*partitions) -> tuple[FakeBroker, int]:
    b = FakeBroker()
    pid, _ = b.producer("tx")
    if partitions:
        assert b.add("tx", pid, 0, *partitions) is E.none
    return b, pid


def log_size(b: FakeBroker) -> int:
    return sum(len(log) for log in b.logs.values())


def test_add_partitions_starts_the_transaction_and_accumulates():
    b, pid = started()
    b.now_ms += 5
    assert b.add("tx", pid, 0, A0) is E.none
    meta = b.meta("tx")
    assert (meta.state, meta.partitions) == (S.ONGOING, {TopicPartition(*A0)})
    assert meta.txn_start_timestamp_ms == b.now_ms
    b.now_ms += 5
    assert b.add("tx", pid, 0, A1, B0) is E.none
    meta = b.meta("tx")
    assert meta.partitions == {TopicPartition(*tp) for tp in (A0, A1, B0)}
    assert meta.txn_start_timestamp_ms == b.now_ms - 5  # the transaction started earlier
    size = log_size(b)
    assert b.add("tx", pid, 0, A0, B0) is E.none  # all recorded: nothing written
    assert log_size(b) == size


def test_add_partitions_errors_in_kafkas_order():
    b, pid = started(A0)
    assert b.add("nope", pid, 0, A0) is E.invalid_producer_id_mapping
    assert b.add("tx", pid + 1, 0, A0) is E.invalid_producer_id_mapping
    assert b.add("tx", pid + 1, 9, A0) is E.invalid_producer_id_mapping  # pid checked first
    assert b.add("tx", pid, 1, A0) is E.producer_fenced  # a newer epoch is not ours either
    assert b.add("", pid, 0, A0) is E.invalid_request
    assert b.add("tx", pid, 0, ("", 0)) is E.invalid_request


def test_add_offsets_adds_the_groups_offsets_partition():
    b, pid = started()
    assert b.add_offsets("tx", pid, 0, "my-group") is E.none
    offsets = TopicPartition("__consumer_offsets", group_partition_for("my-group", 50))
    assert b.meta("tx").partitions == {offsets}
    assert b.end("tx", pid, 0) is E.none
    assert b.data[offsets][-1].commit is True


@pytest.mark.parametrize("commit", [True, False])
def test_end_writes_a_marker_to_every_partition_then_completes(commit):
    b, pid = started(A0, B0)
    b.add_offsets("tx", pid, 0, "g")
    assert b.end("tx", pid, 0, commit=commit) is E.none
    partitions = {TopicPartition(*A0), TopicPartition(*B0),
                  TopicPartition("__consumer_offsets", group_partition_for("g", 50))}
    assert set(b.data) == partitions
    for tp in partitions:
        (marker,) = b.data[tp]
        assert (marker.topic, marker.partition) == tp
        assert (marker.producer_id, marker.producer_epoch, marker.commit,
                marker.coordinator_epoch) == (pid, 0, commit, 0)
    meta = b.meta("tx")
    assert meta.state is (S.COMPLETE_COMMIT if commit else S.COMPLETE_ABORT)
    assert meta.partitions == frozenset() and meta.producer_epoch == 0


def test_end_txn_is_answered_once_prepare_is_durable_before_the_markers():
    b, pid = started(A0)
    result = b.coord.end_txn(transactional_id="tx", producer_id=pid, producer_epoch=0,
                             commit=True, now_ms=b.now_ms)
    assert b.meta("tx").state is S.ONGOING  # prepared, not applied
    (append,) = result.appends
    done = b.coord.complete(result, [b._append(append)], b.now_ms)
    assert done.response.error is E.none and done.appends == ()
    (write,) = done.markers
    assert (write.producer_id, write.commit) == (pid, True)
    assert write.partitions == (TopicPartition(*A0),)
    assert b.meta("tx").state is S.PREPARE_COMMIT
    b.persist(b.write_markers(write))
    assert b.meta("tx").state is S.COMPLETE_COMMIT


def test_end_txn_in_each_state():
    b, pid = started()
    assert b.end("tx", pid, 0) is E.invalid_txn_state  # Empty: nothing to end
    b.add("tx", pid, 0, A0)
    b.hold_markers = True
    assert b.end("tx", pid, 0, commit=True) is E.none
    # markers in flight: any EndTxn waits
    assert b.end("tx", pid, 0, commit=True) is E.concurrent_transactions
    assert b.end("tx", pid, 0, commit=False) is E.concurrent_transactions
    assert b.add("tx", pid, 0, B0) is E.concurrent_transactions
    b.release_markers()
    markers = len(b.data[TopicPartition(*A0)])
    assert b.end("tx", pid, 0, commit=True) is E.none  # idempotent retry
    assert b.end("tx", pid, 0, commit=False) is E.invalid_txn_state
    assert len(b.data[TopicPartition(*A0)]) == markers  # the retry wrote nothing
    b.add("tx", pid, 0, A0)
    b.end("tx", pid, 0, commit=False)
    assert b.end("tx", pid, 0, commit=False) is E.none
    assert b.end("tx", pid, 0, commit=True) is E.invalid_txn_state


def test_a_new_transaction_after_completion_starts_from_complete():
    b, pid = started(A0)
    b.end("tx", pid, 0)
    assert b.add("tx", pid, 0, B0) is E.none
    assert b.meta("tx").partitions == {TopicPartition(*B0)}  # the old ones are gone
    assert b.end("tx", pid, 0, commit=False) is E.none
    assert [m.commit for m in b.data[TopicPartition(*B0)]] == [False]


def test_older_epoch_is_fenced_on_every_api():
    b, pid = started(A0)
    b.init("tx")  # aborts (CONCURRENT_TRANSACTIONS) ...
    assert b.init("tx").producer_epoch == 2  # ... then the new instance gets epoch 2
    assert b.add("tx", pid, 0, A1) is E.producer_fenced
    assert b.add_offsets("tx", pid, 0, "g") is E.producer_fenced
    assert b.end("tx", pid, 0, commit=True) is E.producer_fenced
    assert b.end("tx", pid, 0, commit=False) is E.producer_fenced
    assert b.init("tx", pid=pid, epoch=0).error is E.producer_fenced


def test_an_empty_transaction_commits_without_markers():
    b, pid = started()
    assert b.add("tx", pid, 0) is E.none  # Kafka allows it: Ongoing with no partitions
    assert b.end("tx", pid, 0) is E.none
    assert b.meta("tx").state is S.COMPLETE_COMMIT and not b.data


def test_verify_partitions():
    b, pid = started(A0)
    verify = b.coord.verify_partitions
    assert verify(transactional_id="tx", producer_id=pid, producer_epoch=0,
                  partitions=[A0, B0]) == {TopicPartition(*A0): E.none,
                                           TopicPartition(*B0): E.transaction_abortable}
    assert set(verify(transactional_id="tx", producer_id=pid, producer_epoch=1,
                      partitions=[A0]).values()) == {E.producer_fenced}
    assert set(verify(transactional_id="nope", producer_id=pid, producer_epoch=0,
                      partitions=[A0]).values()) == {E.invalid_producer_id_mapping}
    b.hold_markers = True
    b.end("tx", pid, 0)
    assert set(verify(transactional_id="tx", producer_id=pid, producer_epoch=0,
                      partitions=[A0]).values()) == {E.concurrent_transactions}
