"""max.connections.per.ip and max.connections (issue 19) as a client sees them: a connection
over its IP's limit is closed at accept while the others keep working; one over the
broker-wide limit waits unanswered and is served once another connection closes."""

from __future__ import annotations

import socket
import struct
import time

import pytest
from confluent_kafka import Consumer, Producer

from onceflow import Broker
from tests.helpers import create_topic, unique, wait_for

SMALL = {"offsets_topic_num_partitions": 1, "transaction_state_num_partitions": 1,
         "group_initial_rebalance_delay_ms": 0}
WAIT_S = 30.0
# ApiVersions v0 with client id "limits": the first thing every client sends.
API_VERSIONS = struct.pack(">hhih", 18, 0, 7, 6) + b"limits"


def api_versions(sock: socket.socket) -> bytes:
    """Send ApiVersions and read the answer; b"" when the broker closed the connection."""
    sock.sendall(struct.pack(">i", len(API_VERSIONS)) + API_VERSIONS)
    data = b""
    try:
        while len(data) < 4 or len(data) < 4 + struct.unpack(">i", data[:4])[0]:
            chunk = sock.recv(65536)
            if not chunk:
                return b""
            data += chunk
    except ConnectionResetError:
        return b""
    return data


def connect(broker: Broker) -> socket.socket:
    host, port = broker.bootstrap_servers.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=WAIT_S)


def metric(broker: Broker, name: str) -> float:
    text = broker.server.state.metrics.render().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith((name + "{", name + " ")))


def consume(consumer: Consumer, values: set[bytes]) -> None:
    deadline = time.monotonic() + WAIT_S
    while values and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            values.discard(message.value())
    assert not values, f"not consumed: {sorted(values)}"


def produce(producer: Producer, topic: str, values: list[bytes]) -> None:
    for value in values:
        producer.produce(topic, value)
    assert producer.flush(WAIT_S) == 0


def test_a_connection_over_the_per_ip_limit_is_closed_and_the_others_carry_on(tmp_path):
    with Broker(tmp_path / "data", max_connections_per_ip=3, **SMALL) as broker:
        topic = unique("per-ip")
        create_topic(broker.bootstrap_servers, topic)  # its admin client closes after
        quotas = broker.server.connections.quotas
        wait_for(lambda: quotas.total == 0, "the admin client's connection to close", WAIT_S)
        # librdkafka: one connection for the producer, two for a group consumer (its
        # broker and its group coordinator): the three the limit allows. (A client's
        # bootstrap connection may briefly overlap its successor and be refused once;
        # librdkafka reconnects, so only the steady state is checked.)
        producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
        produce(producer, topic, [b"before"])
        consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers,
                             "group.id": unique("g"), "auto.offset.reset": "earliest"})
        try:
            consumer.subscribe([topic])
            consume(consumer, {b"before"})
            wait_for(lambda: quotas.total == 3, "the clients' three connections", WAIT_S)
            refused = metric(broker, "onceflow_connections_refused_total")

            with connect(broker) as fourth:
                assert api_versions(fourth) == b""   # closed, nothing answered
            assert metric(broker, "onceflow_connections_refused_total") == refused + 1
            assert quotas.total == 3

            values = [b"after-%d" % n for n in range(10)]
            produce(producer, topic, values)
            consume(consumer, set(values))
        finally:
            consumer.close()
        # Its two connections are uncounted: one more may come from this address.
        wait_for(lambda: quotas.total == 1, "the consumer's connections to be released", WAIT_S)
        with connect(broker) as another:
            assert api_versions(another)


def test_a_connection_over_max_connections_waits_and_is_served_once_one_closes(tmp_path):
    with Broker(tmp_path / "data", max_connections=2, **SMALL) as broker:
        topic = unique("max")
        create_topic(broker.bootstrap_servers, topic)
        quotas = broker.server.connections.quotas
        wait_for(lambda: quotas.total == 0, "the admin client's connection to close", WAIT_S)
        first, second = connect(broker), connect(broker)
        try:
            assert api_versions(first) and api_versions(second)
            producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
            producer.produce(topic, b"waited")
            wait_for(lambda: len(broker.server.connections.waiting) == 1,
                     "the producer's connection to wait for a slot", WAIT_S)
            # Waiting: its requests are not read, so nothing is delivered.
            assert producer.flush(1.0) == 1
            assert metric(broker, "onceflow_connections_waiting") == 1
            first.close()
            assert producer.flush(WAIT_S) == 0   # served in the freed slot
            assert quotas.total == 2 and not broker.server.connections.waiting
            assert api_versions(second)   # the one left open was never disturbed
        finally:
            first.close()
            second.close()
        assert metric(broker, "onceflow_connections_created_total") >= 3


def test_per_ip_zero_needs_overrides(tmp_path):
    with pytest.raises(RuntimeError) as failure:
        Broker(tmp_path / "data", max_connections_per_ip=0, **SMALL).start()
    assert "max.connections.per.ip.overrides" in str(failure.value.__cause__)


def test_a_dynamic_per_ip_limit_applies_to_the_next_accept(tmp_path):
    """IncrementalAlterConfigs on BROKER "0" (as `kafka-configs --alter --entity-type brokers
    --entity-name 0 --add-config max.connections.per.ip=2`) takes effect without a restart;
    deleting it brings back the static value; a dynamic zero without overrides is refused.
    (Sent on a raw connection that is closed at once, so the count is known.)"""
    from kio.schema.errors import ErrorCode

    from tests.kafka_raw import RawClient

    def alter(operation: int, value: str | None) -> tuple[ErrorCode, str | None]:
        body = {"resources": [{"resource_type": 4, "resource_name": "0", "configs": [
            {"name": "max.connections.per.ip", "config_operation": operation,
             "value": value}]}], "validate_only": False}
        with RawClient(broker.bootstrap_servers) as client:
            (result,) = client.request(44, 1, body).responses
        return result.error_code, result.error_message

    with Broker(tmp_path / "data", **SMALL) as broker:
        quotas = broker.server.connections.quotas
        error, message = alter(0, "0")
        assert error == ErrorCode.invalid_request and "can be set to zero only if" in message
        assert alter(0, "2") == (ErrorCode.none, None)
        wait_for(lambda: quotas.total == 0, "the raw connection to be released", WAIT_S)
        with connect(broker) as first, connect(broker) as second:
            assert api_versions(first) and api_versions(second)
            with connect(broker) as third:
                assert api_versions(third) == b""   # over the dynamic limit: closed
            assert api_versions(first)
        wait_for(lambda: quotas.total == 0, "the two connections to be released", WAIT_S)
        assert alter(1, None) == (ErrorCode.none, None)   # DELETE: the static default again
        wait_for(lambda: quotas.total == 0, "the raw connection to be released", WAIT_S)
        sockets = [connect(broker) for _ in range(3)]
        try:
            assert all(api_versions(sock) for sock in sockets)
        finally:
            for sock in sockets:
                sock.close()
