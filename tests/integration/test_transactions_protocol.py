"""Each transaction rule of the broker, byte-exact, with a raw protocol client.

Batches are built by hand and every answer is judged by its error code and offsets:

- FindCoordinator for transactional ids; InitProducerId epochs, timeouts, and the
  PRODUCER_FENCED -> INVALID_PRODUCER_EPOCH mapping for versions that predate it
  (InitProducerId < v4; AddPartitionsToTxn, AddOffsetsToTxn, EndTxn < v2);
- KIP-890 part 1: a transactional batch for a partition not added to the transaction
  appends nothing (INVALID_TXN_STATE up to Produce v10, TRANSACTION_ABORTABLE from v11);
  the same check for TxnOffsetCommit without AddOffsetsToTxn; AddPartitionsToTxn v4+
  verify_only;
- AddPartitionsToTxn's topic checks (unknown topics, internal topics);
- read_committed fetches: the LSO, AbortedTransactions for exactly the fetched range;
  ListOffsets latest under read_committed is the LSO;
- OffsetFetch require_stable answers UNSTABLE_OFFSET_COMMIT while transactional offsets
  are pending;
- DescribeTransactions, ListTransactions, DescribeProducers; WriteTxnMarkers (the admin's
  abort of a hanging transaction).
"""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode as E

from onceflow.protocol.records import SimpleRecord, build_batch
from tests.helpers import create_topic, unique
from tests.integration.test_idempotence_rules import log_end_offset, now_ms
from tests.integration.transactions_support import (
    ADD_OFFSETS_TO_TXN,
    ADD_PARTITIONS_TO_TXN,
    TXN_OFFSET_COMMIT,
    add_partitions,
    end_txn,
    find_txn_coordinator,
    init_txn_producer,
    txn_broker,  # noqa: F401, F811 - a fixture
    wait_for,
)
from tests.kafka_raw import RawClient

PRODUCE, FETCH, LIST_OFFSETS, OFFSET_FETCH = 0, 1, 2, 9
DESCRIBE_PRODUCERS, DESCRIBE_TRANSACTIONS, LIST_TRANSACTIONS = 61, 65, 66
WRITE_TXN_MARKERS = 27
READ_UNCOMMITTED, READ_COMMITTED = 0, 1
LATEST = -1


class Txn:
    """One transactional producer driven by hand: (id, pid, epoch) and its sequences."""

    def __init__(self, client: RawClient, topic: str) -> None:
        self.client, self.topic = client, topic
        self.transactional_id = unique("raw-tx")
        find_txn_coordinator(client, self.transactional_id)
        answer = init_txn_producer(client, self.transactional_id)
        assert answer.error_code == E.none
        self.producer_id, self.epoch = answer.producer_id, answer.producer_epoch
        self.sequence = 0

    def add(self, partition: int = 0) -> E:
        errors = add_partitions(self.client, self.transactional_id, self.producer_id,
                                self.epoch, {self.topic: [partition]})
        return errors[(self.topic, partition)]

    def produce(self, count: int = 2, partition: int = 0, version: int = 9,
                transactional: bool = True, epoch: int | None = None):
        records = [SimpleRecord(None, f"{self.sequence + i}".encode()) for i in range(count)]
        batch = build_batch(records, producer_id=self.producer_id,
                            producer_epoch=self.epoch if epoch is None else epoch,
                            base_sequence=self.sequence, transactional=transactional,
                            base_timestamp_ms=now_ms())
        response = self.client.request(PRODUCE, version, {
            "transactional_id": self.transactional_id, "acks": -1, "timeout": 10_000,
            "topic_data": [{"name": self.topic, "partition_data": [
                {"index": partition, "records": batch}]}]})
        answer = response.responses[0].partition_responses[0]
        if answer.error_code == E.none:
            self.sequence += count
        return answer

    def end(self, commit: bool, version: int = 3) -> E:
        return end_txn(self.client, self.transactional_id, self.producer_id, self.epoch,
                       commit, version)


@pytest.fixture
def client(txn_broker):
    with RawClient(txn_broker.bootstrap_servers) as raw:
        yield raw


@pytest.fixture
def topic(txn_broker) -> str:
    return create_topic(txn_broker.bootstrap_servers, unique("raw-txn"), 2)


