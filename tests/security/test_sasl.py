"""SASL: the sans-IO state machine with scramp's client, then real clients against the
broker over SASL_PLAINTEXT and SASL_SSL (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512), wrong
passwords, unknown users and mechanisms, and requests before authentication."""

from __future__ import annotations

import logging
import socket
import struct
import time
import uuid

import pytest
import scramp
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from onceflow.broker.embedded import Broker
from onceflow.protocol.apis import ApiKey
from onceflow.security.sasl import (
    SASL_TOKEN_BYTES_MAX,
    AuthenticationFailed,
    SaslSession,
    SaslState,
    SaslStateError,
)
from onceflow.security.scram import CredentialError, ScramCredential, parse_add_scram
from tests.security.certs import make_certs

pytestmark = pytest.mark.timeout(120)

WAIT_S = 30
USERS = {"alice": "alice-secret"}


def _session(mechanisms=("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")) -> SaslSession:
    creds = {(u, m): ScramCredential.from_password(m, p)
             for u, p in USERS.items() for m in ("SCRAM-SHA-256", "SCRAM-SHA-512")}
    return SaslSession(mechanisms, lambda u, m: creds.get((u, m)),
                       lambda u, p: USERS.get(u) == p)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_exchange(mechanism):
    session = _session()
    assert session.allows(ApiKey.API_VERSIONS) and not session.allows(ApiKey.METADATA)
    assert session.handshake(mechanism)
    client = scramp.ScramClient([mechanism], "alice", "alice-secret")
    server_first = session.authenticate(client.get_client_first().encode())
    client.set_server_first(server_first.decode())
    server_final = session.authenticate(client.get_client_final().encode())
    client.set_server_final(server_final.decode())  # the client checks the server too
    assert session.state == SaslState.COMPLETE and session.principal == "User:alice"
    assert session.allows(ApiKey.METADATA)


@pytest.mark.parametrize("user,password", [("alice", "wrong"), ("mallory", "x")])
def test_scram_wrong_password_or_unknown_user(user, password):
    session = _session()
    session.handshake("SCRAM-SHA-512")
    client = scramp.ScramClient(["SCRAM-SHA-512"], user, password)
    with pytest.raises(AuthenticationFailed) as failure:
        client.set_server_first(session.authenticate(client.get_client_first().encode()).decode())
        session.authenticate(client.get_client_final().encode())
    assert str(failure.value) == ("Authentication failed during authentication due to invalid "
                                  "credentials with SASL mechanism SCRAM-SHA-512")
    assert password not in str(failure.value)
    assert session.state == SaslState.FAILED and not session.allows(ApiKey.SASL_AUTHENTICATE)


def test_plain_and_bad_tokens():
    ok = _session()
    ok.handshake("PLAIN")
    assert ok.authenticate(b"\x00alice\x00alice-secret") == b""
    assert ok.principal == "User:alice"
    for token, message in [(b"\x00alice\x00nope", "Invalid username or password"),
                           (b"alice", "expected 3 tokens"),
                           (b"bob\x00alice\x00alice-secret", "authorization id"),
                           (b"\x00" + b"x" * SASL_TOKEN_BYTES_MAX, "larger than")]:
        session = _session()
        session.handshake("PLAIN")
        with pytest.raises(AuthenticationFailed, match=message):
            session.authenticate(token)


def test_state_table():
    session = _session(("SCRAM-SHA-512",))
    with pytest.raises(SaslStateError):
        session.check(ApiKey.SASL_AUTHENTICATE)   # a token before the handshake
    assert not session.handshake("PLAIN")          # not enabled
    assert session.state == SaslState.FAILED
    with pytest.raises(SaslStateError):
        session.check(ApiKey.API_VERSIONS)
    again = _session()
    assert again.handshake("PLAIN") and not again.handshake("PLAIN")  # repeated handshake
    pipelined = _session()
    pipelined.check(ApiKey.SASL_HANDSHAKE)        # admitted, its handler not run yet
    with pytest.raises(SaslStateError):
        pipelined.check(ApiKey.SASL_HANDSHAKE)    # a second one right behind it
    with pytest.raises(SaslStateError):
        pipelined.check(ApiKey.API_VERSIONS)      # after a handshake only tokens


