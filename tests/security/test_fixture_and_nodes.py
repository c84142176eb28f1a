"""The `onceflow_secure_broker` fixture, and several nodes with custom listener names."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from onceflow.broker.embedded import Broker
from tests.security.certs import make_certs

pytestmark = pytest.mark.timeout(120)

WAIT_S = 30


def _produce(settings: dict, topic: str) -> list:
    reports: list = []
    producer = Producer(settings | {"message.timeout.ms": 10_000})
    producer.produce(topic, b"v", on_delivery=lambda err, msg: reports.append(err))
    producer.flush(WAIT_S)
    return reports


def test_secure_fixture(onceflow_secure_broker):
    secure = onceflow_secure_broker
    topic = f"t-{uuid.uuid4().hex[:8]}"
    admin = AdminClient(secure.client_config("admin"))
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=WAIT_S)
    [denied] = _produce(secure.client_config("app"), topic)
    assert denied is not None and denied.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    binding = AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, "User:app",
                         "*", AclOperation.WRITE, AclPermissionType.ALLOW)
    admin.create_acls([binding])[binding].result(timeout=WAIT_S)
    assert _produce(secure.client_config("app", "SCRAM-SHA-256"), topic) == [None]


def test_two_nodes_custom_listener_names_and_advertised(tmp_path):
    certs = make_certs(tmp_path / "certs")
    broker = Broker(tmp_path / "data", nodes=2,
                    listeners="INTERNAL://127.0.0.1:0,CLIENT://127.0.0.1:0",
                    listener_security_protocol_map="INTERNAL:PLAINTEXT,CLIENT:SASL_SSL",
                    advertised_listeners="INTERNAL://localhost:0",
                    ssl_certfile=certs.cert_file, ssl_keyfile=certs.key_file,
                    add_scram=("SCRAM-SHA-512=[name=u,password=p]",))
    with broker:
        internal, client = broker.server.endpoints("INTERNAL"), broker.server.endpoints("CLIENT")
        assert len(internal.split(",")) == len(client.split(",")) == 2
        assert all(a.startswith("localhost:") for a in internal.split(","))
        secure = {"bootstrap.servers": client, "security.protocol": "SASL_SSL",
                  "ssl.ca.location": str(certs.ca_file), "sasl.mechanism": "SCRAM-SHA-512",
                  "sasl.username": "u", "sasl.password": "p"}
        admin = AdminClient(secure)
        metadata = admin.list_topics(timeout=WAIT_S)
        assert sorted(f"{b.host}:{b.port}" for b in metadata.brokers.values()) == sorted(
            client.split(","))
        # A topic with a partition led by each node: produce reaches both over SASL_SSL.
        topic = f"t-{uuid.uuid4().hex[:8]}"
        admin.create_topics([NewTopic(topic, 4, 1)])[topic].result(WAIT_S)
        reports: list = []
        producer = Producer(secure)
        for partition in range(4):
            producer.produce(topic, b"v", partition=partition,
                             on_delivery=lambda err, msg: reports.append(err))
        producer.flush(WAIT_S)
        assert reports == [None] * 4
        plain = AdminClient({"bootstrap.servers": internal}).list_topics(timeout=WAIT_S)
        assert sorted(f"{b.host}:{b.port}" for b in plain.brokers.values()) == sorted(
            internal.split(","))
