"""Transactions survive broker crashes (the broker runs as a process and is killed).

- The worst moment: the broker dies right after PrepareCommit is durable and before any
  COMMIT marker is written (the `crash_after("prepare_commit")` fault makes it exit
  there). After the restart the coordinator finds the transaction in PrepareCommit and
  writes its markers again; the producer's retried commit succeeds, read_committed
  readers see the records, every partition's LSO moves to its end, and the offsets sent
  to the transaction become the group's committed offsets.
- SIGKILL with an aborted and an open transaction in a partition: after the restart the
  LSO is still held at the open transaction's first offset and the aborted records stay
  hidden, even when the aborted-transaction index file was lost with the crash (it is
  rebuilt from the log); the open transaction then commits normally.
"""

from __future__ import annotations

import json
import threading
import urllib.request

from confluent_kafka import Consumer, TopicPartition

from onceflow.broker.faults import CRASH_EXIT_CODE
from onceflow.storage.txn_index import TXN_INDEX_SUFFIX, decode_entries
from onceflow.testing import free_port
from tests.helpers import TIMEOUT_S, create_topic, unique
from tests.integration.transactions_support import (
    FAST_TXNS_ARGS,
    ConfluentTxn,
    read_all,
    watermarks,
)

PARTITIONS = 2
EXIT_WAIT_S = 30
# The producer must notice the restarted broker soon (librdkafka backs off up to 10 s).
RECONNECT_FAST = {"reconnect.backoff.max.ms": 500}


def _crash_after(admin_port: int, point: str) -> None:
    request = urllib.request.Request(
        f"http://127.0.0.1:{admin_port}/faults", method="POST",
        data=json.dumps({"kind": "crash_after", "point": point}).encode())
    with urllib.request.urlopen(request, timeout=TIMEOUT_S) as answer:
        assert answer.status == 201


def _committed(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        found = consumer.committed([TopicPartition(topic, p) for p in range(PARTITIONS)],
                                   timeout=TIMEOUT_S)
    finally:
        consumer.close()
    return {tp.partition: tp.offset for tp in found}


def test_kill_between_prepare_commit_and_markers_completes_after_restart(
        onceflow_broker_process):
    admin_port = free_port()
    broker = onceflow_broker_process(args=(*FAST_TXNS_ARGS, "--admin-port", str(admin_port)))
    bootstrap = broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("crash-out"), PARTITIONS)
    source = create_topic(bootstrap, unique("crash-in"), PARTITIONS)
    group = unique("copier")
    metadata_consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    values = [f"v{i}".encode() for i in range(10)]

    producer = ConfluentTxn(bootstrap, unique("tx"), config=RECONNECT_FAST)
    producer.init()
    producer.begin()
    for i, value in enumerate(values):
        producer.send(topic, value, partition=i % PARTITIONS)
    producer.send_offsets({(source, 0): 7, (source, 1): 9},
                          metadata_consumer.consumer_group_metadata())
    producer.flush()
    assert watermarks(bootstrap, topic, 0, "read_committed") == (0, 0)

    _crash_after(admin_port, "prepare_commit")
    outcome: list[BaseException | None] = []

    def commit() -> None:
        try:
            producer.producer.commit_transaction(60)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - reported below
            outcome.append(exc)

    committer = threading.Thread(target=commit)
    committer.start()
    assert broker.process.wait(timeout=EXIT_WAIT_S) == CRASH_EXIT_CODE
    assert "crashing at prepare_commit" in broker.log_path.read_text()
    broker.start()  # same data directory and port: loads PrepareCommit, writes the markers
    committer.join(timeout=90)
    assert outcome == [None], f"the retried commit failed: {outcome}"

    assert read_all("confluent", bootstrap, topic, PARTITIONS) == [
        v for p in range(PARTITIONS) for v in values[p::PARTITIONS]]
    for partition in range(PARTITIONS):  # 5 records and the COMMIT marker each
        assert watermarks(bootstrap, topic, partition, "read_committed") == (0, 6)
    assert _committed(bootstrap, group, source) == {0: 7, 1: 9}
    metadata_consumer.close()


def test_sigkill_keeps_lso_and_rebuilds_the_aborted_index(onceflow_broker_process):
    broker = onceflow_broker_process(args=FAST_TXNS_ARGS)
    bootstrap = broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("crash-index"), 1)
    producer = ConfluentTxn(bootstrap, unique("tx"), config=RECONNECT_FAST)
    producer.init()
    producer.begin()
    for i in range(3):
        producer.send(topic, f"aborted{i}".encode())
    producer.abort()  # offsets 0-2, ABORT marker at 3
    producer.begin()
    for i in range(2):
        producer.send(topic, f"open{i}".encode())
    producer.flush()  # offsets 4-5, open

    index_file = broker.data_dir / f"{topic}-0" / f"{0:020d}{TXN_INDEX_SUFFIX}"
    entries, problem = decode_entries(index_file.read_bytes())
    assert problem is None and [(e.first_offset, e.last_offset) for e in entries] == [(0, 3)]
    broker.kill()
    index_file.unlink()  # lost with the crash: the restart must rebuild it from the log
    broker.start()

    assert watermarks(bootstrap, topic, 0, "read_committed") == (0, 4)  # held by "open"
    for client in ("confluent", "kafka-python"):
        assert read_all(client, bootstrap, topic, 1) == [], client
    entries, problem = decode_entries(index_file.read_bytes())
    assert problem is None and [(e.first_offset, e.last_offset) for e in entries] == [(0, 3)]

    producer.commit()  # the coordinator kept the open transaction across the crash
    assert watermarks(bootstrap, topic, 0, "read_committed") == (0, 7)
    for client in ("confluent", "kafka-python"):
        assert read_all(client, bootstrap, topic, 1) == [b"open0", b"open1"], client
    assert read_all("confluent", bootstrap, topic, 1, "read_uncommitted") == [
        b"aborted0", b"aborted1", b"aborted2", b"open0", b"open1"]
