"""__transaction_state stays bounded (the shared compactor) and replays to the same state.

A stream of transactions of two transactional ids writes three records each (Ongoing,
PrepareCommit, CompleteCommit) into one `__transaction_state` partition with tiny
segments; the compactor keeps about one record per id, so the partition's size stays
bounded while the appended bytes grow. After a restart the coordinator, loading the
compacted log, knows both ids in their last state with their last epoch.
"""

from __future__ import annotations

import time

from kio.schema.errors import ErrorCode as E

from onceflow.broker.embedded import Broker
from onceflow.storage import PartitionLog
from tests.helpers import create_topic, unique
from tests.integration.transactions_support import (
    add_partitions,
    end_txn,
    find_txn_coordinator,
    init_txn_producer,
)
from tests.kafka_raw import RawClient

DESCRIBE_TRANSACTIONS = 65
TRANSACTIONS = 150  # per id
TINY_SEGMENT_BYTES = 8 * 1024
COMPACTION_INTERVAL_MS = 100
WAIT_S = 20


def _retrying(call, what: str) -> E:
    """Repeat `call` while the coordinator is busy finishing the previous transaction."""
    deadline = time.monotonic() + WAIT_S
    while (error := call()) == E.concurrent_transactions:
        assert time.monotonic() < deadline, what
        time.sleep(0.005)
    return error


def _run_transactions(client: RawClient, topic: str, ids: dict[str, tuple[int, int]]) -> None:
    for _ in range(TRANSACTIONS):
        for transactional_id, (pid, epoch) in ids.items():
            added = _retrying(lambda t=transactional_id, p=pid, e=epoch: add_partitions(
                client, t, p, e, {topic: [0]})[(topic, 0)], "AddPartitionsToTxn")
            assert added == E.none
            assert _retrying(lambda t=transactional_id, p=pid, e=epoch: end_txn(
                client, t, p, e, commit=True), "EndTxn") == E.none


def _described(client: RawClient, ids: list[str]) -> list[tuple]:
    deadline = time.monotonic() + WAIT_S
    while True:
        states = client.request(DESCRIBE_TRANSACTIONS, 0, {"transactional_ids": ids})
        answers = [(s.transactional_id, s.error_code, s.transaction_state, s.producer_id,
                    s.producer_epoch) for s in states.transaction_states]
        if all(a[1] != E.coordinator_load_in_progress and a[2] != "PrepareCommit"
               for a in answers):
            return answers
        assert time.monotonic() < deadline, answers
        time.sleep(0.05)


def _wait_compacted(txn_log: PartitionLog) -> None:
    deadline = time.monotonic() + WAIT_S
    while txn_log.size_bytes > TINY_SEGMENT_BYTES + 2048:
        assert time.monotonic() < deadline, txn_log.segment_base_offsets
        time.sleep(COMPACTION_INTERVAL_MS / 1000)


def test_transaction_state_stays_bounded_and_replays(tmp_path):
    settings = {"transaction_state_num_partitions": 1, "offsets_topic_num_partitions": 1,
                "fsync": False, "transaction_state_segment_bytes": TINY_SEGMENT_BYTES,
                "offsets_compaction_interval_ms": COMPACTION_INTERVAL_MS}
    names = [unique("bounded-a"), unique("bounded-b")]
    with Broker(tmp_path / "data", **settings) as broker:
        with RawClient(broker.bootstrap_servers) as client:
            topic = create_topic(broker.bootstrap_servers, unique("txn-compaction"), 1)
            find_txn_coordinator(client, names[0])
            ids = {}
            for name in names:
                answer = init_txn_producer(client, name)
                ids[name] = (answer.producer_id, answer.producer_epoch)
            _run_transactions(client, topic, ids)
            before = _described(client, names)
            runtime = broker.server.txns
            txn_log = runtime.partition_log(0)
            appended = txn_log.log_end_offset
            _wait_compacted(txn_log)
            compactions = len(runtime.compactor.history)
    assert appended >= 3 * TRANSACTIONS * len(names)
    assert compactions > 0
    assert [b[2] for b in before] == ["CompleteCommit", "CompleteCommit"]
    with Broker(tmp_path / "data", **settings) as broker:  # replay of the compacted log
        with RawClient(broker.bootstrap_servers) as client:
            assert _described(client, names) == before
            again = init_txn_producer(client, names[0])
            assert (again.producer_id, again.producer_epoch) == (ids[names[0]][0],
                                                                ids[names[0]][1] + 1)
