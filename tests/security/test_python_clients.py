"""kafka-python and aiokafka over SASL_SSL with SCRAM-SHA-512 and SCRAM-SHA-256: log in,
are refused on a topic without ACLs, then produce and consume with the ACLs."""

from __future__ import annotations

import asyncio
import ssl
import uuid

import pytest
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from onceflow.broker.embedded import Broker
from tests.security.certs import make_certs

pytestmark = pytest.mark.timeout(180)

WAIT_S = 30


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    directory = tmp_path_factory.mktemp("pyclients")
    certs = make_certs(directory / "certs")
    broker = Broker(directory / "data", listeners="SASL_SSL://127.0.0.1:0",
                    ssl_certfile=certs.cert_file, ssl_keyfile=certs.key_file,
                    add_scram=("SCRAM-SHA-512=[name=admin,password=admin-secret]",
                               "SCRAM-SHA-512=[name=app,password=app-secret]",
                               "SCRAM-SHA-256=[name=app,password=app-secret]"),
                    authorizer=True, super_users=("User:admin",),
                    group_initial_rebalance_delay_ms=0)
    with broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers,
                             "security.protocol": "SASL_SSL",
                             "ssl.ca.location": str(certs.ca_file),
                             "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "admin",
                             "sasl.password": "admin-secret"})
        yield broker, certs, admin


def _allow(admin: AdminClient, topic: str, group: str) -> None:
    def binding(rtype, name, operation):
        return AclBinding(rtype, name, ResourcePatternType.LITERAL, "User:app", "*", operation,
                          AclPermissionType.ALLOW)
    futures = admin.create_acls([binding(ResourceType.TOPIC, topic, AclOperation.ALL),
                                 binding(ResourceType.GROUP, group, AclOperation.READ)])
    for future in futures.values():
        future.result(timeout=WAIT_S)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "SCRAM-SHA-256"])
def test_kafka_python(secure, mechanism):
    import kafka
    from kafka.errors import TopicAuthorizationFailedError

    broker, certs, admin = secure
    topic, group = f"kp-{uuid.uuid4().hex[:8]}", f"kp-g-{uuid.uuid4().hex[:8]}"
    settings = dict(bootstrap_servers=broker.bootstrap_servers, security_protocol="SASL_SSL",
                    ssl_cafile=str(certs.ca_file), sasl_mechanism=mechanism,
                    sasl_plain_username="app", sasl_plain_password="app-secret")
    # Granted first: kafka-python's producer is idempotent, and InitProducerId needs Write
    # on some topic (or IdempotentWrite), else its producer fails for good, as with Kafka.
    _allow(admin, topic, group)
    producer = kafka.KafkaProducer(**settings, max_block_ms=10_000)
    try:
        with pytest.raises(TopicAuthorizationFailedError):
            producer.send(f"{topic}-denied", b"denied").get(timeout=WAIT_S)
        for i in range(5):
            producer.send(topic, f"v{i}".encode()).get(timeout=WAIT_S)
    finally:
        producer.close()
    consumer = kafka.KafkaConsumer(topic, **settings, group_id=group,
                                   auto_offset_reset="earliest", consumer_timeout_ms=20_000)
    try:
        values = [m.value for _, m in zip(range(5), consumer)]
    finally:
        consumer.close()
    assert values == [f"v{i}".encode() for i in range(5)]


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "SCRAM-SHA-256"])
def test_aiokafka(secure, mechanism):
    import aiokafka
    from aiokafka.errors import TopicAuthorizationFailedError

    broker, certs, admin = secure
    topic, group = f"ak-{uuid.uuid4().hex[:8]}", f"ak-g-{uuid.uuid4().hex[:8]}"
    context = ssl.create_default_context(cafile=str(certs.ca_file))
    settings = dict(bootstrap_servers=broker.bootstrap_servers, security_protocol="SASL_SSL",
                    ssl_context=context, sasl_mechanism=mechanism,
                    sasl_plain_username="app", sasl_plain_password="app-secret")

    async def run() -> list[bytes]:
        _allow(admin, topic, group)
        producer = aiokafka.AIOKafkaProducer(**settings, request_timeout_ms=10_000)
        await producer.start()
        try:
            with pytest.raises(TopicAuthorizationFailedError):
                await asyncio.wait_for(producer.send_and_wait(f"{topic}-denied", b"x"), WAIT_S)
            for i in range(5):
                await producer.send_and_wait(topic, f"v{i}".encode())
        finally:
            await producer.stop()
        consumer = aiokafka.AIOKafkaConsumer(topic, **settings, group_id=group,
                                             auto_offset_reset="earliest")
        await consumer.start()
        values: list[bytes] = []
        try:
            async with asyncio.timeout(WAIT_S):
                async for message in consumer:
                    values.append(message.value)
                    if len(values) == 5:
                        break
        finally:
            await consumer.stop()
        return values

    assert asyncio.run(run()) == [f"v{i}".encode() for i in range(5)]


