"""TLS listeners: Kafka's listener syntax, SSL with confluent-kafka, mTLS principals, and a
plaintext client on a TLS port (and the reverse) refused without harm to the broker."""

from __future__ import annotations

import socket
import ssl
import uuid

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from onceflow.broker.connection import rfc2253
from onceflow.broker.embedded import Broker
from onceflow.security.listeners import ListenerError, parse_advertised, parse_listeners
from tests.security.certs import make_certs

pytestmark = pytest.mark.timeout(120)

WAIT_S = 30


def test_listener_syntax():
    listeners = parse_listeners("PLAINTEXT://127.0.0.1:9092,CLIENT://:9093,SSL://[::1]:0",
                                "CLIENT:SASL_SSL")
    assert [(l.name, l.protocol, l.host, l.port) for l in listeners] == [
        ("PLAINTEXT", "PLAINTEXT", "127.0.0.1", 9092), ("CLIENT", "SASL_SSL", "", 9093),
        ("SSL", "SSL", "::1", 0)]
    assert parse_advertised("CLIENT://broker.example:19093", listeners) == {
        "CLIENT": ("broker.example", 19093)}
    for bad, mapping in [("NOPE://h:1", None), ("PLAINTEXT://h", None),
                         ("PLAINTEXT://h:1,PLAINTEXT://h:2", None),
                         ("CLIENT://h:1", "CLIENT:TLS"), ("", None)]:
        with pytest.raises(ListenerError):
            parse_listeners(bad, mapping)
    with pytest.raises(ListenerError):
        parse_advertised("OTHER://h:1", listeners)


def test_rfc2253_subject():
    subject = ((("countryName", "DE"),), (("organizationName", "Acme, Inc"),),
               (("organizationalUnitName", "eng"), ("userId", "7")), (("commonName", "app"),))
    assert rfc2253(subject) == "CN=app,OU=eng+UID=7,O=Acme\\, Inc,C=DE"


def _round_trip(bootstrap: str, settings: dict, topic: str) -> list[bytes]:
    producer = Producer({"bootstrap.servers": bootstrap, **settings})
    for i in range(10):
        producer.produce(topic, f"v{i}".encode())
    assert producer.flush(WAIT_S) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{topic}",
                         "enable.auto.commit": False, **settings})
    consumer.assign([TopicPartition(topic, 0, 0)])
    values: list[bytes] = []
    try:
        for message in iter(lambda: consumer.poll(WAIT_S), None):
            assert message.error() is None, message.error()
            values.append(message.value())
            if len(values) == 10:
                break
    finally:
        consumer.close()
    return values


def test_ssl_and_plaintext_listeners_side_by_side(tmp_path):
    certs = make_certs(tmp_path / "certs")
    broker = Broker(tmp_path / "data", listeners="PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0",
                    ssl_certfile=certs.cert_file, ssl_keyfile=certs.key_file)
    with broker:
        plain, tls = (broker.server.endpoints(name) for name in ("PLAINTEXT", "SSL"))
        assert plain != tls
        topic = f"t-{uuid.uuid4().hex[:8]}"
        ssl_settings = {"security.protocol": "SSL", "ssl.ca.location": str(certs.ca_file)}
        assert _round_trip(tls, ssl_settings, topic) == [f"v{i}".encode() for i in range(10)]
        # Metadata on each listener names that listener's own address.
        for bootstrap, settings in ((tls, ssl_settings), (plain, {})):
            admin = AdminClient({"bootstrap.servers": bootstrap, **settings})
            brokers = admin.list_topics(timeout=WAIT_S).brokers
            assert [f"{b.host}:{b.port}" for b in brokers.values()] == [bootstrap]


def test_plaintext_client_on_tls_port_and_tls_client_on_plaintext_port(tmp_path):
    certs = make_certs(tmp_path / "certs")
    broker = Broker(tmp_path / "data", listeners="PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0",
                    ssl_certfile=certs.cert_file, ssl_keyfile=certs.key_file)
    with broker:
        plain, tls = (broker.server.endpoints(name) for name in ("PLAINTEXT", "SSL"))
        # A Kafka request in clear text to the TLS port: the handshake fails, no answer.
        host, port = tls.split(":")
        with socket.create_connection((host, int(port)), timeout=WAIT_S) as sock:
            sock.sendall(b"\x00\x00\x00\x0a\x00\x12\x00\x00\x00\x00\x00\x01\x00\x00")
            data = sock.recv(1024)
            assert data == b"" or data[0] == 0x15, data  # closed, or a TLS alert record
        reports = []
        producer = Producer({"bootstrap.servers": tls, "socket.timeout.ms": 3000,
                             "message.timeout.ms": 3000})
        producer.produce("never", b"x", on_delivery=lambda err, msg: reports.append(err))
        producer.flush(WAIT_S)
        assert len(reports) == 1 and reports[0] is not None, "plaintext got through TLS"
        # A TLS client on the plaintext port fails its handshake.
        context = ssl.create_default_context(cafile=str(certs.ca_file))
        host, port = plain.split(":")
        with socket.create_connection((host, int(port)), timeout=WAIT_S) as raw:
            with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
                context.wrap_socket(raw, server_hostname=host)
        # The broker still serves both listeners.
        topic = f"t-{uuid.uuid4().hex[:8]}"
        assert len(_round_trip(plain, {}, topic)) == 10


