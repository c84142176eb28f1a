"""Issue 13's "Done when", with confluent-kafka against the broker process started with
exactly the issue's command line:

    onceflow broker --data-dir D --listeners SASL_SSL://127.0.0.1:P --ssl-certfile S
      --ssl-keyfile K --sasl-mechanisms SCRAM-SHA-512,SCRAM-SHA-256,PLAIN
      --add-scram 'SCRAM-SHA-512=[name=admin,password=admin-secret]'
      --authorizer --super-users User:admin

The super user connects; a wrong password and a plaintext client are refused; a user
made with AlterUserScramCredentials (SCRAM-SHA-256) logs in; its produce without ACLs
gets TOPIC_AUTHORIZATION_FAILED; with Topic Write/Read/Describe, Group Read and
TransactionalId Write/Describe it produces in a transaction, commits, and consumes with
read_committed; another transactional id gets TRANSACTIONAL_ID_AUTHORIZATION_FAILED and
another group GROUP_AUTHORIZATION_FAILED; after kill -9 and a restart the user and the
ACLs are there; after DeleteAcls the produce is denied again.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
)
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from onceflow.testing import free_port
from tests.security.certs import make_certs

pytestmark = pytest.mark.timeout(300)

WAIT_S = 30
TOPIC, GROUP, TXN_ID = "orders", "app-group", "app-tx"


class SecureBroker:
    """The broker process with the issue's command line; restartable on the same port."""

    def __init__(self, directory: Path) -> None:
        self.certs = make_certs(directory / "certs")
        self.data_dir = directory / "data"
        self.port = free_port()
        self.log_path = directory / "broker.log"
        self.process: subprocess.Popen[str] | None = None

    @property
    def command(self) -> list[str]:
        return [sys.executable, "-m", "onceflow", "broker", "--data-dir", str(self.data_dir),
                "--listeners", f"SASL_SSL://127.0.0.1:{self.port}",
                "--ssl-certfile", str(self.certs.cert_file),
                "--ssl-keyfile", str(self.certs.key_file),
                "--sasl-mechanisms", "SCRAM-SHA-512,SCRAM-SHA-256,PLAIN",
                "--add-scram", "SCRAM-SHA-512=[name=admin,password=admin-secret]",
                "--authorizer", "--super-users", "User:admin"]

    def start(self) -> SecureBroker:
        with open(self.log_path, "a") as log:
            self.process = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=log,
                                            text=True)
        assert self.process.stdout is not None
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if "listening on" in line:
                return self
            if not line and self.process.poll() is not None:
                break
        raise RuntimeError(f"broker did not start:\n{self.log_path.read_text()[-3000:]}")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def client(self, user: str, password: str, mechanism: str = "SCRAM-SHA-512", **extra) -> dict:
        return {"bootstrap.servers": f"127.0.0.1:{self.port}", "security.protocol": "SASL_SSL",
                "ssl.ca.location": str(self.certs.ca_file), "sasl.mechanism": mechanism,
                "sasl.username": user, "sasl.password": password, **extra}


@pytest.fixture
def secure_broker(tmp_path):
    broker = SecureBroker(tmp_path).start()
    yield broker
    broker.kill()


def _wait(futures: dict) -> None:
    for future in futures.values():
        future.result(timeout=WAIT_S)


def _produce(settings: dict, count: int = 3) -> list[KafkaError | None]:
    reports: list[KafkaError | None] = []
    producer = Producer(settings | {"message.timeout.ms": 10_000})
    for i in range(count):
        producer.produce(TOPIC, f"plain-{i}".encode(),
                         on_delivery=lambda err, msg: reports.append(err))
    producer.flush(WAIT_S)
    return reports


def _app_acls() -> list[AclBinding]:
    def binding(rtype, name, operation):
        return AclBinding(rtype, name, ResourcePatternType.LITERAL, "User:app", "*", operation,
                          AclPermissionType.ALLOW)
    return [binding(ResourceType.TOPIC, TOPIC, AclOperation.WRITE),
            binding(ResourceType.TOPIC, TOPIC, AclOperation.READ),
            binding(ResourceType.TOPIC, TOPIC, AclOperation.DESCRIBE),
            binding(ResourceType.GROUP, GROUP, AclOperation.READ),
            binding(ResourceType.TRANSACTIONAL_ID, TXN_ID, AclOperation.WRITE),
            binding(ResourceType.TRANSACTIONAL_ID, TXN_ID, AclOperation.DESCRIBE)]


