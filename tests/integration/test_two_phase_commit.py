"""KIP-939 on a real broker: InitProducerId v6 over the raw protocol and through onceflow's
client layer, the broker setting, the TwoPhaseCommit ACL, and completing another process's
transaction by (transactional id, producer id, epoch) - the path without KIP-939."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Producer
from kio.schema.errors import ErrorCode

from onceflow.client import transactions as txns
from onceflow.client.admin import ClientError
from onceflow.client.cluster import Cluster
from onceflow.client.wire import Connection
from onceflow.protocol.apis import ApiKey
from onceflow.protocol.records import SimpleRecord, build_batch
from onceflow.security.acl import Operation, PatternType, Permission, ResourceType
from tests.helpers import create_topic, unique
from tests.integration.transactions_support import (
    FAST_TXNS,
    INIT_PRODUCER_ID,
    add_partitions,
    end_txn,
    find_txn_coordinator,
    read_all,
    wait_for,
)
from tests.kafka_raw import RawClient

E = ErrorCode
PRODUCE = 0


@pytest.fixture(scope="module")
def two_pc_broker():
    from onceflow.broker.embedded import Broker

    with Broker(**FAST_TXNS, transaction_two_phase_commit_enable=True) as broker:
        yield broker


def init_v6(client: RawClient, transactional_id: str, *, two_pc: bool, keep: bool,
            timeout_ms: int = 1_000):
    return client.request(INIT_PRODUCER_ID, 6, {
        "transactional_id": transactional_id, "transaction_timeout": timeout_ms,
        "producer_id": -1, "producer_epoch": -1, "enable2_pc": two_pc,
        "keep_prepared_txn": keep})


def produce_txn(client: RawClient, transactional_id: str, topic: str, pid: int, epoch: int,
                values: list[bytes]) -> ErrorCode:
    batch = build_batch([SimpleRecord(key=None, value=v) for v in values], producer_id=pid,
                        producer_epoch=epoch, base_sequence=0, transactional=True)
    response = client.request(PRODUCE, 9, {
        "transactional_id": transactional_id, "acks": -1, "timeout": 5000,
        "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": batch}]}]})
    return response.responses[0].partition_responses[0].error_code


def committed(bootstrap: str, topic: str) -> list[bytes]:
    return read_all("confluent", bootstrap, topic, 1, "read_committed")


def test_prepared_transaction_survives_its_timeout_and_a_new_instance_commits_it(two_pc_broker):
    bootstrap = two_pc_broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("2pc"))
    txn_id = unique("2pc-writer")
    with RawClient(bootstrap) as writer:
        assert find_txn_coordinator(writer, txn_id).error_code == E.none
        first = init_v6(writer, txn_id, two_pc=True, keep=False)
        assert first.error_code == E.none, first
        pid, epoch = first.producer_id, first.producer_epoch
        assert add_partitions(writer, txn_id, pid, epoch, {topic: [0]}) == {(topic, 0): E.none}
        assert produce_txn(writer, txn_id, topic, pid, epoch, [b"a", b"b"]) == E.none
    # the writer is gone. Its 1 s timeout is not applied (the broker looks every 200 ms):
    with Cluster.connect(bootstrap) as cluster:
        time.sleep(1.5)  # longer than the requested timeout; the assertion is on state
        described = txns.describe_transaction(cluster, txn_id)
        assert (described.state, described.timeout_ms) == ("Ongoing", 2**31 - 1)
    assert committed(bootstrap, topic) == []
    with RawClient(bootstrap) as recoverer:
        kept = init_v6(recoverer, txn_id, two_pc=True, keep=True)
        assert kept.error_code == E.none, kept
        assert (kept.ongoing_txn_producer_id, kept.ongoing_txn_producer_epoch) == (pid, epoch)
        assert (kept.producer_id, kept.producer_epoch) == (pid, epoch + 1)
        assert end_txn(recoverer, txn_id, pid, epoch, commit=True) == E.producer_fenced
        assert end_txn(recoverer, txn_id, pid, epoch + 1, commit=True) == E.none
    wait_for(lambda: committed(bootstrap, topic) == [b"a", b"b"], "the kept transaction")


def test_two_phase_commit_is_off_by_default(onceflow_broker):
    txn_id = unique("2pc-off")
    with RawClient(onceflow_broker.bootstrap_servers) as client:
        assert find_txn_coordinator(client, txn_id).error_code == E.none
        wait_for(lambda: init_v6(client, txn_id, two_pc=True, keep=False).error_code
                 != E.coordinator_not_available, "the transaction coordinator")
        answer = init_v6(client, txn_id, two_pc=True, keep=False)
        assert answer.error_code == E.transactional_id_authorization_failed
        assert init_v6(client, txn_id, two_pc=False, keep=False).error_code == E.none
        older = client.request(INIT_PRODUCER_ID, 5, {
            "transactional_id": txn_id, "transaction_timeout": 60_000,
            "producer_id": -1, "producer_epoch": -1})
        assert older.error_code == E.none
        assert init_v6(client, None, two_pc=True, keep=False).error_code == E.invalid_request


def librdkafka_prepared(bootstrap: str, topic: str, txn_id: str, values: list[bytes]) -> None:
    """A librdkafka transaction written and flushed, then its producer dropped uncommitted."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id,
                         "transaction.timeout.ms": 60_000})
    producer.init_transactions(30)
    producer.begin_transaction()
    for value in values:
        producer.produce(topic, value, partition=0)
    assert producer.flush(30) == 0
    del producer