def test_mtls_required_principal(tmp_path):
    certs = make_certs(tmp_path / "certs")
    chain, key, subject = certs.client(tmp_path / "certs", "app", "app", organization_unit="eng")
    other_chain, other_key, other_subject = certs.client(tmp_path / "certs", "other", "other")
    broker = Broker(tmp_path / "data", listeners="SSL://127.0.0.1:0",
                    ssl_certfile=certs.cert_file, ssl_keyfile=certs.key_file,
                    ssl_cafile=certs.ca_file, ssl_client_auth="required",
                    authorizer=True, super_users=(f"User:{subject}",))
    with broker:
        bootstrap = broker.bootstrap_servers
        base = {"security.protocol": "SSL", "ssl.ca.location": str(certs.ca_file)}
        topic = f"t-{uuid.uuid4().hex[:8]}"
        mtls = base | {"ssl.certificate.location": str(chain), "ssl.key.location": str(key)}
        # The certificate's subject is a super user: everything passes the authorizer.
        assert len(_round_trip(bootstrap, mtls, topic)) == 10
        # Another certificate is another principal, with no ACLs: Metadata hides the topic.
        other = base | {"ssl.certificate.location": str(other_chain),
                        "ssl.key.location": str(other_key)}
        listed = AdminClient({"bootstrap.servers": bootstrap, **other}).list_topics(
            timeout=WAIT_S).topics
        assert topic not in listed
        admin = AdminClient({"bootstrap.servers": bootstrap, **mtls})
        assert topic in admin.list_topics(timeout=WAIT_S).topics
        # ACLs for the other certificate's principal: it reads and writes the topic.
        principal = f"User:{other_subject}"
        bindings = [AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, principal,
                               "*", op, AclPermissionType.ALLOW)
                    for op in (AclOperation.READ, AclOperation.WRITE)]
        bindings.append(AclBinding(ResourceType.GROUP, f"g-{topic}", ResourcePatternType.LITERAL,
                                   principal, "*", AclOperation.READ, AclPermissionType.ALLOW))
        for future in admin.create_acls(bindings).values():
            future.result(timeout=WAIT_S)
        assert len(_round_trip(bootstrap, other, topic)) == 10
        # Without a client certificate the TLS handshake is refused.
        admin = AdminClient({"bootstrap.servers": bootstrap, **base,
                             "socket.timeout.ms": 3000})
        with pytest.raises(KafkaException):
            admin.list_topics(timeout=5)


def test_principal_mapping_rules_parse_as_kafka():
    """The examples of Kafka's documentation and SslPrincipalMapper's tests."""
    from onceflow.security.principal import MappingRuleError, parse_mapping_rules

    mapper = parse_mapping_rules(
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,"
        "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L, "
        "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/L,\nDEFAULT")
    assert mapper.name("CN=Duke,OU=ServiceUsers,O=Org,C=US") == "Duke"
    assert mapper.name("CN=Duke,OU=SME,O=mycp,L=Fulton,ST=MD,C=US") == "duke@sme"
    assert mapper.name("cn=duke,ou=JavaSoft,o=Sun Microsystems") == "duke"
    assert mapper.name("OU=JavaSoft,O=Sun Microsystems,C=US") == "OU=JavaSoft,O=Sun Microsystems,C=US"
    upper = parse_mapping_rules("RULE:^CN=(.*),OU=.*$/$1/U")
    assert upper.name("CN=app,OU=eng") == "APP" and upper.name("O=x") is None
    # $2 past the last group stays literal; \/ escapes the separator.
    assert parse_mapping_rules(r"RULE:^CN=(.*)$/$1\/$2/").name("CN=a") == "a/$2"
    assert parse_mapping_rules(None).name("CN=a") == "CN=a"
    for bad in ("foo", "RULE:a/b", "RULE:a/b/X", "RULE:(/b/", "DEFAULT,junk"):
        with pytest.raises(MappingRuleError):
            parse_mapping_rules(bad)


def test_mtls_principal_mapping_rules(tmp_path):
    """--ssl-principal-mapping-rules: the mapped name is the principal; a certificate no
    rule applies to is refused (its connection closed), as Kafka refuses it."""
    certs = make_certs(tmp_path / "certs")
    chain, key, _subject = certs.client(tmp_path / "certs", "app", "app", organization_unit="eng")
    other_chain, other_key, _ = certs.client(tmp_path / "certs", "other", "other")
    broker = Broker(tmp_path / "data", listeners="SSL://127.0.0.1:0",
                    ssl_certfile=certs.cert_file, ssl_keyfile=certs.key_file,
                    ssl_cafile=certs.ca_file, ssl_client_auth="required",
                    ssl_principal_mapping_rules="RULE:^CN=([^,]*),OU=eng(,.*)?$/$1/U",
                    authorizer=True, super_users=("User:APP",))
    with broker:
        bootstrap = broker.bootstrap_servers
        base = {"security.protocol": "SSL", "ssl.ca.location": str(certs.ca_file)}
        mtls = base | {"ssl.certificate.location": str(chain), "ssl.key.location": str(key)}
        # User:APP (the mapped name) is the super user.
        assert len(_round_trip(bootstrap, mtls, f"t-{uuid.uuid4().hex[:8]}")) == 10
        other = AdminClient({"bootstrap.servers": bootstrap, **base,
                             "ssl.certificate.location": str(other_chain),
                             "ssl.key.location": str(other_key), "socket.timeout.ms": 3000})
        with pytest.raises(KafkaException):
            other.list_topics(timeout=5)
