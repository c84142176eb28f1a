"""Transactions with real clients: what read_committed and read_uncommitted readers see.

For each of confluent-kafka, kafka-python and aiokafka as the transactional producer
(and as the reader): a committed transaction is visible to read_committed; an aborted one
is not, but read_uncommitted sees its records. Several producers' transactions interleaved
on one partition are filtered record by record (the broker's AbortedTransactions and the
client's filtering agree). An open transaction holds read_committed readers at its first
offset - even records written after it by plain producers wait - until it ends.
"""

from __future__ import annotations

import pytest
from confluent_kafka import Producer

from tests.helpers import TIMEOUT_S, create_topic, unique
from tests.integration.transactions_support import (
    CLIENTS,
    ConfluentTxn,
    read_all,
    txn_broker,  # noqa: F401, F811 - a fixture
    txn_producer,
    watermarks,
)

PARTITIONS = 2


def _values(prefix: str, count: int) -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(count)]


def _one_transaction(producer, topic: str, values: list[bytes], commit: bool) -> None:
    producer.begin()
    for i, value in enumerate(values):
        producer.send(topic, value, partition=i % PARTITIONS)
    if commit:
        producer.commit()
    else:
        producer.abort()


def _by_partition(values: list[bytes]) -> list[bytes]:
    """`values` sent round-robin, in the order read_all returns them."""
    return [v for p in range(PARTITIONS) for v in values[p::PARTITIONS]]


@pytest.mark.parametrize("client", CLIENTS)
def test_commit_is_visible_to_read_committed(txn_broker, client):
    bootstrap = txn_broker.bootstrap_servers
    topic = create_topic(bootstrap, unique(f"txn-commit-{client}"), PARTITIONS)
    producer = txn_producer(client, bootstrap, unique("tx"))
    try:
        producer.init()
        committed = _values("c", 10)
        _one_transaction(producer, topic, committed, commit=True)
    finally:
        producer.close()
    for reader in {client, "confluent"}:
        assert read_all(reader, bootstrap, topic, PARTITIONS) == _by_partition(committed)


@pytest.mark.parametrize("client", CLIENTS)
def test_abort_is_invisible_to_read_committed_visible_to_read_uncommitted(txn_broker, client):
    bootstrap = txn_broker.bootstrap_servers
    topic = create_topic(bootstrap, unique(f"txn-abort-{client}"), PARTITIONS)
    producer = txn_producer(client, bootstrap, unique("tx"))
    before, aborted, after = _values("b", 6), _values("a", 6), _values("z", 6)
    try:
        producer.init()
        _one_transaction(producer, topic, before, commit=True)
        _one_transaction(producer, topic, aborted, commit=False)
        _one_transaction(producer, topic, after, commit=True)
    finally:
        producer.close()
    assert read_all(client, bootstrap, topic, PARTITIONS) == _by_partition(before + after)
    assert read_all(client, bootstrap, topic, PARTITIONS, "read_uncommitted") == \
        _by_partition(before + aborted + after)


@pytest.fixture(scope="module")
def interleaved(txn_broker) -> tuple[str, list[bytes], list[bytes]]:
    """One partition where three producers' transactions and a plain producer's records
    interleave batch by batch; some transactions abort. Returns (topic, every value in
    offset order, the committed ones in offset order)."""
    bootstrap = txn_broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("txn-interleaved"), 1)
    producers = {name: ConfluentTxn(bootstrap, unique(f"tx-{name}")) for name in "PQR"}
    plain = Producer({"bootstrap.servers": bootstrap})
    sent: list[bytes] = []
    outcome: dict[bytes, bool] = {}
    for producer in producers.values():
        producer.init()
    # round -> which producers commit (the others abort)
    for round_, committing in enumerate(["PR", "Q", "PQ", ""]):
        for producer in producers.values():
            producer.begin()
        for i in range(3):
            for name, producer in producers.items():
                value = f"{name}{round_}.{i}".encode()
                producer.send(topic, value)
                producer.flush()  # one batch each, so the log interleaves them
                sent.append(value)
                outcome[value] = name in committing
            value = f"plain{round_}.{i}".encode()
            plain.produce(topic, value, partition=0)
            assert plain.flush(TIMEOUT_S) == 0
            sent.append(value)
            outcome[value] = True
        for name, producer in producers.items():
            producer.commit() if name in committing else producer.abort()
    return topic, sent, [v for v in sent if outcome[v]]


@pytest.mark.parametrize("client", CLIENTS)
def test_interleaved_transactions_of_several_producers_are_filtered(txn_broker, interleaved,
                                                                     client):
    topic, everything, committed = interleaved
    bootstrap = txn_broker.bootstrap_servers
    assert read_all(client, bootstrap, topic, 1) == committed
    assert read_all(client, bootstrap, topic, 1, "read_uncommitted") == everything


def test_open_transaction_holds_read_committed_at_its_first_offset(txn_broker):
    bootstrap = txn_broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("txn-open"), 1)
    plain = Producer({"bootstrap.servers": bootstrap})

    def produce_plain(values: list[bytes]) -> None:
        for value in values:
            plain.produce(topic, value, partition=0)
        assert plain.flush(TIMEOUT_S) == 0

    early, late = _values("early", 3), _values("late", 2)
    produce_plain(early)
    producer = ConfluentTxn(bootstrap, unique("tx"))
    producer.init()
    producer.begin()
    pending = _values("txn", 2)
    for value in pending:
        producer.send(topic, value)
    producer.flush()
    produce_plain(late)  # after the open transaction's first offset: held back too

    first_txn_offset = len(early)
    assert watermarks(bootstrap, topic, 0, "read_committed") == (0, first_txn_offset)
    assert watermarks(bootstrap, topic, 0, "read_uncommitted") == (0, 7)
    for client in CLIENTS:
        assert read_all(client, bootstrap, topic, 1) == early, client
    assert read_all("confluent", bootstrap, topic, 1, "read_uncommitted") == \
        early + pending + late

    producer.commit()
    end = 8  # 7 records and the COMMIT marker
    assert watermarks(bootstrap, topic, 0, "read_committed") == (0, end)
    for client in CLIENTS:
        assert read_all(client, bootstrap, topic, 1) == early + pending + late, client