@pytest.mark.parametrize("commit", [True, False])
def test_client_layer_completes_a_librdkafka_transaction_by_id_and_epoch(onceflow_broker, commit):
    """The path for brokers without KIP-939 (Flink's): EndTxn at the epoch of the writer."""
    bootstrap = onceflow_broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("by-epoch"))
    txn_id = unique("by-epoch")
    librdkafka_prepared(bootstrap, topic, txn_id, [b"x", b"y"])
    with Cluster.connect(bootstrap) as cluster:
        described = txns.describe_transaction(cluster, txn_id)
        assert described.state == "Ongoing"
        assert txns.end_txn(cluster, txn_id, described.producer_id, described.producer_epoch,
                            commit) == E.none
        # ending again: nothing is open any more
        again = txns.end_txn(cluster, txn_id, described.producer_id, described.producer_epoch,
                             commit)
        assert again in (E.none, E.invalid_txn_state)
    wait_for(lambda: txns_state(bootstrap, txn_id) in ("CompleteCommit", "CompleteAbort"),
             "the markers")
    assert committed(bootstrap, topic) == ([b"x", b"y"] if commit else [])


def txns_state(bootstrap: str, txn_id: str) -> str:
    with Cluster.connect(bootstrap) as cluster:
        return txns.describe_transaction(cluster, txn_id).state


def test_client_layer_keeps_a_librdkafka_transaction_with_kip_939(two_pc_broker):
    bootstrap = two_pc_broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("kept"))
    txn_id = unique("kept")
    librdkafka_prepared(bootstrap, topic, txn_id, [b"1", b"2", b"3"])
    with Cluster.connect(bootstrap) as cluster:
        assert txns.supports_two_phase_commit(cluster, txn_id)
        before = txns.describe_transaction(cluster, txn_id)
        kept = txns.init_producer_id(cluster, txn_id, transaction_timeout_ms=60_000,
                                     enable_2pc=True, keep_prepared_txn=True)
        assert (kept.ongoing_producer_id, kept.ongoing_producer_epoch) == (
            before.producer_id, before.producer_epoch)
        assert txns.end_txn(cluster, txn_id, kept.producer_id, kept.producer_epoch,
                            commit=True) == E.none
    wait_for(lambda: committed(bootstrap, topic) == [b"1", b"2", b"3"], "the commit")


def test_client_layer_reports_refused_two_phase_commit(onceflow_broker):
    with (Cluster.connect(onceflow_broker.bootstrap_servers) as cluster,
          pytest.raises(ClientError, match="TRANSACTIONAL_ID_AUTHORIZATION_FAILED")):
        txns.init_producer_id(cluster, unique("refused"), transaction_timeout_ms=60_000,
                              enable_2pc=True, keep_prepared_txn=True)


def test_two_phase_commit_needs_the_two_phase_commit_acl(tmp_path):
    from onceflow.broker.embedded import Broker

    users = ("SCRAM-SHA-256=[name=admin,password=admin-secret]",
             "SCRAM-SHA-256=[name=app,password=app-secret]")
    txn_id = "acl-2pc"
    with Broker(tmp_path / "data", listeners="SASL_PLAINTEXT://127.0.0.1:0", add_scram=users,
                authorizer=True, super_users=("User:admin",),
                transaction_two_phase_commit_enable=True, **FAST_TXNS) as broker:
        host, port = broker.bootstrap_servers.split(",")[0].rsplit(":", 1)

        def connect(user: str) -> Connection:
            return Connection(host, int(port), properties={
                "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256",
                "sasl.username": user, "sasl.password": f"{user}-secret"})

        def grant(operation: Operation) -> None:
            with connect("admin") as admin:
                answer = admin.call(ApiKey.CREATE_ACLS, (1, 3), creations=[{
                    "resource_type": ResourceType.TRANSACTIONAL_ID, "resource_name": txn_id,
                    "resource_pattern_type": PatternType.LITERAL, "principal": "User:app",
                    "host": "*", "operation": operation, "permission_type": Permission.ALLOW}])
                assert [r.error_code for r in answer.results] == [E.none]

        def init(two_pc: bool) -> ErrorCode:
            with connect("app") as app:
                for _ in range(100):  # the coordinator's partition may still be loading
                    app.call(ApiKey.FIND_COORDINATOR, (1, 3), key=txn_id, key_type=1)
                    answer = app.call(ApiKey.INIT_PRODUCER_ID, (6, 6), transactional_id=txn_id,
                                      transaction_timeout=60_000, producer_id=-1,
                                      producer_epoch=-1, enable2_pc=two_pc,
                                      keep_prepared_txn=False)
                    if answer.error_code not in (E.coordinator_not_available,
                                                 E.coordinator_load_in_progress):
                        return answer.error_code
                    time.sleep(0.1)
            raise AssertionError("the transaction coordinator never became available")

        assert init(two_pc=False) == E.transactional_id_authorization_failed  # no Write
        grant(Operation.WRITE)
        assert init(two_pc=False) == E.none
        assert init(two_pc=True) == E.transactional_id_authorization_failed  # Write is not enough
        grant(Operation.TWO_PHASE_COMMIT)
        assert init(two_pc=True) == E.none