def test_add_scram_syntax():
    user, credential = parse_add_scram("SCRAM-SHA-512=[name=admin,password=admin-secret]")
    assert user == "admin" and credential.verifies("admin-secret")
    assert not credential.verifies("admin-secreT")
    _, iterated = parse_add_scram("SCRAM-SHA-256=[name=a,password=b,iterations=8192]")
    assert iterated.iterations == 8192 and iterated.mechanism == "SCRAM-SHA-256"
    for bad in ("SCRAM-SHA-1=[name=a,password=b]", "SCRAM-SHA-256=[name=a]",
                "SCRAM-SHA-256=[name=a,password=b,iterations=10]", "name=a,password=b"):
        with pytest.raises(CredentialError):
            parse_add_scram(bad)


# ------------------------------------------------------------------ real clients


@pytest.fixture(scope="module")
def sasl_broker(tmp_path_factory):
    directory = tmp_path_factory.mktemp("sasl")
    certs = make_certs(directory / "certs")
    broker = Broker(directory / "data",
                    listeners="SASL_PLAINTEXT://127.0.0.1:0,SASL_SSL://127.0.0.1:0",
                    ssl_certfile=certs.cert_file, ssl_keyfile=certs.key_file,
                    add_scram=("SCRAM-SHA-512=[name=alice,password=alice-secret]",
                               "SCRAM-SHA-256=[name=alice,password=alice-secret]"),
                    connection_failed_authentication_delay_ms=10)
    with broker:
        yield broker, certs


def _settings(broker, certs, protocol, mechanism, user="alice", password="alice-secret"):
    settings = {"bootstrap.servers": broker.server.endpoints(protocol),
                "security.protocol": protocol, "sasl.mechanism": mechanism,
                "sasl.username": user, "sasl.password": password}
    if protocol == "SASL_SSL":
        settings["ssl.ca.location"] = str(certs.ca_file)
    return settings


@pytest.mark.parametrize("protocol", ["SASL_PLAINTEXT", "SASL_SSL"])
@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_confluent_kafka_logs_in_and_produces(sasl_broker, protocol, mechanism):
    broker, certs = sasl_broker
    settings = _settings(broker, certs, protocol, mechanism)
    reports = []
    producer = Producer(settings)
    topic = f"t-{uuid.uuid4().hex[:8]}"
    producer.produce(topic, b"v", on_delivery=lambda err, msg: reports.append(err))
    producer.flush(WAIT_S)
    assert reports == [None]


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
def test_wrong_password_is_refused_and_not_logged(sasl_broker, mechanism, caplog):
    broker, certs = sasl_broker
    caplog.set_level(logging.DEBUG, logger="onceflow")
    settings = _settings(broker, certs, "SASL_SSL", mechanism, password="hunter2-wrong")
    errors = []
    admin = AdminClient(settings | {"error_cb": errors.append})
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=2)
    deadline = time.monotonic() + WAIT_S
    while not any(e.code() == KafkaError._AUTHENTICATION for e in errors) \
            and time.monotonic() < deadline:
        admin.poll(0.2)
    expected = {"PLAIN": "Authentication failed: Invalid username or password",
                "SCRAM-SHA-512": "Authentication failed during authentication due to invalid "
                                 "credentials with SASL mechanism SCRAM-SHA-512"}[mechanism]
    assert any(e.code() == KafkaError._AUTHENTICATION and expected in e.str() for e in errors), errors
    assert any("authentication from" in r.getMessage() and "failed" in r.getMessage()
               for r in caplog.records)
    assert not any("hunter2" in r.getMessage() for r in caplog.records)


def _frame(api_key: int, version: int, body: bytes = b"") -> bytes:
    header = struct.pack(">hhih", api_key, version, 1, 4) + b"test"
    return struct.pack(">i", len(header) + len(body)) + header + body