# SCRAM-SHA-256 from Java: test_java_client_secured_transactions.
@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512"])
def test_java_client(secure, mechanism, tmp_path):
    """The Java client (kafka-clients, tests/java_support.py) with the properties a Java
    application would use against Kafka: SASL_SSL, SCRAM, a PEM trust store."""
    from tests.java_support import run_java

    broker, certs, admin = secure
    topic, group = f"jv-{uuid.uuid4().hex[:8]}", f"jv-g-{uuid.uuid4().hex[:8]}"
    properties = tmp_path / "client.properties"
    properties.write_text("\n".join([
        f"bootstrap.servers={broker.bootstrap_servers}",
        "security.protocol=SASL_SSL",
        f"sasl.mechanism={mechanism}",
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="app" password="app-secret";',
        "ssl.truststore.type=PEM",
        f"ssl.truststore.location={certs.ca_file}",
    ]) + "\n")
    [denied] = run_java("SecureRoundTrip", str(properties), topic, group, "5")
    # No ACL yet: the topic's metadata, or InitProducerId (no Write anywhere), is refused.
    assert denied["error"] in ("TopicAuthorizationException", "ClusterAuthorizationException")
    _allow(admin, topic, group)
    [result] = run_java("SecureRoundTrip", str(properties), topic, group, "5")
    assert result == {"consumed": [f"v{i}" for i in range(5)]}


def _allow_transactional(admin: AdminClient, topic: str, group: str, txn_id: str) -> None:
    _allow(admin, topic, group)
    binding = AclBinding(ResourceType.TRANSACTIONAL_ID, txn_id, ResourcePatternType.LITERAL,
                         "User:app", "*", AclOperation.WRITE, AclPermissionType.ALLOW)
    for future in admin.create_acls([binding]).values():
        future.result(timeout=WAIT_S)


def test_kafka_python_secured_transactions(secure):
    """kafka-python 3: a wrong password is refused; with ACLs a transaction commits and a
    read_committed consumer sees it; another transactional id and another group are not
    authorized (Kafka's error codes 53 and 30)."""
    import kafka
    from kafka.errors import (
        GroupAuthorizationFailedError,
        KafkaError,
        TransactionalIdAuthorizationFailedError,
    )

    broker, certs, admin = secure
    suffix = uuid.uuid4().hex[:8]
    topic, group, txn_id = f"kpt-{suffix}", f"kpt-g-{suffix}", f"kpt-tx-{suffix}"
    settings = dict(bootstrap_servers=broker.bootstrap_servers, security_protocol="SASL_SSL",
                    ssl_cafile=str(certs.ca_file), sasl_mechanism="SCRAM-SHA-256",
                    sasl_plain_username="app", sasl_plain_password="app-secret")
    # A wrong password: kafka-python retries the bootstrap until bootstrap_timeout_ms, then
    # gives up (the same settings with the right password work below).
    with pytest.raises(KafkaError, match="Unable to bootstrap"):
        kafka.KafkaProducer(**{**settings, "sasl_plain_password": "wrong"},
                            bootstrap_timeout_ms=3_000).close()
    _allow_transactional(admin, topic, group, txn_id)
    producer = kafka.KafkaProducer(**settings, transactional_id=txn_id, max_block_ms=20_000)
    try:
        producer.init_transactions()
        producer.begin_transaction()
        for i in range(3):
            producer.send(topic, f"t{i}".encode())
        producer.commit_transaction()
    finally:
        producer.close()
    with pytest.raises(TransactionalIdAuthorizationFailedError):
        other = kafka.KafkaProducer(**settings, transactional_id=f"{txn_id}-other",
                                    max_block_ms=20_000)
        try:
            other.init_transactions()
        finally:
            other.close()
    consumer = kafka.KafkaConsumer(topic, **settings, group_id=group,
                                   isolation_level="read_committed",
                                   auto_offset_reset="earliest", consumer_timeout_ms=20_000)
    try:
        values = [m.value for _, m in zip(range(3), consumer)]
        consumer.commit()
    finally:
        consumer.close()
    assert values == [f"t{i}".encode() for i in range(3)]
    denied = kafka.KafkaConsumer(topic, **settings, group_id=f"{group}-other",
                                 auto_offset_reset="earliest", consumer_timeout_ms=20_000)
    try:
        with pytest.raises(GroupAuthorizationFailedError):
            list(denied)
    finally:
        denied.close()


