"""Restarts, failed writes, failed markers, partitions that are not (yet) ours."""

import pytest
from kio.schema.errors import ErrorCode

from onceflow.txn import TopicPartition, TxnState
from tests.txn.harness import FakeBroker, replayed_state

E = ErrorCode
S = TxnState
A0, B0 = TopicPartition("a", 0), TopicPartition("b", 0)


def ongoing(*partitions: TopicPartition) -> tuple[FakeBroker, int]:
    b = FakeBroker()
    pid, _ = b.producer("tx")
    assert b.add("tx", pid, 0, *(partitions or (A0, B0))) is E.none
    return b, pid


@pytest.mark.parametrize("commit", [True, False])
def test_restart_in_prepare_rewrites_the_markers_and_completes(commit):
    b, pid = ongoing()
    b.hold_markers = True  # the broker dies between Prepare* and the markers
    assert b.end("tx", pid, 0, commit=commit) is E.none
    assert b.data == {}
    b = b.restarted()
    assert b.meta("tx").state is (S.COMPLETE_COMMIT if commit else S.COMPLETE_ABORT)
    for tp in (A0, B0):
        (marker,) = b.data[tp]
        assert (marker.producer_id, marker.producer_epoch, marker.commit,
                marker.coordinator_epoch) == (pid, 0, commit, 1)
    assert b.end("tx", pid, 0, commit=commit) is E.none  # the client's retry


def test_markers_written_before_the_crash_are_written_again_idempotently():
    b, pid = ongoing()
    b.marker_errors[B0].append(E.not_leader_or_follower)
    b.end("tx", pid, 0)
    assert len(b.data[A0]) == 1 and B0 not in b.data
    assert b.meta("tx").state is S.PREPARE_COMMIT  # B0 waits for its retry
    b = b.restarted()
    assert [m.commit for m in b.data[A0]] == [True, True]  # harmless duplicate
    assert len(b.data[B0]) == 1 and b.meta("tx").state is S.COMPLETE_COMMIT


def test_retriable_marker_errors_are_retried_after_the_backoff():
    b, pid = ongoing()
    b.marker_errors[B0] += [E.request_timed_out, E.kafka_storage_error]
    b.end("tx", pid, 0)
    assert b.state("tx") == "PrepareCommit"
    (described,) = b.coord.describe_transactions(["tx"])
    assert described.topics == (("b", (0,)),)  # only the partition still without a marker
    b.advance(b.config.retry_backoff_ms)
    assert b.state("tx") == "PrepareCommit"
    b.advance(b.config.retry_backoff_ms)
    assert b.state("tx") == "CompleteCommit"
    assert len(b.data[A0]) == 1 and len(b.data[B0]) == 1


def test_a_deleted_partition_does_not_hold_the_transaction():
    b, pid = ongoing()
    b.marker_errors[B0].append(E.unknown_topic_or_partition)
    b.end("tx", pid, 0)
    assert b.state("tx") == "CompleteCommit"


def test_fenced_markers_stop_the_job_until_the_partition_is_loaded_again():
    b, pid = ongoing()
    b.marker_errors[B0].append(E.transaction_coordinator_fenced)
    b.end("tx", pid, 0)
    b.advance(10 * b.config.retry_backoff_ms)
    assert b.state("tx") == "PrepareCommit"
    assert b.init("tx").error is E.concurrent_transactions
    b = b.restarted()
    assert b.state("tx") == "CompleteCommit"


def test_an_unexpected_marker_error_is_our_bug():
    b, pid = ongoing()
    b.marker_errors[A0].append(E.corrupt_message)
    with pytest.raises(RuntimeError, match="corrupt_message"):
        b.end("tx", pid, 0)


@pytest.mark.parametrize("error,answer", [
    (E.not_leader_or_follower, E.not_coordinator),
    (E.kafka_storage_error, E.not_coordinator),
    (E.request_timed_out, E.coordinator_not_available),
    (E.not_enough_replicas, E.coordinator_not_available),
    (E.message_too_large, E.unknown_server_error),
])
def test_failed_writes_answer_kafkas_mapped_error_and_change_nothing(error, answer):
    b, pid = ongoing()
    before = b.durable_state()
    b.fail_next.append(error)
    assert b.end("tx", pid, 0) is answer
    assert b.durable_state() == before and b.data == {}
    b.fail_next.append(error)
    assert b.init("tx").error is answer
    b.fail_next.append(error)
    assert b.add("tx", pid, 0, ("c", 0)) is answer
    assert b.durable_state() == before
    assert b.end("tx", pid, 0) is E.none  # nothing stuck: the retry works


def test_a_failed_fence_bumps_from_the_same_epoch_next_time():
    b, pid = ongoing()
    b.fail_next.append(E.not_leader_or_follower)
    assert b.init("tx").error is E.not_coordinator
    assert b.meta("tx").producer_epoch == 0
    assert b.init("tx").error is E.concurrent_transactions
    assert b.data[A0][-1].producer_epoch == 1


def test_a_failed_complete_is_retried():
    b, pid = ongoing()
    result = b.coord.end_txn(transactional_id="tx", producer_id=pid, producer_epoch=0,
                             commit=True, now_ms=b.now_ms)
    b.fail_next[:] = []
    done = b.coord.complete(result, [b._append(a) for a in result.appends], b.now_ms)
    (write,) = done.markers
    b.fail_next.append(E.not_enough_replicas)  # the Complete* append fails
    b.persist(b.write_markers(write))
    assert b.state("tx") == "PrepareCommit"
    b.advance(b.config.retry_backoff_ms)
    assert b.state("tx") == "CompleteCommit"


def test_not_coordinator_and_loading():
    b = FakeBroker(load=False)
    p = b.coord.partition_for("tx")
    assert b.init("tx").error is E.not_coordinator
    assert b.add("tx", 1, 0, A0) is E.not_coordinator
    assert b.end("tx", 1, 0) is E.not_coordinator
    b.coord.begin_loading(p)
    assert b.init("tx").error is E.coordinator_load_in_progress
    assert b.add_offsets("tx", 1, 0, "g") is E.coordinator_load_in_progress
    assert b.coord.describe_transactions(["tx"])[0].error is E.coordinator_load_in_progress
    assert b.coord.list_transactions(now_ms=0).error is E.coordinator_load_in_progress
    b.persist(b.coord.load_partition(p, [], b.now_ms))
    assert b.init("tx").error is E.none
    assert b.coord.list_transactions(now_ms=0).error is E.none


def test_completion_after_unload_answers_not_coordinator():
    b, pid = ongoing()
    result = b.coord.end_txn(transactional_id="tx", producer_id=pid, producer_epoch=0,
                             commit=True, now_ms=b.now_ms)
    partition = b.coord.partition_for("tx")
    b.coord.unload_partition(partition)
    outcomes = [b._append(a) for a in result.appends]
    b.persist(b.coord.load_partition(partition, list(b.logs[partition]), b.now_ms, 1))
    assert b.coord.complete(result, outcomes, b.now_ms).response.error is E.not_coordinator
    assert b.state("tx") == "CompleteCommit"  # the new load replayed it and finished it


def test_restart_reproduces_the_state_and_keeps_the_pid_counter():
    b, pid = ongoing()
    b.producer("other")
    state = b.durable_state()
    assert replayed_state(b) == state
    assert b.restarted().durable_state() == state