def test_request_before_authentication_closes(sasl_broker):
    broker, _ = sasl_broker
    host, port = broker.server.endpoints("SASL_PLAINTEXT").split(":")
    # Metadata v0 (all topics) as the first request: closed without an answer.
    with socket.create_connection((host, int(port)), timeout=WAIT_S) as sock:
        sock.sendall(_frame(ApiKey.METADATA, 0, struct.pack(">i", -1)))
        assert sock.recv(1024) == b""
    # SaslAuthenticate before SaslHandshake: closed too.
    with socket.create_connection((host, int(port)), timeout=WAIT_S) as sock:
        sock.sendall(_frame(ApiKey.SASL_AUTHENTICATE, 0, struct.pack(">i", 3) + b"abc"))
        assert sock.recv(1024) == b""
    # ApiVersions is answered.
    with socket.create_connection((host, int(port)), timeout=WAIT_S) as sock:
        sock.sendall(_frame(ApiKey.API_VERSIONS, 0))
        (size,) = struct.unpack(">i", sock.recv(4))
        assert size > 0


def test_unknown_mechanism_is_answered_then_closed(sasl_broker):
    broker, _ = sasl_broker
    host, port = broker.server.endpoints("SASL_PLAINTEXT").split(":")
    with socket.create_connection((host, int(port)), timeout=WAIT_S) as sock:
        mechanism = b"GSSAPI"
        sock.sendall(_frame(ApiKey.SASL_HANDSHAKE, 1, struct.pack(">h", len(mechanism)) + mechanism))
        data = b""
        while chunk := sock.recv(4096):
            data += chunk
        size, correlation_id, error = struct.unpack_from(">iih", data)
        assert (correlation_id, error) == (1, 33)   # UNSUPPORTED_SASL_MECHANISM
        assert b"SCRAM-SHA-512" in data             # the enabled mechanisms


def _read_all(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(4096):
        data += chunk
    return data


def _answers(data: bytes) -> list[bytes]:
    """Response frames (after their size prefix) in `data`."""
    frames = []
    while data:
        (size,) = struct.unpack_from(">i", data)
        frames.append(data[4:4 + size])
        data = data[4 + size:]
    return frames


def test_repeated_handshake_closes(sasl_broker):
    broker, _ = sasl_broker
    host, port = broker.server.endpoints("SASL_PLAINTEXT").split(":")
    plain = struct.pack(">h", 5) + b"PLAIN"
    with socket.create_connection((host, int(port)), timeout=WAIT_S) as sock:
        sock.sendall(_frame(ApiKey.SASL_HANDSHAKE, 1, plain) + _frame(ApiKey.SASL_HANDSHAKE, 1, plain))
        frames = _answers(_read_all(sock))
    assert len(frames) == 1 and struct.unpack_from(">ih", frames[0]) == (1, 0)


@pytest.mark.parametrize("token", [b"n,,garbage", b"", b"\xff\xfe", b"n,,n=alice,r="])
def test_malformed_scram_tokens_fail_then_close(sasl_broker, token):
    broker, _ = sasl_broker
    host, port = broker.server.endpoints("SASL_PLAINTEXT").split(":")
    mechanism = b"SCRAM-SHA-256"
    with socket.create_connection((host, int(port)), timeout=WAIT_S) as sock:
        sock.sendall(_frame(ApiKey.SASL_HANDSHAKE, 1, struct.pack(">h", len(mechanism)) + mechanism)
                     + _frame(ApiKey.SASL_AUTHENTICATE, 0, struct.pack(">i", len(token)) + token))
        frames = _answers(_read_all(sock))   # both answered, then the broker closes
    assert len(frames) == 2
    correlation_id, error, message_size = struct.unpack_from(">ihh", frames[1])
    message = frames[1][8:8 + message_size].decode()
    assert (correlation_id, error) == (1, 58)  # SASL_AUTHENTICATION_FAILED
    assert message == ("Authentication failed during authentication due to invalid credentials "
                       "with SASL mechanism SCRAM-SHA-256")


def test_truncated_frame_and_broker_still_serves(sasl_broker):
    broker, certs = sasl_broker
    host, port = broker.server.endpoints("SASL_PLAINTEXT").split(":")
    with socket.create_connection((host, int(port)), timeout=WAIT_S) as sock:
        frame = _frame(ApiKey.SASL_HANDSHAKE, 1, struct.pack(">h", 5) + b"PLAIN")
        sock.sendall(frame[:-3])            # the peer goes away mid-frame
    reports = []
    producer = Producer(_settings(broker, certs, "SASL_PLAINTEXT", "SCRAM-SHA-256"))
    producer.produce(f"t-{uuid.uuid4().hex[:8]}", b"v", on_delivery=lambda e, m: reports.append(e))
    producer.flush(WAIT_S)
    assert reports == [None]


def _exchange(sock: socket.socket, frame: bytes) -> bytes:
    sock.sendall(frame)
    (size,) = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))
    return sock.recv(size, socket.MSG_WAITALL)


