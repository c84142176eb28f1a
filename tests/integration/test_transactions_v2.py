"""Transactions V2 (KIP-890 part 2) with Kafka 4's request sequence (txn_v2_support.py).

- commit and abort: the broker adds partitions itself (Produce v12, TxnOffsetCommit v5),
  every EndTxn v5 bumps the epoch and answers it, read_committed readers see exactly the
  committed transactions, and a V1 client keeps working on the same broker;
- the late write: a Produce whose answer was lost is retried after the transaction
  committed - V2 refuses it (its epoch is fenced) instead of letting it land in the next
  transaction;
- bad input: EndTxn with the epoch of before a bump, a commit with nothing open;
- broker restarts (SIGKILL) in each state: Ongoing, PrepareCommit, CompleteCommit.
"""

from __future__ import annotations

from confluent_kafka import Consumer
from kio.schema.errors import ErrorCode

from onceflow.broker.faults import CRASH_EXIT_CODE
from onceflow.testing import free_port
from tests.helpers import TIMEOUT_S, create_topic, unique
from tests.integration.test_transactions_crash import _crash_after
from tests.integration.transactions_support import (
    FAST_TXNS,
    FAST_TXNS_ARGS,
    ConfluentTxn,
    read_all,
    wait_for,
)
from tests.integration.txn_v2_support import V2Producer, finalized_features
from tests.kafka_raw import RawClient

E = ErrorCode
DESCRIBE_TRANSACTIONS = 65
EXIT_WAIT_S = 30


def _describe(bootstrap: str, transactional_id: str):
    with RawClient(bootstrap) as client:
        response = client.request(DESCRIBE_TRANSACTIONS, 0,
                                  {"transactional_ids": [transactional_id]})
    return response.transaction_states[0]


def _committed_offset(bootstrap: str, group: str, topic: str, partition: int) -> int:
    from confluent_kafka import TopicPartition
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        (found,) = consumer.committed([TopicPartition(topic, partition)], timeout=TIMEOUT_S)
    finally:
        consumer.close()
    return found.offset


def test_v2_commits_aborts_and_bumps_the_epoch_per_transaction():
    from onceflow.broker.embedded import Broker

    with Broker(**FAST_TXNS, transaction_version=2) as broker:
        bootstrap = broker.bootstrap_servers
        assert finalized_features(bootstrap) == {"group.version": 1, "transaction.version": 2,
                                             "metadata.version": 24}
        topic = create_topic(bootstrap, unique("v2-out"), 2)
        source = create_topic(bootstrap, unique("v2-in"), 1)
        group = unique("v2-group")
        producer = V2Producer(bootstrap, unique("v2-tx"))
        producer.init()
        first_epoch = producer.epoch
        assert producer.send(topic, 0, [b"a", b"b"])[0] == E.none
        assert producer.send(topic, 1, [b"c"])[0] == E.none
        assert producer.send(topic, 0, [b"d"])[0] == E.none  # same partition, next sequence
        assert producer.send_offsets(group, {(source, 0): 5}) == {(source, 0): E.none}
        assert _describe(bootstrap, producer.transactional_id).transaction_state == "Ongoing"
        assert producer.end(commit=True) == E.none
        assert producer.epoch == first_epoch + 1  # EndTxn v5 answered the bumped epoch

        assert producer.send(topic, 0, [b"x"])[0] == E.none  # sequence 0 again, new epoch
        assert producer.end(commit=False) == E.none
        assert producer.epoch == first_epoch + 2

        # an abort with nothing sent: Empty/Complete* -> PrepareAbort (V2 only), epoch + 1
        # (while the markers are written, Kafka's V2 rules fence an EndTxn at the new epoch)
        wait_for(lambda: _describe(bootstrap, producer.transactional_id).transaction_state
                 == "CompleteAbort", "the abort to complete")
        response = producer.end_txn(commit=False)
        assert (response.error_code, response.producer_epoch) == (E.none, first_epoch + 3)
        wait_for(lambda: _describe(bootstrap, producer.transactional_id).transaction_state
                 == "CompleteAbort", "the empty abort to complete")
        assert _describe(bootstrap, producer.transactional_id).producer_epoch == first_epoch + 3

        assert read_all("confluent", bootstrap, topic, 2) == [b"a", b"b", b"d", b"c"]
        assert read_all("confluent", bootstrap, topic, 2, "read_uncommitted") == [
            b"a", b"b", b"d", b"x", b"c"]
        assert _committed_offset(bootstrap, group, source, 0) == 5

        v1 = ConfluentTxn(bootstrap, unique("v1-tx"))  # librdkafka: V1 on the same broker
        v1.init()
        v1.begin()
        v1.send(topic, b"v1", partition=1)
        v1.commit()
        assert read_all("confluent", bootstrap, topic, 2)[-1] == b"v1"
        producer.close()