def _fetch(client: RawClient, topic: str, offset: int, isolation: int, max_bytes: int = 1 << 20):
    response = client.request(FETCH, 11, {
        "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": max_bytes,
        "isolation_level": isolation, "session_id": 0, "session_epoch": -1,
        "forgotten_topics_data": [], "rack_id": "",
        "topics": [{"topic": topic, "partitions": [
            {"partition": 0, "current_leader_epoch": -1, "fetch_offset": offset,
             "log_start_offset": -1, "partition_max_bytes": max_bytes}]}]})
    return response.responses[0].partitions[0]


def _latest(client: RawClient, topic: str, isolation: int) -> int:
    response = client.request(LIST_OFFSETS, 7, {"replica_id": -1, "isolation_level": isolation,
                                                "topics": [{"name": topic, "partitions": [
                                                    {"partition_index": 0,
                                                     "timestamp": LATEST}]}]})
    return response.topics[0].partitions[0].offset


# ---------------------------------------------------------------- coordinator basics


def test_find_coordinator_and_init_producer_id(client, txn_broker):
    port = int(txn_broker.bootstrap_servers.rsplit(":", 1)[1])
    found = find_txn_coordinator(client, "some-id")
    assert (found.error_code, found.node_id, found.port) == (E.none, 0, port)
    assert find_txn_coordinator(client, "").error_code == E.invalid_request
    transactional_id = unique("tx")
    first = init_txn_producer(client, transactional_id)
    again = init_txn_producer(client, transactional_id)
    assert first.error_code == again.error_code == E.none
    assert (again.producer_id, again.producer_epoch) == (first.producer_id, 1)  # fences first
    too_long = init_txn_producer(client, unique("tx"), timeout_ms=15 * 60 * 1000 + 1)
    assert too_long.error_code == E.invalid_transaction_timeout


@pytest.mark.parametrize("version, expected", [(3, E.invalid_producer_epoch),
                                               (4, E.producer_fenced)])
def test_init_producer_id_fenced_error_depends_on_version(client, version, expected):
    transactional_id = unique("tx")
    first = init_txn_producer(client, transactional_id)
    init_txn_producer(client, transactional_id)  # epoch 1: the first instance is stale
    stale = client.request(22, version, {
        "transactional_id": transactional_id, "transaction_timeout": 60_000,
        "producer_id": first.producer_id, "producer_epoch": first.producer_epoch})
    assert stale.error_code == expected


@pytest.mark.parametrize("version, expected", [(1, E.invalid_producer_epoch),
                                               (2, E.producer_fenced)])
def test_old_versions_get_invalid_producer_epoch_instead_of_fenced(client, topic, version,
                                                                   expected):
    txn = Txn(client, topic)
    init_txn_producer(client, txn.transactional_id)  # bumps the epoch: txn is stale
    assert add_partitions(client, txn.transactional_id, txn.producer_id, txn.epoch,
                          {topic: [0]}, version) == {(topic, 0): expected}
    offsets = client.request(ADD_OFFSETS_TO_TXN, version, {
        "transactional_id": txn.transactional_id, "producer_id": txn.producer_id,
        "producer_epoch": txn.epoch, "group_id": unique("g")})
    assert offsets.error_code == expected
    assert txn.end(commit=True, version=version) == expected


def test_add_partitions_checks_topics_before_the_coordinator(client, topic):
    txn = Txn(client, topic)
    missing = unique("missing")
    errors = add_partitions(client, txn.transactional_id, txn.producer_id, txn.epoch,
                            {topic: [0, 1], missing: [0]})
    assert errors == {(topic, 0): E.operation_not_attempted,
                      (topic, 1): E.operation_not_attempted,
                      (missing, 0): E.unknown_topic_or_partition}
    internal = add_partitions(client, txn.transactional_id, txn.producer_id, txn.epoch,
                              {"__consumer_offsets": [0]})
    assert internal == {("__consumer_offsets", 0): E.topic_authorization_failed}
    assert txn.end(commit=True) == E.invalid_txn_state  # nothing was added: no transaction


# ---------------------------------------------------------------- KIP-890 part 1


@pytest.mark.parametrize("version, expected", [(9, E.invalid_txn_state),
                                               (10, E.invalid_txn_state),
                                               (11, E.transaction_abortable)])
