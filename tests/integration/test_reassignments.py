"""AlterPartitionReassignments / ListPartitionReassignments against a three-node cluster view
(one process, `nodes=3`): the new replicas and leader show in Metadata at once, survive a
restart, and bad assignments get Kafka's errors. Raw requests: confluent-kafka has no
reassignment API."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import ElectionType, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic
from kio.schema.errors import ErrorCode

from onceflow.broker.embedded import Broker
from tests.kafka_raw import RawClient

TIMEOUT_S = 30
ALTER_REASSIGNMENTS, LIST_REASSIGNMENTS, DESCRIBE_CLUSTER = 45, 46, 60


def _replicas(bootstrap: str, topic: str) -> dict[int, tuple[int, list[int]]]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    metadata = admin.list_topics(topic, timeout=TIMEOUT_S).topics[topic]
    return {p.id: (p.leader, list(p.replicas)) for p in metadata.partitions.values()}


def _reassign(bootstrap: str, topic: str, partitions: dict[int, list[int] | None]):
    body = {"timeout": 30000, "topics": [{"name": topic, "partitions": [
        {"partition_index": index, "replicas": replicas}
        for index, replicas in partitions.items()]}]}
    with RawClient(bootstrap) as client:
        response = client.request(ALTER_REASSIGNMENTS, 0, body)
    assert response.error_code == ErrorCode.none
    (topic_response,) = response.responses
    return {p.partition_index: (p.error_code, p.error_message) for p in topic_response.partitions}


def test_reassignment_moves_replicas_and_survives_restart(tmp_path):
    topic = f"moved-{uuid.uuid4().hex[:8]}"
    with Broker(tmp_path, nodes=3) as broker:
        bootstrap = broker.bootstrap_servers
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(TIMEOUT_S)
        before = _replicas(bootstrap, topic)
        target = next(n for n in range(3) if n != before[0][0])
        errors = _reassign(bootstrap, topic, {0: [target, before[0][0]], 5: [0], 1: [7]})
        assert errors[0] == (ErrorCode.none, None)
        assert errors[5][0] == ErrorCode.unknown_topic_or_partition
        assert errors[1][0] == ErrorCode.invalid_replica_assignment and "7" in errors[1][1]
        after = _replicas(bootstrap, topic)
        assert after[0] == (target, [target, before[0][0]])
        assert after[1] == before[1]  # the invalid one changed nothing
        errors = _reassign(bootstrap, topic, {0: None, 1: []})
        assert errors[0][0] == ErrorCode.no_reassignment_in_progress
        assert errors[1][0] == ErrorCode.invalid_replica_assignment
        with RawClient(bootstrap) as client:
            listed = client.request(LIST_REASSIGNMENTS, 0, {"timeout": 30000, "topics": None})
        assert (listed.error_code, listed.topics) == (ErrorCode.none, ())
    with Broker(tmp_path, nodes=3) as broker:
        assert _replicas(broker.bootstrap_servers, topic)[0] == (target, [target, before[0][0]])


@pytest.mark.parametrize("replicas", [[1, 1], [0, 3]])
def test_reassignment_rejects_bad_replica_lists(tmp_path, replicas):
    topic = f"bad-{uuid.uuid4().hex[:8]}"
    with Broker(tmp_path, nodes=3) as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(TIMEOUT_S)
        before = _replicas(broker.bootstrap_servers, topic)
        errors = _reassign(broker.bootstrap_servers, topic, {0: replicas})
        assert errors[0][0] == ErrorCode.invalid_replica_assignment
        assert _replicas(broker.bootstrap_servers, topic) == before


def test_explicit_assignments_in_create_topics_and_partitions(tmp_path):
    topic = f"manual-{uuid.uuid4().hex[:8]}"
    with Broker(tmp_path, nodes=3) as broker:
        bootstrap = broker.bootstrap_servers
        admin = AdminClient({"bootstrap.servers": bootstrap})
        # librdkafka sends num_partitions and replication_factor -1 with an assignment.
        admin.create_topics([NewTopic(topic, 2, replica_assignment=[[2, 0], [1, 2]])])[topic].result(
            TIMEOUT_S)
        assert _replicas(bootstrap, topic) == {0: (2, [2, 0]), 1: (1, [1, 2])}
        for bad, message in (([[0, 5]], "broker 5"), ([[1, 1]], "more than once"),
                             ([[0, 1], [2]], "not consistent")):
            name = f"bad-{uuid.uuid4().hex[:8]}"
            future = admin.create_topics([NewTopic(name, len(bad), replica_assignment=bad)])[name]
            with pytest.raises(KafkaException, match=message) as caught:
                future.result(TIMEOUT_S)
            assert caught.value.args[0].name() == "INVALID_REPLICA_ASSIGNMENT"
        future = admin.create_partitions([NewPartitions(topic, 3, replica_assignment=[[0, 1]])])
        future[topic].result(TIMEOUT_S)
        with pytest.raises(KafkaException, match="broker 9"):
            admin.create_partitions([NewPartitions(topic, 4, replica_assignment=[[0, 9]])])[
                topic].result(TIMEOUT_S)
        assert _replicas(bootstrap, topic)[2] == (0, [0, 1])
    with Broker(tmp_path, nodes=3) as broker:
        assert _replicas(broker.bootstrap_servers, topic) == {
            0: (2, [2, 0]), 1: (1, [1, 2]), 2: (0, [0, 1])}


def test_node_down_preferred_leader_and_fenced_brokers(tmp_path):
    topic = f"down-{uuid.uuid4().hex[:8]}"
    with Broker(tmp_path, nodes=3) as broker:
        bootstrap = broker.bootstrap_servers
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(topic, 1, replica_assignment=[[1, 0]])])[topic].result(
            TIMEOUT_S)
        broker.faults.node_down(1)
        assert _replicas(bootstrap, topic)[0] == (0, [1, 0])
        errors = admin.elect_leaders(ElectionType.PREFERRED, [TopicPartition(topic, 0)]).result(
            TIMEOUT_S)
        assert errors[TopicPartition(topic, 0)].name() == "PREFERRED_LEADER_NOT_AVAILABLE"
        with RawClient(bootstrap) as client:
            response = client.request(DESCRIBE_CLUSTER, 2, {
                "include_cluster_authorized_operations": False, "endpoint_type": 1,
                "include_fenced_brokers": True})
        assert sorted((b.broker_id, b.is_fenced) for b in response.brokers) == [
            (0, False), (1, True), (2, False)]
        broker.faults.node_up(1)
        errors = admin.elect_leaders(ElectionType.PREFERRED, [TopicPartition(topic, 0)]).result(
            TIMEOUT_S)
        assert errors[TopicPartition(topic, 0)].name() == "ELECTION_NOT_NEEDED"