def test_handshake_after_login_is_illegal_sasl_state(sasl_broker):
    broker, _ = sasl_broker
    host, port = broker.server.endpoints("SASL_PLAINTEXT").split(":")
    plain = struct.pack(">h", 5) + b"PLAIN"
    token = b"\x00alice\x00alice-secret"
    with socket.create_connection((host, int(port)), timeout=WAIT_S) as sock:
        assert struct.unpack_from(">ih", _exchange(sock, _frame(ApiKey.SASL_HANDSHAKE, 1, plain))) == (1, 0)
        answer = _exchange(sock, _frame(ApiKey.SASL_AUTHENTICATE, 0,
                                        struct.pack(">i", len(token)) + token))
        assert struct.unpack_from(">ih", answer) == (1, 0)
        # Logged in: another handshake is answered ILLEGAL_SASL_STATE (34), and the
        # connection serves requests on.
        assert struct.unpack_from(">ih", _exchange(sock, _frame(ApiKey.SASL_HANDSHAKE, 1, plain))) == (1, 34)
        assert struct.unpack_from(">ih", _exchange(sock, _frame(ApiKey.API_VERSIONS, 0))) == (1, 0)


# ------------------------------------------------------------ OAUTHBEARER (unsecured)


def _jws(claims: dict, alg: str = "none") -> str:
    import base64
    import json

    def part(value: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()
    return f"{part({'alg': alg})}.{part(claims)}."


@pytest.mark.parametrize("claims,alg,ok", [
    ({"sub": "alice", "exp": 2_000}, "none", True),
    ({"sub": "alice", "exp": 999}, "none", False),      # expired (the clock says 1000)
    ({"exp": 2_000}, "none", False),                     # no subject
    ({"sub": "alice", "exp": 2_000}, "RS256", False),    # a signed token is not ours to check
])
def test_oauthbearer_unsecured_tokens(claims, alg, ok):
    session = SaslSession(("OAUTHBEARER",), lambda u, m: None, lambda u, p: False,
                          clock_s=lambda: 1_000.0)
    assert session.handshake("OAUTHBEARER")
    token = f"n,,\x01auth=Bearer {_jws(claims, alg)}\x01\x01".encode()
    if ok:
        assert session.authenticate(token) == b"" and session.principal == "User:alice"
    else:
        with pytest.raises(AuthenticationFailed, match="OAUTHBEARER"):
            session.authenticate(token)


def test_oauthbearer_with_confluent_kafka(tmp_path):
    broker = Broker(tmp_path / "data", listeners="SASL_PLAINTEXT://127.0.0.1:0",
                    sasl_mechanisms=("OAUTHBEARER",), authorizer=True,
                    super_users=("User:carol",))
    with broker:
        settings = {"bootstrap.servers": broker.bootstrap_servers,
                    "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "OAUTHBEARER",
                    "enable.sasl.oauthbearer.unsecure.jwt": True,
                    "sasl.oauthbearer.config": "principal=carol"}
        assert _produce_one(settings) == [None]          # carol is a super user
        denied = _produce_one(settings | {"sasl.oauthbearer.config": "principal=dave"})
        assert denied[0] is not None and denied[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def _produce_one(settings: dict) -> list:
    reports: list = []
    producer = Producer(settings | {"message.timeout.ms": 10_000})
    producer.produce("oauth-topic", b"v", on_delivery=lambda err, msg: reports.append(err))
    producer.flush(WAIT_S)
    return reports


def test_unauthenticated_connection_is_closed_after_the_login_timeout(tmp_path):
    broker = Broker(tmp_path / "data", listeners="SASL_PLAINTEXT://127.0.0.1:0",
                    sasl_authentication_timeout_ms=500)
    with broker:
        host, port = broker.bootstrap_servers.split(":")
        with socket.create_connection((host, int(port)), timeout=WAIT_S) as sock:
            started = time.monotonic()
            assert sock.recv(1) == b""           # closed by the broker, nothing sent
            assert time.monotonic() - started < WAIT_S


def _login_plain(session: SaslSession, user="alice", password="alice-secret") -> None:
    session.check(ApiKey.SASL_HANDSHAKE)
    assert session.handshake("PLAIN")
    session.check(ApiKey.SASL_AUTHENTICATE)
    session.authenticate(f"\x00{user}\x00{password}".encode())


def test_reauthentication_state_machine():
    """KIP-368 with a fake clock: the session lifetime, re-authentication with the same
    principal, a changed principal or mechanism refused, an expired session closed."""
    USERS["bob"] = "bob-secret"
    now = [1000.0]
    creds = {}
    session = SaslSession(("PLAIN", "SCRAM-SHA-512"), lambda u, m: creds.get((u, m)),
                          lambda u, p: USERS.get(u) == p, clock_s=lambda: now[0],
                          reauth_ms=10_000)
    _login_plain(session)
    assert session.state == SaslState.COMPLETE and session.session_lifetime_ms() == 10_000
    session.check(ApiKey.METADATA)
    now[0] += 9
    _login_plain(session)                          # re-authenticated in time: 10 s more
    assert session.session_lifetime_ms() == 10_000 and session.principal == "User:alice"
    now[0] += 11
    with pytest.raises(SaslStateError, match="expired"):
        session.check(ApiKey.METADATA)
    session.check(ApiKey.SASL_HANDSHAKE)           # a late re-authentication still may
    with pytest.raises(SaslStateError):
        session.check(ApiKey.METADATA)             # ... and nothing else in between
    changed = SaslSession(("PLAIN",), lambda u, m: None, lambda u, p: USERS.get(u) == p,
                          clock_s=lambda: now[0], reauth_ms=10_000)
    _login_plain(changed)
    changed.check(ApiKey.SASL_HANDSHAKE)
    assert changed.handshake("PLAIN")
    with pytest.raises(AuthenticationFailed, match="Cannot change principals"):
        changed.authenticate(b"\x00bob\x00bob-secret")
    assert changed.state == SaslState.FAILED
    other_mechanism = SaslSession(("PLAIN", "SCRAM-SHA-512"), lambda u, m: None,
                                  lambda u, p: USERS.get(u) == p, reauth_ms=10_000)
    _login_plain(other_mechanism)
    assert not other_mechanism.handshake("SCRAM-SHA-512")
    # Without connections.max.reauth.ms: lifetime 0, a second handshake is not expected.
    plain = _session()
    _login_plain(plain)
    assert plain.session_lifetime_ms() == 0 and not plain.expects_handshake()
    del USERS["bob"]


def test_confluent_kafka_reauthenticates(tmp_path, caplog):
    """librdkafka re-authenticates within connections.max.reauth.ms and keeps producing
    on the same connection; the broker never closes it for an expired session."""
    caplog.set_level(logging.INFO, logger="onceflow")
    certs = make_certs(tmp_path / "certs")
    broker = Broker(tmp_path / "data", listeners="SASL_SSL://127.0.0.1:0",
                    ssl_certfile=certs.cert_file, ssl_keyfile=certs.key_file,
                    add_scram=("SCRAM-SHA-512=[name=alice,password=alice-secret]",),
                    connections_max_reauth_ms=1500)
    with broker:
        settings = _settings(broker, certs, "SASL_SSL", "SCRAM-SHA-512")
        reports: list = []
        producer = Producer(settings)
        topic = f"t-{uuid.uuid4().hex[:8]}"
        deadline = time.monotonic() + 5    # over three session lifetimes
        sent = 0
        while time.monotonic() < deadline:
            producer.produce(topic, b"v", on_delivery=lambda err, msg: reports.append(err))
            sent += 1
            producer.poll(0.2)
        assert producer.flush(WAIT_S) == 0
        assert reports == [None] * sent
    logins = [r for r in caplog.records
              if "authentication of User:alice" in r.getMessage()]
    closed = [r for r in caplog.records if "expired" in r.getMessage()]
    # One or two connections log in, and at least one re-authenticates in 5 s.
    assert len(logins) >= 3 and not closed, [r.getMessage() for r in caplog.records]
