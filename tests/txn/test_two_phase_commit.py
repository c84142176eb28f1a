"""KIP-939 in the transaction coordinator: InitProducerId with enable2Pc / keepPreparedTxn."""

from dataclasses import replace

from kio.schema.errors import ErrorCode

from onceflow.txn import TopicPartition, TxnState
from tests.txn.harness import FAST, FakeBroker

E = ErrorCode
S = TxnState
A0, B0 = ("a", 0), ("b", 0)
INT32_MAX = 2**31 - 1
TWO_PC = replace(FAST, transaction_two_phase_commit_enable=True)


def init(b: FakeBroker, txn_id: str | None, timeout_ms: int = 60_000, *, two_pc: bool = False,
         keep: bool = False):
    return b.persist(b.coord.init_producer_id(
        transactional_id=txn_id, transaction_timeout_ms=timeout_ms, now_ms=b.now_ms,
        enable_2pc=two_pc, keep_prepared_txn=keep))


def prepared(b: FakeBroker, txn_id: str = "tx") -> tuple[int, int]:
    """A two-phase-commit transaction left open on A0 and B0, as a crashed writer leaves it."""
    answer = init(b, txn_id, two_pc=True)
    assert answer.error is E.none, answer
    assert b.add(txn_id, answer.producer_id, answer.producer_epoch, A0, B0) is E.none
    return answer.producer_id, answer.producer_epoch


def test_two_phase_commit_needs_the_broker_setting():
    b = FakeBroker()
    assert init(b, "tx", two_pc=True).error is E.transactional_id_authorization_failed
    assert b.meta("tx") is None  # nothing written
    assert init(FakeBroker(config=TWO_PC), "tx", two_pc=True).error is E.none


def test_flags_without_a_transactional_id_are_invalid():
    b = FakeBroker(config=TWO_PC)
    assert init(b, None, two_pc=True).error is E.invalid_request
    assert init(b, None, keep=True).error is E.invalid_request
    assert init(b, "", two_pc=True).error is E.invalid_request


def test_a_two_phase_commit_transaction_is_never_timed_out():
    b = FakeBroker(config=TWO_PC)
    pid, epoch = prepared(b, "2pc")
    # any timeout is accepted (no transaction.max.timeout.ms check) and stored as INT32_MAX
    assert b.meta("2pc").txn_timeout_ms == INT32_MAX
    plain = init(b, "plain", 1_000)
    assert b.add("plain", plain.producer_id, plain.producer_epoch, A0) is E.none
    b.advance(10 * 60_000)
    assert b.state("plain") == "CompleteAbort"  # the ordinary one timed out
    meta = b.meta("2pc")
    assert (meta.state, meta.producer_epoch) == (S.ONGOING, epoch)
    assert b.end("2pc", pid, epoch, commit=True) is E.none
    assert b.state("2pc") == "CompleteCommit"


def test_keep_prepared_txn_hands_the_open_transaction_to_a_new_instance():
    b = FakeBroker(config=TWO_PC)
    pid, epoch = prepared(b)
    answer = init(b, "tx", two_pc=True, keep=True)
    assert answer.error is E.none
    assert (answer.producer_id, answer.producer_epoch) == (pid, epoch + 1)
    assert (answer.ongoing_txn_producer_id, answer.ongoing_txn_producer_epoch) == (pid, epoch)
    meta = b.meta("tx")
    assert meta.state is S.ONGOING and {tuple(tp) for tp in meta.partitions} == {A0, B0}
    # the instance that opened it is fenced; the new one commits it
    assert b.end("tx", pid, epoch, commit=True) is E.producer_fenced
    assert b.end("tx", pid, epoch + 1, commit=True) is E.none
    assert b.state("tx") == "CompleteCommit"
    for tp in (A0, B0):
        (marker,) = b.data[TopicPartition(*tp)]
        assert (marker.commit, marker.producer_epoch) == (True, epoch + 1)
    # the kept state is durable: a restarted coordinator replays to the same metadata
    assert b.restarted().durable_state() == b.durable_state()


def test_keep_prepared_txn_with_nothing_open_is_an_ordinary_init():
    b = FakeBroker(config=TWO_PC)
    first = init(b, "tx", two_pc=True)
    again = init(b, "tx", two_pc=True, keep=True)
    assert (again.error, again.producer_id, again.producer_epoch) == (
        E.none, first.producer_id, first.producer_epoch + 1)
    assert (again.ongoing_txn_producer_id, again.ongoing_txn_producer_epoch) == (-1, -1)


def test_without_keep_the_open_two_phase_transaction_is_aborted():
    b = FakeBroker(config=TWO_PC)
    pid, epoch = prepared(b)
    assert init(b, "tx", two_pc=True).error is E.concurrent_transactions
    assert b.state("tx") == "CompleteAbort"
    answer = init(b, "tx", two_pc=True)
    assert (answer.error, answer.producer_id) == (E.none, pid)
    assert answer.producer_epoch > epoch + 1


def test_keeping_an_ordinary_transaction_makes_it_a_two_phase_one():
    """What the Spark sink does: a librdkafka producer opens an ordinary transaction, then
    InitProducerId(enable2Pc, keepPreparedTxn) takes it over and lifts its timeout."""
    b = FakeBroker(config=TWO_PC)
    answer = init(b, "tx", 1_000)
    assert b.add("tx", answer.producer_id, answer.producer_epoch, A0) is E.none
    kept = init(b, "tx", two_pc=True, keep=True)
    assert (kept.ongoing_txn_producer_id, kept.ongoing_txn_producer_epoch) == (
        answer.producer_id, answer.producer_epoch)
    b.advance(60_000)
    assert b.state("tx") == "Ongoing"  # no longer subject to the 1 s timeout
    assert b.end("tx", kept.producer_id, kept.producer_epoch, commit=False) is E.none
    assert b.state("tx") == "CompleteAbort"


def test_keep_without_two_phase_commit_leaves_the_transaction_under_its_timeout():
    b = FakeBroker(config=TWO_PC)
    answer = init(b, "tx", 1_000)
    assert b.add("tx", answer.producer_id, answer.producer_epoch, A0) is E.none
    kept = init(b, "tx", 1_000, keep=True)
    assert (kept.error, kept.producer_epoch) == (E.none, answer.producer_epoch + 1)
    b.advance(60_000)
    assert b.state("tx") == "CompleteAbort"