def test_v2_refuses_a_late_write_of_a_finished_transaction():
    """The Produce of transaction N is performed but its answer lost (the connection
    closes); the producer commits N; the retry of that Produce arrives during N+1. V2:
    refused with INVALID_PRODUCER_EPOCH, N+1 unaffected, every record once."""
    from onceflow.broker.embedded import Broker

    with Broker(**FAST_TXNS, transaction_version=2) as broker:
        bootstrap = broker.bootstrap_servers
        topic = create_topic(bootstrap, unique("late"), 1)
        producer = V2Producer(bootstrap, unique("late-tx"))
        producer.init()
        late = producer.batch(topic, 0, [b"n-1"])
        broker.faults.close_connections("produce", perform=True)
        try:
            producer.produce(topic, 0, late)
            raise AssertionError("the answer should have been lost")
        except ConnectionError:
            producer.reconnect()
        assert producer.end(commit=True) == E.none  # N: n-1 committed

        assert producer.send(topic, 0, [b"n+1"])[0] == E.none  # N+1 open on the partition
        error, _ = producer.produce(topic, 0, late)  # the late retry of N's batch
        assert error == E.invalid_producer_epoch
        assert producer.end(commit=True) == E.none

        assert read_all("confluent", bootstrap, topic, 1) == [b"n-1", b"n+1"]
        assert read_all("confluent", bootstrap, topic, 1, "read_uncommitted") == [
            b"n-1", b"n+1"]
        producer.close()


def test_v2_bad_input():
    from onceflow.broker.embedded import Broker

    with Broker(**FAST_TXNS, transaction_version=2) as broker:
        bootstrap = broker.bootstrap_servers
        topic = create_topic(bootstrap, unique("v2-bad"), 1)
        producer = V2Producer(bootstrap, unique("v2-bad-tx"))
        producer.init()
        assert producer.end_txn(commit=True).error_code == E.invalid_txn_state  # nothing open
        old_epoch = producer.epoch
        assert producer.send(topic, 0, [b"a"])[0] == E.none
        assert producer.end(commit=True) == E.none
        # the old epoch again: a retry of that commit answers NONE with the new epoch...
        # (CONCURRENT_TRANSACTIONS while the markers are written, as Kafka answers)
        retry = _until_not_concurrent(lambda: producer.end_txn(commit=True, epoch=old_epoch))
        assert (retry.error_code, retry.producer_epoch) == (E.none, old_epoch + 1)
        # ...an abort with it is not a retry of anything, and older epochs are fenced
        assert producer.end_txn(commit=False, epoch=old_epoch).error_code == E.invalid_txn_state
        assert producer.end_txn(commit=True, epoch=old_epoch - 1).error_code == E.producer_fenced
        assert producer.end_txn(commit=True, producer_id=producer.producer_id + 99
                                ).error_code == E.invalid_producer_id_mapping
        # a Produce with the old epoch is refused at the coordinator, nothing is appended
        error, _ = producer.produce(topic, 0, _batch_with_epoch(producer, topic, old_epoch))
        assert error == E.invalid_producer_epoch
        assert read_all("confluent", bootstrap, topic, 1, "read_uncommitted") == [b"a"]
        producer.close()


def _batch_with_epoch(producer: V2Producer, topic: str, epoch: int) -> bytes:
    current = producer.epoch
    producer.epoch = epoch
    try:
        return producer.batch(topic, 0, [b"zombie"])
    finally:
        producer.epoch = current


def test_v2_survives_broker_restarts_in_each_state(onceflow_broker_process):
    admin_port = free_port()
    broker = onceflow_broker_process(args=(*FAST_TXNS_ARGS, "--transaction-version", "2",
                                           "--admin-port", str(admin_port)))
    bootstrap = broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("v2-restart"), 1)
    producer = V2Producer(bootstrap, unique("v2-restart-tx"))
    producer.init()

    # Ongoing: the transaction survives and commits after the restart
    assert producer.send(topic, 0, [b"ongoing"])[0] == E.none
    _restart(broker, producer)
    assert _describe(bootstrap, producer.transactional_id).transaction_state == "Ongoing"
    assert producer.end(commit=True) == E.none

    # PrepareCommit: the broker dies before any marker; the client's retry (same epoch)
    # is answered with the bumped epoch once the restarted coordinator completes it
    assert producer.send(topic, 0, [b"prepared"])[0] == E.none
    epoch = producer.epoch
    _crash_after(admin_port, "prepare_commit")
    try:
        producer.end_txn(commit=True)
    except ConnectionError:
        pass
    assert broker.process.wait(timeout=EXIT_WAIT_S) == CRASH_EXIT_CODE
    broker.start()
    producer.reconnect()
    retry = _until_not_concurrent(lambda: producer.end_txn(commit=True))
    assert (retry.error_code, retry.producer_epoch) == (E.none, epoch + 1)
    producer.epoch, producer.started = retry.producer_epoch, False
    producer.sequences.clear()

    # CompleteCommit: the next transaction goes on with the epoch from before the restart
    _restart(broker, producer)
    assert _describe(bootstrap, producer.transactional_id).transaction_state == "CompleteCommit"
    assert producer.send(topic, 0, [b"after"])[0] == E.none
    assert producer.end(commit=True) == E.none
    assert read_all("confluent", bootstrap, topic, 1) == [b"ongoing", b"prepared", b"after"]
    producer.close()


def _restart(broker, producer: V2Producer) -> None:
    """SIGKILL, start again, and wait until the coordinator has loaded its partitions."""
    producer.reconnect()
    broker.kill()
    broker.start()
    wait_for(lambda: _describe(broker.bootstrap_servers, producer.transactional_id).error_code
             != E.coordinator_load_in_progress, "the coordinator to load")


def _until_not_concurrent(call, attempts: int = 100):
    """The coordinator answers CONCURRENT_TRANSACTIONS until its markers are written."""
    import time
    for _ in range(attempts):
        response = call()
        if response.error_code not in (E.concurrent_transactions,
                                       E.coordinator_load_in_progress):
            return response
        time.sleep(0.1)
    raise AssertionError("the transaction never completed")
