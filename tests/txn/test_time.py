"""Time: transactions older than their timeout are aborted and fenced; idle ids expire."""

from dataclasses import replace

from kio.schema.errors import ErrorCode

from onceflow.txn import TopicPartition, TxnState
from tests.txn.harness import FAST, FakeBroker

E = ErrorCode
S = TxnState
TP = ("out", 0)
SCAN_MS = FAST.abort_timed_out_cleanup_interval_ms


def test_timed_out_transaction_is_aborted_with_an_epoch_bump():
    b = FakeBroker()
    pid, _ = b.producer("tx", timeout_ms=5_000)
    b.add("tx", pid, 0, TP)
    b.advance(5_000)  # start + timeout == now: not yet (Kafka: strictly older)
    assert b.meta("tx").state is S.ONGOING
    b.advance(SCAN_MS)
    meta = b.meta("tx")
    assert (meta.state, meta.producer_epoch) == (S.COMPLETE_ABORT, 1)
    (marker,) = b.data[TopicPartition(*TP)]
    assert (marker.producer_id, marker.producer_epoch, marker.commit) == (pid, 1, False)
    # the late producer is fenced everywhere
    assert b.end("tx", pid, 0) is E.producer_fenced
    assert b.add("tx", pid, 0, TP) is E.producer_fenced
    assert b.add_offsets("tx", pid, 0, "g") is E.producer_fenced
    # a new instance carries on
    assert b.init("tx").producer_epoch == 2


def test_the_timeout_check_runs_every_cleanup_interval():
    b = FakeBroker()
    pid, _ = b.producer("tx", timeout_ms=1_500)
    b.add("tx", pid, 0, TP)
    assert b.coord.next_deadline_ms() is not None
    b.advance(SCAN_MS - 1)
    assert b.meta("tx").state is S.ONGOING
    b.advance(SCAN_MS)
    assert b.meta("tx").state is S.COMPLETE_ABORT


def test_timeout_survives_a_restart():
    b = FakeBroker()
    pid, _ = b.producer("tx", timeout_ms=5_000)
    b.add("tx", pid, 0, TP)
    b = b.restarted()
    b.advance(5_000 + SCAN_MS)
    assert b.meta("tx").state is S.COMPLETE_ABORT and b.meta("tx").producer_epoch == 1


def test_a_transaction_ending_in_time_is_left_alone():
    b = FakeBroker()
    pid, _ = b.producer("tx", timeout_ms=5_000)
    b.add("tx", pid, 0, TP)
    b.advance(SCAN_MS // 2)
    assert b.end("tx", pid, 0) is E.none
    b.advance(10 * SCAN_MS)
    assert b.meta("tx").state is S.COMPLETE_COMMIT and b.meta("tx").producer_epoch == 0


def expiring() -> FakeBroker:
    config = replace(FAST, transactional_id_expiration_ms=50_000,
                     remove_expired_cleanup_interval_ms=10_000,
                     abort_timed_out_cleanup_interval_ms=10**9)  # no timeouts here
    return FakeBroker(config)


def test_idle_ids_expire_with_a_tombstone():
    b = expiring()
    b.producer("empty")
    pid, _ = b.producer("done")
    b.add("done", pid, 0, TP)
    b.end("done", pid, 0)
    b.advance(40_000)
    assert b.state("empty") == "Empty"
    b.advance(20_000)
    for txn_id in ("empty", "done"):
        (described,) = b.coord.describe_transactions([txn_id])
        assert described.error is E.transactional_id_not_found
        log = b.logs[b.coord.partition_for(txn_id)]
        assert log[-1].value is None  # the tombstone
    assert b.restarted().meta("done") is None  # replaying the tombstone forgets it too
    answer = b.init("done")
    assert answer.producer_id != pid and answer.producer_epoch == 0  # a fresh start


def test_ongoing_ids_never_expire():
    b = expiring()
    pid, _ = b.producer("tx", timeout_ms=900_000)
    b.add("tx", pid, 0, TP)
    b.advance(200_000)
    assert b.state("tx") == "Ongoing"


def test_activity_keeps_an_id_alive():
    b = expiring()
    pid, _ = b.producer("tx")
    for _ in range(4):
        b.advance(20_000)
        b.add("tx", pid, 0, TP)
        b.end("tx", pid, 0)
    assert b.state("tx") == "CompleteCommit"


def test_expiring_id_is_busy_while_its_tombstone_is_written():
    b = expiring()
    b.producer("tx")
    b.now_ms += 60_000
    result = b.coord.tick(b.now_ms)
    (append,) = result.appends
    assert append.records[0].value is None
    assert b.init("tx").error is E.concurrent_transactions
    b.fail_next.append(E.not_leader_or_follower)
    b.persist(result)  # the tombstone did not make it: the id stays
    assert b.state("tx") == "Empty"
    assert b.init("tx").producer_epoch == 1