def test_batch_for_a_partition_not_in_the_transaction_is_refused(client, topic, version,
                                                                 expected):
    txn = Txn(client, topic)
    assert txn.add(partition=1) == E.none  # partition 1 joins, partition 0 does not
    before = log_end_offset(client, topic)
    assert txn.produce(partition=0, version=version).error_code == expected
    assert log_end_offset(client, topic) == before, "nothing appended"
    assert txn.add(partition=0) == E.none
    assert txn.produce(partition=0, version=version).error_code == E.none


def test_fenced_producer_batch_is_invalid_producer_epoch(client, topic):
    txn = Txn(client, topic)
    assert txn.add() == E.none
    assert txn.produce().error_code == E.none
    init_txn_producer(client, txn.transactional_id)  # aborts with epoch + 1, then + 1 again
    assert txn.produce().error_code == E.invalid_producer_epoch


def test_plain_batch_of_a_producer_with_an_open_transaction_is_refused(client, topic):
    txn = Txn(client, topic)
    assert txn.add() == E.none
    assert txn.produce().error_code == E.none
    assert txn.produce(transactional=False).error_code == E.invalid_txn_state


@pytest.mark.parametrize("version, expected", [(4, E.invalid_txn_state),
                                               (5, E.transaction_abortable)])
def test_add_partitions_verify_only(client, topic, version, expected):
    txn = Txn(client, topic)
    assert txn.add(partition=0) == E.none
    response = client.request(ADD_PARTITIONS_TO_TXN, version, {"transactions": [{
        "transactional_id": txn.transactional_id, "producer_id": txn.producer_id,
        "producer_epoch": txn.epoch, "verify_only": True,
        "topics": [{"name": topic, "partitions": [0, 1]}]}]})
    (result,) = response.results_by_transaction
    errors = {p.partition_index: p.partition_error_code
              for t in result.topic_results for p in t.results_by_partition}
    assert errors == {0: E.none, 1: expected}


@pytest.mark.parametrize("version, expected", [(3, E.invalid_txn_state),
                                               (4, E.transaction_abortable)])
def test_txn_offset_commit_without_add_offsets_is_refused(client, topic, version, expected):
    txn = Txn(client, topic)
    group = unique("g")
    client.request(10, 1, {"key": group, "key_type": 0})  # the group coordinator exists
    assert txn.add() == E.none
    response = _txn_offset_commit(client, txn, group, topic, 5, version)
    assert response == expected


def _txn_offset_commit(client: RawClient, txn: Txn, group: str, topic: str, offset: int,
                       version: int = 3) -> E:
    response = client.request(TXN_OFFSET_COMMIT, version, {
        "transactional_id": txn.transactional_id, "group_id": group,
        "producer_id": txn.producer_id, "producer_epoch": txn.epoch, "generation_id": -1,
        "member_id": "", "group_instance_id": None,
        "topics": [{"name": topic, "partitions": [
            {"partition_index": 0, "committed_offset": offset, "committed_leader_epoch": -1,
             "committed_metadata": ""}]}]})
    return response.topics[0].partitions[0].error_code


# ---------------------------------------------------------------- reading


def test_read_committed_fetch_lso_and_aborted_transactions(client, topic):
    aborter, holder = Txn(client, topic), Txn(client, topic)
    assert aborter.add() == holder.add() == E.none
    assert aborter.produce(3).base_offset == 0     # offsets 0-2
    assert holder.produce(2).base_offset == 3      # offsets 3-4: stays open
    assert aborter.end(commit=False) == E.none     # ABORT marker at 5

    def marker_written() -> bool:
        return _fetch(client, topic, 0, READ_UNCOMMITTED).high_watermark == 6
    wait_for(marker_written, "the ABORT marker")
    assert _latest(client, topic, READ_COMMITTED) == 3  # held by the open transaction
    uncommitted = _fetch(client, topic, 0, READ_UNCOMMITTED)
    assert uncommitted.aborted_transactions is None and uncommitted.last_stable_offset == 3
    held = _fetch(client, topic, 0, READ_COMMITTED)
    assert [(a.producer_id, a.first_offset) for a in held.aborted_transactions] == [
        (aborter.producer_id, 0)]

    assert holder.end(commit=True) == E.none       # COMMIT marker at 6
    wait_for(lambda: _latest(client, topic, READ_COMMITTED) == 7, "the COMMIT marker")
    assert _latest(client, topic, READ_UNCOMMITTED) == 7
    committed = _fetch(client, topic, 0, READ_COMMITTED)
    assert committed.last_stable_offset == committed.high_watermark == 7
    assert [(a.producer_id, a.first_offset) for a in committed.aborted_transactions] == [
        (aborter.producer_id, 0)]
    past = _fetch(client, topic, 6, READ_COMMITTED)  # after the ABORT marker: not listed
    assert past.aborted_transactions == ()


