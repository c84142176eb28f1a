"""SaslHandshake v0 (issue 13): after it the client sends its SASL tokens raw - a 4-byte
size and the token, no request header - and the broker answers each the same way, as
Kafka's SaslServerAuthenticator does without "SaslAuthenticate headers". PLAIN and SCRAM
over a raw socket (scramp as the SCRAM client), a wrong password closed without an
answer, an oversize token refused; and kafka-python told an old broker version, which
then speaks v0."""

from __future__ import annotations

import logging
import socket
import struct
import uuid

import kafka
import pytest
import scramp

from onceflow.broker.embedded import Broker
from onceflow.protocol.apis import ApiKey
from onceflow.security.sasl import SASL_TOKEN_BYTES_MAX, SaslSession

pytestmark = pytest.mark.timeout(120)

WAIT_S = 30
PASSWORD = "alice-secret"


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with Broker(tmp_path_factory.mktemp("sasl-v0") / "data",
                listeners="SASL_PLAINTEXT://127.0.0.1:0",
                sasl_mechanisms=("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"),
                add_scram=(f"SCRAM-SHA-512=[name=alice,password={PASSWORD}]",
                           f"SCRAM-SHA-256=[name=alice,password={PASSWORD}]"),
                connection_failed_authentication_delay_ms=10) as running:
        yield running


def _connect(broker: Broker) -> socket.socket:
    host, port = broker.server.endpoints("SASL_PLAINTEXT").split(":")
    return socket.create_connection((host, int(port)), timeout=WAIT_S)


def _request(api_key: int, version: int, correlation_id: int, body: bytes = b"") -> bytes:
    header = struct.pack(">hhih", api_key, version, correlation_id, 4) + b"test"
    return struct.pack(">i", len(header) + len(body)) + header + body


def _read_frame(sock: socket.socket) -> bytes | None:
    """One size-prefixed frame, or None when the broker closed the connection."""
    head = sock.recv(4, socket.MSG_WAITALL)
    if len(head) < 4:
        return None
    (size,) = struct.unpack(">i", head)
    return sock.recv(size, socket.MSG_WAITALL) if size else b""


def _token(sock: socket.socket, token: bytes) -> bytes | None:
    """Send a raw token; the broker's raw answer, or None if it closed instead."""
    sock.sendall(struct.pack(">i", len(token)) + token)
    return _read_frame(sock)


def _handshake_v0(sock: socket.socket, mechanism: str) -> None:
    name = mechanism.encode()
    sock.sendall(_request(ApiKey.SASL_HANDSHAKE, 0, 1, struct.pack(">h", len(name)) + name))
    answer = _read_frame(sock)
    assert answer is not None
    correlation_id, error, count = struct.unpack_from(">ihi", answer)
    assert (correlation_id, error) == (1, 0) and count >= 1
    assert mechanism.encode() in answer


def _metadata_answered(sock: socket.socket) -> bool:
    """A Kafka request after the login: Metadata v1 for no topic."""
    sock.sendall(_request(ApiKey.METADATA, 1, 7, struct.pack(">i", 0)))
    answer = _read_frame(sock)
    return answer is not None and struct.unpack_from(">i", answer)[0] == 7


def test_plain_with_raw_tokens(broker):
    with _connect(broker) as sock:
        _handshake_v0(sock, "PLAIN")
        # PLAIN's server answer is an empty token, size-prefixed (Kafka sends it too).
        assert _token(sock, f"\0alice\0{PASSWORD}".encode()) == b""
        assert _metadata_answered(sock)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_with_raw_tokens(broker, mechanism):
    client = scramp.ScramClient([mechanism], "alice", PASSWORD)
    with _connect(broker) as sock:
        _handshake_v0(sock, mechanism)
        server_first = _token(sock, client.get_client_first().encode())
        assert server_first is not None
        client.set_server_first(server_first.decode())
        server_final = _token(sock, client.get_client_final().encode())
        assert server_final is not None
        client.set_server_final(server_final.decode())   # the client checks the server
        assert _metadata_answered(sock)


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
def test_wrong_password_is_closed_without_answer_or_secret_in_logs(broker, mechanism, caplog):
    wrong = f"wrong-{uuid.uuid4().hex}"
    with caplog.at_level(logging.INFO, logger="onceflow"), _connect(broker) as sock:
        _handshake_v0(sock, mechanism)
        if mechanism == "PLAIN":
            assert _token(sock, f"\0alice\0{wrong}".encode()) is None
        else:
            client = scramp.ScramClient([mechanism], "alice", wrong)
            server_first = _token(sock, client.get_client_first().encode())
            assert server_first is not None
            client.set_server_first(server_first.decode())
            assert _token(sock, client.get_client_final().encode()) is None
    assert "authentication (raw tokens) from" in caplog.text
    assert wrong not in caplog.text and PASSWORD not in caplog.text


def test_handshake_and_token_sent_together(broker):
    """The token right behind the v0 handshake, before its answer: still read as a token."""
    name = b"PLAIN"
    token = f"\0alice\0{PASSWORD}".encode()
    with _connect(broker) as sock:
        sock.sendall(_request(ApiKey.SASL_HANDSHAKE, 0, 1, struct.pack(">h", len(name)) + name)
                     + struct.pack(">i", len(token)) + token)
        handshake = _read_frame(sock)
        assert handshake is not None and struct.unpack_from(">ih", handshake) == (1, 0)
        assert _read_frame(sock) == b""
        assert _metadata_answered(sock)


def test_session_admits_raw_tokens_only_after_a_v0_handshake():
    def session() -> SaslSession:
        return SaslSession(("PLAIN",), lambda _u, _m: None, lambda u, p: (u, p) == ("a", "b"))

    framed, raw = session(), session()
    framed.check(ApiKey.SASL_HANDSHAKE, 1)
    raw.check(ApiKey.SASL_HANDSHAKE, 0)
    assert not framed.raw_tokens() and raw.raw_tokens()
    assert raw.handshake("PLAIN") and raw.authenticate(b"\0a\0b") == b""
    assert not raw.raw_tokens() and raw.logged_in   # Kafka requests again


def test_oversize_raw_token_is_refused(broker):
    with _connect(broker) as sock:
        _handshake_v0(sock, "PLAIN")
        assert _token(sock, b"\0" * (SASL_TOKEN_BYTES_MAX + 1)) is None


def test_kafka_python_speaking_v0(broker):
    """kafka-python picks SaslHandshake v0 for a broker it is told is older than 1.0."""
    topic = f"v0-{uuid.uuid4().hex[:8]}"
    settings = {"bootstrap_servers": broker.server.endpoints("SASL_PLAINTEXT"),
                "security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-256",
                "sasl_plain_username": "alice", "sasl_plain_password": PASSWORD,
                "api_version": (0, 11)}
    before = _handshake_v0_count(broker)
    producer = kafka.KafkaProducer(**settings, max_block_ms=20_000)
    try:
        producer.send(topic, b"over raw tokens").get(timeout=WAIT_S)
    finally:
        producer.close(timeout=WAIT_S)
    assert _handshake_v0_count(broker) > before


def _handshake_v0_count(broker: Broker) -> float:
    registry = broker.server.state.metrics.registry
    return registry.get_sample_value("onceflow_request_versions_total",
                                     {"request": "SaslHandshake", "version": "0"}) or 0.0