def test_aiokafka_secured_transactions(secure):
    """aiokafka: the same secured flow with its transactional producer."""
    import aiokafka
    from aiokafka.errors import (
        GroupAuthorizationFailedError,
        KafkaConnectionError,
        TransactionalIdAuthorizationFailed,
    )

    broker, certs, admin = secure
    suffix = uuid.uuid4().hex[:8]
    topic, group, txn_id = f"akt-{suffix}", f"akt-g-{suffix}", f"akt-tx-{suffix}"
    settings = {"bootstrap_servers": broker.bootstrap_servers, "security_protocol": "SASL_SSL",
                "ssl_context": ssl.create_default_context(cafile=str(certs.ca_file)),
                "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": "app",
                "sasl_plain_password": "app-secret"}

    async def run() -> list[bytes]:
        wrong = aiokafka.AIOKafkaProducer(**{**settings, "sasl_plain_password": "wrong"})
        with pytest.raises(KafkaConnectionError):
            await wrong.start()
        await wrong.stop()
        _allow_transactional(admin, topic, group, txn_id)
        producer = aiokafka.AIOKafkaProducer(**settings, transactional_id=txn_id)
        await producer.start()
        try:
            async with producer.transaction():
                for i in range(3):
                    await producer.send(topic, f"t{i}".encode())
        finally:
            await producer.stop()
        other = aiokafka.AIOKafkaProducer(**settings, transactional_id=f"{txn_id}-other")
        with pytest.raises(TransactionalIdAuthorizationFailed):
            await other.start()
        await other.stop()
        consumer = aiokafka.AIOKafkaConsumer(topic, **settings, group_id=group,
                                             isolation_level="read_committed",
                                             auto_offset_reset="earliest")
        await consumer.start()
        values: list[bytes] = []
        try:
            async with asyncio.timeout(WAIT_S):
                async for message in consumer:
                    values.append(message.value)
                    if len(values) == 3:
                        break
        finally:
            await consumer.stop()
        denied = aiokafka.AIOKafkaConsumer(topic, **settings, group_id=f"{group}-other",
                                           auto_offset_reset="earliest")
        try:
            with pytest.raises(GroupAuthorizationFailedError):
                await denied.start()
                async with asyncio.timeout(WAIT_S):
                    await denied.getmany(timeout_ms=WAIT_S * 1000)
        finally:
            await denied.stop()
        return values

    assert asyncio.run(run()) == [f"t{i}".encode() for i in range(3)]


def test_java_client_secured_transactions(secure, tmp_path):
    """The Java client with SCRAM-SHA-256: a wrong password is refused; with ACLs a
    transaction commits and is read read_committed; another transactional id and
    another group are not authorized."""
    from tests.java_support import run_java

    broker, certs, admin = secure
    suffix = uuid.uuid4().hex[:8]
    topic, group, txn_id = f"jvt-{suffix}", f"jvt-g-{suffix}", f"jvt-tx-{suffix}"

    def properties(password: str):
        path = tmp_path / f"{password}.properties"
        path.write_text("\n".join([
            f"bootstrap.servers={broker.bootstrap_servers}",
            "security.protocol=SASL_SSL",
            "sasl.mechanism=SCRAM-SHA-256",
            "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule "
            f'required username="app" password="{password}";',
            "ssl.truststore.type=PEM",
            f"ssl.truststore.location={certs.ca_file}",
        ]) + "\n")
        return str(path)

    good = properties("app-secret")
    _allow_transactional(admin, topic, group, txn_id)
    [wrong] = run_java("SecureRoundTrip", properties("wrong"), topic, group, "3", txn_id)
    assert wrong == {"error": "SaslAuthenticationException"}
    [result] = run_java("SecureRoundTrip", good, topic, group, "3", txn_id)
    assert result == {"consumed": ["v0", "v1", "v2"]}
    [other_txn] = run_java("SecureRoundTrip", good, topic, group, "3", f"{txn_id}-other")
    assert other_txn == {"error": "TransactionalIdAuthorizationException"}
    [other_group] = run_java("SecureRoundTrip", good, topic, f"{group}-other", "3", txn_id)
    assert other_group == {"error": "GroupAuthorizationException"}
