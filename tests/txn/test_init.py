"""InitProducerId: new ids, epoch bumps that fence, KIP-360, abort-first, exhaustion."""

from kio.schema.errors import ErrorCode

from onceflow.txn import TopicPartition, TxnLogValue, TxnState
from onceflow.txn.records import txn_record
from tests.txn.harness import FakeBroker

E = ErrorCode
S = TxnState
TP = ("out", 0)


def test_new_id_gets_a_new_producer_id_with_epoch_0():
    b = FakeBroker()
    answer = b.init("tx")
    assert (answer.error, answer.producer_id, answer.producer_epoch) == (E.none, 1000, 0)
    meta = b.meta("tx")
    assert (meta.state, meta.producer_id, meta.producer_epoch) == (S.EMPTY, 1000, 0)
    assert meta.txn_start_timestamp_ms == -1 and meta.txn_timeout_ms == 60_000
    assert sum(len(log) for log in b.logs.values()) == 1
    assert b.init("other").producer_id == 1001  # from the allocator, never reused


def test_known_id_keeps_the_producer_id_and_bumps_the_epoch_fencing_the_old_one():
    b = FakeBroker()
    first = b.init("tx")
    second = b.init("tx")
    assert (second.producer_id, second.producer_epoch) == (first.producer_id, 1)
    pid = first.producer_id
    assert b.add("tx", pid, 0, TP) is E.producer_fenced
    assert b.add_offsets("tx", pid, 0, "g") is E.producer_fenced
    assert b.end("tx", pid, 0) is E.producer_fenced
    assert b.add("tx", pid, 1, TP) is E.none


def test_bad_requests():
    b = FakeBroker()
    assert b.init("tx", timeout_ms=0).error is E.invalid_transaction_timeout
    assert b.init("tx", timeout_ms=900_001).error is E.invalid_transaction_timeout
    assert b.init("tx", timeout_ms=900_000).error is E.none
    assert b.init("").error is E.invalid_request
    assert b.init("tx", pid=5).error is E.invalid_request  # id without epoch (KafkaApis)
    assert b.init("x" * 40_000).error is E.invalid_request  # cannot be a record key


def test_no_transactional_id_is_an_idempotent_producer():
    b = FakeBroker()
    result = b.coord.init_producer_id(transactional_id=None, transaction_timeout_ms=0,
                                      now_ms=b.now_ms)
    assert (result.response.error, result.response.producer_epoch) == (E.none, 0)
    assert result.appends == ()


def test_kip360_bump_by_the_current_producer_and_its_retry():
    b = FakeBroker()
    pid, _ = b.producer("tx")
    bumped = b.init("tx", pid=pid, epoch=0)
    assert (bumped.error, bumped.producer_id, bumped.producer_epoch) == (E.none, pid, 1)
    retry = b.init("tx", pid=pid, epoch=0)  # the answer was lost; same epoch again
    assert (retry.error, retry.producer_epoch) == (E.none, 1)
    assert b.init("tx", pid=pid + 7, epoch=1).error is E.producer_fenced
    b.init("tx")  # another instance: epoch 2, last epoch forgotten
    assert b.init("tx", pid=pid, epoch=1).error is E.producer_fenced
    assert b.init("tx", pid=pid, epoch=2).producer_epoch == 3


def test_kip360_retry_across_a_restart_is_fenced_as_in_kafka():
    b = FakeBroker()
    pid, _ = b.producer("tx")
    b.init("tx", pid=pid, epoch=0)
    b = b.restarted()  # the last epoch is not in the log
    assert b.init("tx", pid=pid, epoch=0).error is E.producer_fenced


def test_unknown_id_with_a_producer_id_gets_a_fresh_one():
    b = FakeBroker()
    answer = b.init("tx", pid=77, epoch=3)
    assert (answer.error, answer.producer_id, answer.producer_epoch) == (E.none, 1000, 0)


def test_init_while_ongoing_aborts_first_then_bumps_again():
    b = FakeBroker()
    pid, _ = b.producer("tx")
    assert b.add("tx", pid, 0, TP, ("out", 1)) is E.none
    first = b.init("tx")
    assert first.error is E.concurrent_transactions
    markers = b.data[TopicPartition(*TP)]
    assert [(m.producer_id, m.producer_epoch, m.commit) for m in markers] == [(pid, 1, False)]
    assert b.meta("tx").state is S.COMPLETE_ABORT and b.meta("tx").producer_epoch == 1
    retry = b.init("tx")
    assert (retry.error, retry.producer_id, retry.producer_epoch) == (E.none, pid, 2)
    assert b.end("tx", pid, 0) is E.producer_fenced  # the zombie


def test_init_while_prepare_is_concurrent_until_the_markers_are_written():
    b = FakeBroker()
    pid, _ = b.producer("tx")
    b.add("tx", pid, 0, TP)
    b.hold_markers = True
    assert b.end("tx", pid, 0, commit=True) is E.none
    assert b.meta("tx").state is S.PREPARE_COMMIT
    assert b.init("tx").error is E.concurrent_transactions
    b.release_markers()
    assert b.meta("tx").state is S.COMPLETE_COMMIT
    assert b.init("tx").producer_epoch == 1


OLD_PID = 500  # below the allocator's first id (1000)


def exhausted(b: FakeBroker, state: TxnState, partitions=None) -> FakeBroker:
    """The newest record of "tx" (all compaction left) has the last usable epoch."""
    value = TxnLogValue(OLD_PID, 32766, 60_000, state.id, partitions, b.now_ms,
                        b.now_ms if partitions else -1, previous_producer_id=OLD_PID)
    b.inject(txn_record("tx", value))
    return b.restarted()


def test_epoch_exhaustion_issues_a_new_producer_id():
    b = exhausted(FakeBroker(), S.COMPLETE_COMMIT, ())
    answer = b.init("tx")
    assert (answer.error, answer.producer_id, answer.producer_epoch) == (E.none, 1000, 0)
    assert b.meta("tx").previous_producer_id == OLD_PID
    assert b.add("tx", OLD_PID, 32766, TP) is E.invalid_producer_id_mapping


def test_kip360_retry_after_rotation_is_recognised():
    b = exhausted(FakeBroker(), S.EMPTY)
    rotated = b.init("tx", pid=OLD_PID, epoch=32766)
    assert (rotated.producer_id, rotated.producer_epoch) == (1000, 0)
    retry = b.init("tx", pid=OLD_PID, epoch=32766)
    assert (retry.error, retry.producer_id, retry.producer_epoch) == (E.none, 1000, 0)
    assert b.init("tx", pid=OLD_PID, epoch=32765).error is E.producer_fenced


def test_fencing_an_ongoing_transaction_at_the_last_epoch_then_rotating():
    b = exhausted(FakeBroker(), S.ONGOING, (("out", (0,)),))
    assert b.init("tx").error is E.concurrent_transactions
    marker = b.data[TopicPartition("out", 0)][-1]
    assert (marker.producer_id, marker.producer_epoch, marker.commit) == (OLD_PID, 32767, False)
    answer = b.init("tx")
    assert (answer.error, answer.producer_id, answer.producer_epoch) == (E.none, 1000, 0)