def test_require_stable_while_transactional_offsets_are_pending(client, topic):
    txn = Txn(client, topic)
    group = unique("g")
    client.request(10, 1, {"key": group, "key_type": 0})
    added = client.request(ADD_OFFSETS_TO_TXN, 3, {
        "transactional_id": txn.transactional_id, "producer_id": txn.producer_id,
        "producer_epoch": txn.epoch, "group_id": group})
    assert added.error_code == E.none
    assert _txn_offset_commit(client, txn, group, topic, 42) == E.none

    def fetch(require_stable: bool):
        response = client.request(OFFSET_FETCH, 7, {"group_id": group, "require_stable":
                                                    require_stable, "topics": [
            {"name": topic, "partition_indexes": [0]}]})
        return response.topics[0].partitions[0]

    assert fetch(True).error_code == E.unstable_offset_commit
    assert (fetch(False).error_code, fetch(False).committed_offset) == (E.none, -1)
    assert txn.end(commit=True) == E.none
    wait_for(lambda: fetch(True).committed_offset == 42, "the offsets becoming visible")


# ---------------------------------------------------------------- admin APIs


def test_describe_list_transactions_and_describe_producers(client, topic):
    txn = Txn(client, topic)
    assert txn.add(partition=1) == E.none
    assert txn.produce(partition=1).base_offset == 0
    described = client.request(DESCRIBE_TRANSACTIONS, 0, {
        "transactional_ids": [txn.transactional_id, "never-seen"]}).transaction_states
    assert (described[0].error_code, described[0].transaction_state,
            described[0].producer_id, described[0].producer_epoch) == (
        E.none, "Ongoing", txn.producer_id, txn.epoch)
    assert [(t.topic, tuple(t.partitions)) for t in described[0].topics] == [(topic, (1,))]
    assert described[1].error_code == E.transactional_id_not_found

    listed = client.request(LIST_TRANSACTIONS, 1, {
        "state_filters": ["Ongoing", "NoSuchState"], "producer_id_filters": [txn.producer_id],
        "duration_filter": -1})
    assert listed.error_code == E.none and list(listed.unknown_state_filters) == ["NoSuchState"]
    assert [(t.transactional_id, t.transaction_state) for t in listed.transaction_states] == [
        (txn.transactional_id, "Ongoing")]

    producers = client.request(DESCRIBE_PRODUCERS, 0, {"topics": [
        {"name": topic, "partition_indexes": [1]}]}).topics[0].partitions[0]
    assert producers.error_code == E.none
    (state,) = producers.active_producers
    assert (state.producer_id, state.producer_epoch, state.current_txn_start_offset) == (
        txn.producer_id, txn.epoch, 0)


def test_write_txn_markers_ends_a_hanging_transaction(client, topic):
    txn = Txn(client, topic)
    assert txn.add() == E.none
    assert txn.produce(2).base_offset == 0
    assert _latest(client, topic, READ_COMMITTED) == 0
    missing = unique("missing")
    response = client.request(WRITE_TXN_MARKERS, 1, {"markers": [{
        "producer_id": txn.producer_id, "producer_epoch": txn.epoch,
        "transaction_result": False, "coordinator_epoch": 0,
        "topics": [{"name": topic, "partition_indexes": [0]},
                   {"name": missing, "partition_indexes": [0]}]}]})
    errors = {(t.name, p.partition_index): p.error_code
              for m in response.markers for t in m.topics for p in t.partitions}
    assert errors == {(topic, 0): E.none, (missing, 0): E.unknown_topic_or_partition}
    assert _latest(client, topic, READ_COMMITTED) == 3  # the ABORT marker at 2 ended it
    aborted = _fetch(client, topic, 0, READ_COMMITTED).aborted_transactions
    assert [(a.producer_id, a.first_offset) for a in aborted] == [(txn.producer_id, 0)]