def _listed(admin: AdminClient) -> set[tuple]:
    found = admin.describe_acls(AclBindingFilter(
        ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
        AclPermissionType.ANY)).result(timeout=WAIT_S)
    return {(b.restype, b.name, b.principal, b.operation) for b in found}


def _consume(settings: dict, group: str, count: int) -> list[bytes]:
    consumer = Consumer(settings | {"group.id": group, "auto.offset.reset": "earliest",
                                    "isolation.level": "read_committed",
                                    "enable.auto.commit": False})
    consumer.subscribe([TOPIC])
    values: list[bytes] = []
    deadline = time.monotonic() + WAIT_S
    try:
        while len(values) < count and time.monotonic() < deadline:
            message = consumer.poll(1)
            if message is None:
                continue
            if message.error():
                raise KafkaException(message.error())
            values.append(message.value())
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return values


def test_secured_flow(secure_broker):
    broker = secure_broker
    admin = AdminClient(broker.client("admin", "admin-secret"))
    # The super user connects and creates the topic.
    _wait(admin.create_topics([NewTopic(TOPIC, 1, 1)]))
    assert TOPIC in admin.list_topics(timeout=WAIT_S).topics

    # A wrong password is refused with Kafka's message.
    errors: list[KafkaError] = []
    wrong = AdminClient(broker.client("admin", "admin-wrong", error_cb=errors.append))
    with pytest.raises(KafkaException):
        wrong.list_topics(timeout=5)
    wrong.poll(1)
    assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), errors
    # A plaintext client gets nowhere.
    plaintext = AdminClient({"bootstrap.servers": f"127.0.0.1:{broker.port}"})
    with pytest.raises(KafkaException):
        plaintext.list_topics(timeout=5)

    # A SCRAM-SHA-256 user made at run time logs in.
    _wait(admin.alter_user_scram_credentials([UserScramCredentialUpsertion(
        "app", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 8192), b"app-secret")]))
    described = admin.describe_user_scram_credentials(["app"])["app"].result(timeout=WAIT_S)
    infos = described.scram_credential_infos
    assert [(i.mechanism, i.iterations) for i in infos] == [(ScramMechanism.SCRAM_SHA_256, 8192)]
    app = broker.client("app", "app-secret", "SCRAM-SHA-256")
    # Logged in, but it may see nothing yet: Metadata hides the topic.
    assert TOPIC not in AdminClient(app).list_topics(timeout=WAIT_S).topics
    reports = _produce(app)
    assert reports and all(e is not None and e.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
                           for e in reports), reports

    # With the ACLs a transactional consume-transform-produce app needs, it works.
    _wait(admin.create_acls(_app_acls()))
    producer = Producer(app | {"transactional.id": TXN_ID})
    producer.init_transactions(WAIT_S)
    producer.begin_transaction()
    for i in range(5):
        producer.produce(TOPIC, f"txn-{i}".encode())
    producer.commit_transaction(WAIT_S)
    assert _consume(app, GROUP, 5) == [f"txn-{i}".encode() for i in range(5)]

    # Another transactional id, another group: refused.
    other = Producer(app | {"transactional.id": "other-tx"})
    with pytest.raises(KafkaException) as refused:
        other.init_transactions(WAIT_S)
    assert refused.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    with pytest.raises(KafkaException) as refused:
        _consume(app, "other-group", 1)
    assert refused.value.args[0].code() == KafkaError.GROUP_AUTHORIZATION_FAILED

    # kill -9 and restart: the user and the ACLs are still there.
    expected = _listed(admin)
    assert len(expected) == len(_app_acls())
    broker.kill()
    broker.start()
    admin = AdminClient(broker.client("admin", "admin-secret"))
    assert _listed(admin) == expected
    assert _produce(app) == [None, None, None]

    # DeleteAcls of the Write ACL: the produce is denied again.
    deleted = admin.delete_acls([AclBindingFilter(
        ResourceType.TOPIC, TOPIC, ResourcePatternType.LITERAL, "User:app", "*",
        AclOperation.WRITE, AclPermissionType.ALLOW)])
    (matched,) = [f.result(timeout=WAIT_S) for f in deleted.values()]
    assert len(matched) == 1
    reports = _produce(app)
    assert reports and all(e is not None and e.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
                           for e in reports), reports

    # No password in the broker's log.
    log = broker.log_path.read_text()
    assert "admin-secret" not in log and "app-secret" not in log and "admin-wrong" not in log
