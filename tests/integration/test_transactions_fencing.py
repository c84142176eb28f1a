"""Zombie fencing and timeouts, with real clients.

- Two producers with one transactional id: the second InitProducerId bumps the epoch
  and aborts the first one's open transaction, so the older producer is fenced on its
  next produce, on send_offsets_to_transaction and on commit - and nothing it wrote in
  that transaction is ever visible to read_committed.
- InitProducerId while a transaction is Ongoing aborts it (the LSO moves past it).
- A transaction open longer than its timeout is aborted by the coordinator with an epoch
  bump: read_committed never sees it and the late producer is fenced on commit.
- KIP-447: a consumer-transform-producer whose group generation is stale (its partitions
  were reassigned by a rebalance) is refused on TxnOffsetCommit, whatever its
  transactional id.
"""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException

from tests.helpers import create_topic, unique
from tests.integration.transactions_support import (
    close_quietly,
    read_all,
    txn_broker,  # noqa: F401, F811 - a fixture
    txn_producer,
    wait_for,
    watermarks,
)

FENCING_CLIENTS = ["confluent", "kafka-python"]


def _fenced(error: BaseException) -> bool:
    """Does this client exception say "fenced by a newer producer"?"""
    if isinstance(error, KafkaException):
        return error.args[0].code() == KafkaError._FENCED and error.args[0].fatal()
    return "ProducerFenced" in repr(error) or "InvalidProducerEpoch" in repr(error)


def _zombie_and_successor(client: str, bootstrap: str, topic: str):
    """An older producer with an open transaction holding one record, and a newer one with
    the same transactional id that has just initialised (fencing the older)."""
    transactional_id = unique("tx")
    older = txn_producer(client, bootstrap, transactional_id)
    older.init()
    older.begin()
    older.send(topic, b"zombie-1")
    older.flush()
    newer = txn_producer(client, bootstrap, transactional_id)
    newer.init()
    return older, newer


def _newer_still_works(newer, bootstrap: str, topic: str, client: str) -> None:
    newer.begin()
    newer.send(topic, b"newer")
    newer.commit()
    assert read_all(client, bootstrap, topic, 1) == [b"newer"]


def _group_metadata(client: str, bootstrap: str):
    if client == "confluent":
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("g")})
        metadata = consumer.consumer_group_metadata()
        consumer.close()
        return metadata
    from kafka import KafkaConsumer
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=unique("g"))
    metadata = consumer.group_metadata()
    consumer.close()
    return metadata


@pytest.mark.parametrize("client", FENCING_CLIENTS)
def test_older_producer_is_fenced_on_produce(txn_broker, client):
    bootstrap = txn_broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("fence-produce"), 1)
    older, newer = _zombie_and_successor(client, bootstrap, topic)
    try:
        if client == "confluent":
            older.send(topic, b"zombie-2")
            with pytest.raises(KafkaException) as raised:
                older.flush()
                older.commit()
        else:  # the record's own future carries Kafka's produce answer
            future = older.producer.send(topic, b"zombie-2", partition=0)
            with pytest.raises(Exception) as produced:
                future.get(timeout=10)
            assert "InvalidProducerEpoch" in repr(produced.value)
            with pytest.raises(Exception) as raised:
                wait_for(lambda: older.producer._transaction_manager.has_fatal_error(),
                         "the zombie learning it is fenced")
                older.commit()
        assert _fenced(raised.value), raised.value
        _newer_still_works(newer, bootstrap, topic, client)
    finally:
        close_quietly(older)
        newer.close()


@pytest.mark.parametrize("client", FENCING_CLIENTS)
def test_older_producer_is_fenced_on_send_offsets(txn_broker, client):
    bootstrap = txn_broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("fence-offsets"), 1)
    older, newer = _zombie_and_successor(client, bootstrap, topic)
    try:
        with pytest.raises(Exception) as raised:
            older.send_offsets({(topic, 0): 1}, _group_metadata(client, bootstrap))
        assert _fenced(raised.value), raised.value
        _newer_still_works(newer, bootstrap, topic, client)
    finally:
        close_quietly(older)
        newer.close()


