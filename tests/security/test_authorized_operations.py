"""Authorized operations with the authorizer on: DescribeTopics / DescribeTopicPartitions and
DescribeCluster report exactly what the principal's ACLs allow (SASL_PLAINTEXT, SCRAM)."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import TopicCollection
from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType, AdminClient,
                                   NewTopic, ResourcePatternType, ResourceType)

from onceflow.broker.embedded import Broker

pytestmark = pytest.mark.timeout(180)
WAIT_S = 30


def _client(broker: Broker, user: str, password: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": broker.bootstrap_servers,
                        "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
                        "sasl.username": user, "sasl.password": password})


def test_operations_follow_acls(tmp_path):
    with Broker(tmp_path, listeners="SASL_PLAINTEXT://127.0.0.1:0",
                add_scram=("SCRAM-SHA-512=[name=admin,password=admin-secret]",
                           "SCRAM-SHA-512=[name=app,password=app-secret]"),
                authorizer=True, super_users=("User:admin",)) as broker:
        admin = _client(broker, "admin", "admin-secret")
        topic = f"ops-{uuid.uuid4().hex[:8]}"
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(WAIT_S)
        bindings = [AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, "User:app",
                               "*", operation, AclPermissionType.ALLOW)
                    for operation in (AclOperation.READ, AclOperation.DESCRIBE_CONFIGS)]
        bindings.append(AclBinding(ResourceType.BROKER, "kafka-cluster",
                                   ResourcePatternType.LITERAL, "User:app", "*",
                                   AclOperation.IDEMPOTENT_WRITE, AclPermissionType.ALLOW))
        for future in admin.create_acls(bindings).values():
            future.result(WAIT_S)
        app = _client(broker, "app", "app-secret")
        [described] = app.describe_topics(TopicCollection([topic]),
                                          include_authorized_operations=True).values()
        # READ implies DESCRIBE (Kafka's implied operations).
        assert sorted(op.name for op in described.result(WAIT_S).authorized_operations) == [
            "DESCRIBE", "DESCRIBE_CONFIGS", "READ"]
        cluster = app.describe_cluster(include_authorized_operations=True).result(WAIT_S)
        assert [op.name for op in cluster.authorized_operations] == ["IDEMPOTENT_WRITE"]
