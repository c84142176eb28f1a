"""A lost Produce answer must never let a transaction commit without its records (issue 11).

The broker performs a transactional Produce and the connection closes before the answer.
What the application does next decides which retry the broker sees; in every case the
records of a successful commit are readable exactly once under read_committed, and
nothing of an aborted transaction is.
"""

from __future__ import annotations

from confluent_kafka import KafkaException, Producer

from tests.helpers import TIMEOUT_S, create_topic, unique
from tests.integration.transactions_support import (
    read_all,
    txn_broker,  # noqa: F401 - a fixture
)

REPORTS_WAIT_S = 0.05  # the "about 50 ms later": before the client's retry lands
ABORT_ATTEMPTS = 3


def _producer(bootstrap: str) -> Producer:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": unique("tx"),
                         "linger.ms": 0})
    producer.init_transactions(TIMEOUT_S)
    return producer


def _send(producer: Producer, topic: str, value: bytes, reports: list) -> None:
    producer.produce(topic, value, partition=0,
                     on_delivery=lambda err, msg: reports.append((value, err, msg.offset())))


def _commit_or_abort(producer: Producer, topic: str, value: bytes, reports: list) -> bool:
    """One transaction with `value`; True if it committed, False if it had to be aborted."""
    producer.begin_transaction()
    _send(producer, topic, value, reports)
    try:
        producer.commit_transaction(TIMEOUT_S)
        return True
    except KafkaException as exc:
        assert exc.args[0].txn_requires_abort(), exc  # abortable, never fatal
        _abort(producer)
        return False


def _abort(producer: Producer) -> None:
    """abort_transaction as an application must call it: librdkafka documents a retriable
    error from it ("the abort operation is in progress in the background ... call this API
    again to resume"), seen once in CI when its purge outlasted the timeout after the
    closed connection."""
    for attempt in range(1, ABORT_ATTEMPTS + 1):
        try:
            producer.abort_transaction(TIMEOUT_S)
            return
        except KafkaException as exc:
            if not exc.args[0].retriable() or attempt == ABORT_ATTEMPTS:
                raise


def test_next_transaction_is_not_taken_for_a_retry_of_the_aborted_one(txn_broker):  # noqa: F811
    """The issue's reproduction: c0 committed; a1 performed, answer lost, A aborted before
    the retry; B's b1 reuses a1's epoch and sequence (librdkafka, transactions V1)."""
    bootstrap = txn_broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("lost-answer"), 1)
    reports: list = []
    producer = _producer(bootstrap)
    assert _commit_or_abort(producer, topic, b"c0", reports)
    txn_broker.faults.close_connections("produce", count=1, perform=True)
    producer.begin_transaction()
    _send(producer, topic, b"a1", reports)
    producer.poll(REPORTS_WAIT_S)
    _abort(producer)
    committed_b1 = _commit_or_abort(producer, topic, b"b1", reports)
    if not committed_b1:  # the application saw the error and runs B again
        assert _commit_or_abort(producer, topic, b"b1", reports)
    producer.flush(TIMEOUT_S)
    values = read_all("confluent", bootstrap, topic, 1)
    assert values == [b"c0", b"b1"], (values, reports)
    delivered = [offset for value, err, offset in reports if value == b"b1" and err is None]
    assert len(delivered) == 1, reports
    uncommitted = read_all("confluent", bootstrap, topic, 1, "read_uncommitted")
    assert uncommitted.count(b"b1") == 1, uncommitted