@pytest.mark.parametrize("client", FENCING_CLIENTS + ["aiokafka"])
def test_older_producer_is_fenced_on_commit(txn_broker, client):
    bootstrap = txn_broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("fence-commit"), 1)
    older, newer = _zombie_and_successor(client, bootstrap, topic)
    try:
        with pytest.raises(Exception) as raised:
            older.commit()
        assert _fenced(raised.value), raised.value
        _newer_still_works(newer, bootstrap, topic, client)
    finally:
        close_quietly(older)
        newer.close()


@pytest.mark.parametrize("client", FENCING_CLIENTS + ["aiokafka"])
def test_init_while_ongoing_aborts_the_old_transaction(txn_broker, client):
    bootstrap = txn_broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("fence-init"), 1)
    transactional_id = unique("tx")
    first = txn_producer(client, bootstrap, transactional_id)
    first.init()
    first.begin()
    for i in range(3):
        first.send(topic, f"open{i}".encode())
    first.flush()
    assert watermarks(bootstrap, topic, 0, "read_committed") == (0, 0)  # held by it
    second = txn_producer(client, bootstrap, transactional_id)
    try:
        second.init()  # aborts the open transaction (the client retries meanwhile)
        wait_for(lambda: watermarks(bootstrap, topic, 0, "read_committed") == (0, 4),
                 "the ABORT marker moving the LSO past the open transaction")
        assert read_all(client, bootstrap, topic, 1) == []
        assert read_all(client, bootstrap, topic, 1, "read_uncommitted") == \
            [b"open0", b"open1", b"open2"]
    finally:
        close_quietly(first)
        second.close()


@pytest.mark.parametrize("client", FENCING_CLIENTS)
def test_transaction_timeout_aborts_and_fences(txn_broker, client):
    bootstrap = txn_broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("txn-timeout"), 1)
    producer = txn_producer(client, bootstrap, unique("tx"), timeout_ms=1_000)
    producer.init()
    producer.begin()
    producer.send(topic, b"late")
    producer.flush()
    # the broker looks every 200 ms (FAST_TXNS) for transactions past their timeout
    wait_for(lambda: watermarks(bootstrap, topic, 0, "read_committed") == (0, 2),
             "the coordinator aborting the timed-out transaction", timeout_s=10)
    assert read_all(client, bootstrap, topic, 1) == []
    with pytest.raises(Exception) as raised:
        producer.commit()
    assert _fenced(raised.value), raised.value
    close_quietly(producer)


def _join(consumers: list, expected: int) -> None:
    """Poll every consumer until each owns `expected` partitions."""
    def settled() -> bool:
        for consumer in consumers:
            consumer.poll(0.1)
        return all(len(c.assignment()) == expected for c in consumers)
    wait_for(settled, f"{len(consumers)} members with {expected} partitions each")


def test_zombie_with_stale_generation_is_refused_on_txn_offset_commit(txn_broker):
    bootstrap = txn_broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("kip447"), 2)
    settings = {"bootstrap.servers": bootstrap, "group.id": unique("g"),
                "enable.auto.commit": False, "session.timeout.ms": 6000}
    old_member = Consumer(settings)
    old_member.subscribe([topic])
    _join([old_member], 2)
    stale = old_member.consumer_group_metadata()  # generation 1: it owned both partitions
    new_member = Consumer(settings)
    new_member.subscribe([topic])
    _join([old_member, new_member], 1)  # generation 2: partition moved to the new member

    zombie = txn_producer("confluent", bootstrap, unique("zombie"))  # its own id
    try:
        zombie.init()
        zombie.begin()
        zombie.send(topic, b"copied-by-zombie")
        with pytest.raises(KafkaException) as raised:
            zombie.send_offsets({(topic, 0): 1, (topic, 1): 1}, stale)
        error = raised.value.args[0]
        assert error.code() == KafkaError.ILLEGAL_GENERATION and error.txn_requires_abort()
        zombie.abort()
        # with the member's current generation the same commit goes through
        zombie.begin()
        zombie.send(topic, b"copied")
        zombie.send_offsets({(topic, 0): 1}, old_member.consumer_group_metadata())
        zombie.commit()
    finally:
        old_member.close()
        new_member.close()
    assert read_all("confluent", bootstrap, topic, 2) == [b"copied"]
