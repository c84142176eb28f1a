"""Fault injection as users meet it: the Python API, the admin endpoint, the CLI, metrics.

Each rule is checked from the client's side with a raw protocol client, so what the
client sees (no answer, a late answer, an error, a closed connection) and what the
broker did (appended or not) are both exact.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest
from kio.schema.errors import ErrorCode
from typer.testing import CliRunner

from onceflow import Broker
from onceflow.broker.faults import parse_api, parse_error_code
from onceflow.cli.app import app
from onceflow.testing import free_port
from tests.helpers import create_topic, unique
from tests.integration.test_idempotence_rules import log_end_offset, new_producer
from tests.kafka_raw import RawClient

METADATA = 3
NO_ANSWER_S = 0.5  # how long "no answer" is waited for


@pytest.fixture(scope="module")
def broker():
    with Broker(admin_port=0) as running:
        yield running


@pytest.fixture(autouse=True)
def clean_rules(broker):
    yield
    broker.faults.clear()


@pytest.fixture
def topic(broker) -> str:
    return create_topic(broker.bootstrap_servers, unique("faults"))


@pytest.fixture
def client(broker):
    with RawClient(broker.bootstrap_servers) as raw:
        yield raw


def metadata(client: RawClient):
    return client.request(METADATA, 9, {"topics": [], "allow_auto_topic_creation": False,
                                        "include_cluster_authorized_operations": False,
                                        "include_topic_authorized_operations": False})


def sample(broker: Broker, name: str, **labels: str) -> float:
    value = broker.server.state.metrics.registry.get_sample_value(name, labels)
    return value or 0.0


def answered_within(client: RawClient, seconds: float) -> bool:
    client.sock.settimeout(seconds)
    try:
        client.sock.recv(1, socket.MSG_PEEK)
        return True
    except TimeoutError:
        return False
    finally:
        client.sock.settimeout(15)


def closed(client: RawClient) -> bool:
    try:
        return client.sock.recv(1) == b""
    except ConnectionError:
        return True


# --- request rules ---------------------------------------------------------------------------


def test_drop_responses_performs_the_request_but_never_answers(broker, client, topic):
    producer = new_producer(client, topic)
    rule = broker.faults.drop_responses("produce", count=1)
    client.send_frame(client.encode(0, 9, {
        "transactional_id": None, "acks": -1, "timeout": 5000, "topic_data": [
            {"name": topic, "partition_data": [{"index": 0, "records": producer.batch(0)}]}]}))
    assert not answered_within(client, NO_ANSWER_S)
    # The connection is dead, as after a real loss: a later request is not answered either
    # (Kafka never answers out of order), and is not performed.
    client.send_frame(client.encode(0, 9, {
        "transactional_id": None, "acks": -1, "timeout": 5000, "topic_data": [
            {"name": topic, "partition_data": [{"index": 0, "records": producer.batch(2)}]}]}))
    assert not answered_within(client, NO_ANSWER_S)
    # The client gives up and reconnects: the dropped produce was appended (its retry is
    # a duplicate), the one sent after the stall was not.
    with RawClient(broker.bootstrap_servers) as again:
        assert log_end_offset(again, topic) == 2
        producer.client = again
        assert producer.produce(0).base_offset == 0
        assert producer.produce(2).base_offset == 2
    assert [r["fired"] for r in broker.faults.rules() if r["id"] == rule] == [1]
    assert sample(broker, "onceflow_faults_injected_total", kind="drop_responses",
                  request="Produce") >= 1


def test_delay_responses_answers_late(broker, client, topic):
    producer = new_producer(client, topic)
    broker.faults.delay_responses("produce", ms=400, count=1)
    started = time.monotonic()
    assert producer.produce(0).base_offset == 0
    assert time.monotonic() - started >= 0.4
    started = time.monotonic()
    producer.produce(2)
    assert time.monotonic() - started < 0.4, "count=1: the second answer is not delayed"


def test_fail_requests_answers_the_error_without_performing(broker, client, topic):
    producer = new_producer(client, topic)
    before = sample(broker, "onceflow_errors_total", request="Produce",
                    error="NOT_LEADER_OR_FOLLOWER")
    broker.faults.fail_requests("produce", "NOT_LEADER_OR_FOLLOWER", count=2)
    assert producer.produce(0).error == ErrorCode.not_leader_or_follower
    assert producer.produce(0).error == ErrorCode.not_leader_or_follower
    assert log_end_offset(client, topic) == 0
    assert producer.produce(0).base_offset == 0  # spent: the same batch now goes in
    assert sample(broker, "onceflow_errors_total", request="Produce",
                  error="NOT_LEADER_OR_FOLLOWER") == before + 2


def test_fail_requests_for_init_producer_id(broker, client):
    broker.faults.fail_requests("InitProducerId", ErrorCode.coordinator_load_in_progress)
    body = {"transactional_id": None, "transaction_timeout": 1000}
    assert client.request(22, 2, body).error_code == ErrorCode.coordinator_load_in_progress
    assert client.request(22, 2, body).error_code == ErrorCode.none


def test_fail_requests_refuses_apis_without_an_error_answer(broker):
    with pytest.raises(ValueError, match="fail_requests supports"):
        broker.faults.fail_requests("create_topics", "NOT_CONTROLLER")


@pytest.mark.parametrize("perform", [False, True])
def test_close_connections_before_or_after_performing(broker, client, topic, perform):
    producer = new_producer(client, topic)
    broker.faults.close_connections("produce", count=1, perform=perform)
    with pytest.raises(ConnectionError):
        producer.produce(0)
    with RawClient(broker.bootstrap_servers) as fresh:
        assert log_end_offset(fresh, topic) == (2 if perform else 0)
        producer.client = fresh
        assert producer.produce(0).base_offset == 0  # a duplicate if it was performed


def test_rules_match_the_api_only(broker, client, topic):
    broker.faults.fail_requests("fetch", "NOT_LEADER_OR_FOLLOWER")
    assert new_producer(client, topic).produce(0).error == ErrorCode.none
    assert len([r for r in broker.faults.rules() if r["active"]]) == 1


# --- connection rules and nodes ------------------------------------------------------------


def test_refuse_connections_by_count_and_by_time(broker):
    host, port = broker.bootstrap_servers.rsplit(":", 1)
    broker.faults.refuse_connections(count=1)
    with socket.create_connection((host, int(port)), timeout=5) as refused:
        refused.settimeout(5)
        assert refused.recv(1) == b""
    with RawClient(broker.bootstrap_servers) as accepted:
        assert metadata(accepted).brokers
    broker.faults.refuse_connections(seconds=0.3)
    with socket.create_connection((host, int(port)), timeout=5) as refused:
        refused.settimeout(5)
        assert refused.recv(1) == b""
    time.sleep(0.35)
    with RawClient(broker.bootstrap_servers) as accepted:
        assert metadata(accepted).brokers


def test_node_down_moves_leadership_and_node_up_restores_it():
    with Broker(nodes=3) as cluster:
        addresses = cluster.bootstrap_servers.split(",")
        topic = create_topic(cluster.bootstrap_servers, unique("nodes"), 6, 3)
        state = cluster.server.state
        leaders = {p: state.leader(state.topic(topic), p) for p in range(6)}
        with RawClient(addresses[1]) as on_node_1:
            cluster.faults.node_down(1)
            assert closed(on_node_1)
        with socket.create_connection(addresses[1].rsplit(":", 1), timeout=5) as refused:
            refused.settimeout(5)
            assert refused.recv(1) == b""
        with RawClient(addresses[0]) as client:
            assert sorted(b.node_id for b in metadata(client).brokers) == [0, 2]
        moved = {p: state.leader(state.topic(topic), p) for p in range(6)}
        assert 1 not in moved.values() and 1 in leaders.values()
        with pytest.raises(ValueError, match="no node 7"):
            cluster.faults.node_down(7)
        cluster.faults.node_down(2)
        with pytest.raises(ValueError, match="last live node"):
            cluster.faults.node_down(0)
        cluster.faults.clear()  # every node back up
        assert {p: state.leader(state.topic(topic), p) for p in range(6)} == leaders
        with RawClient(addresses[1]) as client:
            assert sorted(b.node_id for b in metadata(client).brokers) == [0, 1, 2]


# --- thread safety, parsing ------------------------------------------------------------------


def test_rules_are_thread_safe_while_traffic_flows(broker, topic):
    stop = threading.Event()
    errors: list[BaseException] = []

    def churn() -> None:
        try:
            while not stop.is_set():
                rule = broker.faults.delay_responses("fetch", ms=1, count=None)
                broker.faults.rules()
                broker.faults.remove(rule)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=churn) for _ in range(3)]
    for thread in threads:
        thread.start()
    with RawClient(broker.bootstrap_servers) as client:
        producer = new_producer(client, topic)
        for i in range(200):
            assert producer.produce(2 * i).base_offset == 2 * i
    stop.set()
    for thread in threads:
        thread.join()
    assert not errors


def test_parsing_of_api_and_error_names():
    assert parse_api("produce") == parse_api("Produce") == parse_api("PRODUCE") == 0
    assert parse_api("InitProducerId") == parse_api("init-producer-id") == parse_api("22") == 22
    assert parse_api("*") is None and parse_api(None) is None
    assert parse_error_code("NOT_LEADER_OR_FOLLOWER") == parse_error_code("6") == 6
    with pytest.raises(ValueError):
        parse_api("nope")
    with pytest.raises(ValueError):
        parse_error_code("NOPE")


# --- admin endpoint --------------------------------------------------------------------------


def http(broker: Broker, method: str, path: str, body: object = None) -> tuple[int, bytes]:
    data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(broker.admin_url + path, data=data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_admin_endpoint_adds_lists_and_clears_rules(broker):
    status, body = http(broker, "POST", "/faults", {"kind": "drop_responses", "api": "produce",
                                                    "count": 2})
    assert status == 201 and json.loads(body)["remaining"] == 2
    status, body = http(broker, "POST", "/faults", {"kind": "delay_responses", "api": "fetch",
                                                    "ms": 50, "count": None})
    delay_id = json.loads(body)["id"]
    listed = json.loads(http(broker, "GET", "/faults")[1])
    assert [r["kind"] for r in listed["rules"]] == ["drop_responses", "delay_responses"]
    assert listed["rules"][1]["remaining"] is None and listed["nodes"][0]["up"]
    assert http(broker, "DELETE", f"/faults/{delay_id}")[0] == 200
    assert http(broker, "DELETE", f"/faults/{delay_id}")[0] == 404
    assert json.loads(http(broker, "DELETE", "/faults")[1])["cleared"] == 1
    assert json.loads(http(broker, "GET", "/faults")[1])["rules"] == []


@pytest.mark.parametrize("body, message", [
    (b"{not json", "Expecting"),
    (b"[1]", "JSON object"),
    ({"kind": "explode"}, "unknown fault kind"),
    ({"kind": "drop_responses", "api": "nope"}, "unknown API"),
    ({"kind": "drop_responses", "count": 0}, "count must be at least 1"),
    ({"kind": "delay_responses"}, "ms is required"),
    ({"kind": "fail_requests", "error": "NOPE"}, "unknown error code"),
    ({"kind": "node_down"}, "node_id is required"),
])
def test_admin_endpoint_rejects_bad_rules(broker, body, message):
    status, answer = http(broker, "POST", "/faults", body)
    assert status == 400 and message in json.loads(answer)["error"]


def test_admin_endpoint_serves_prometheus_metrics(broker, client, topic):
    new_producer(client, topic).produce(0)
    status, body = http(broker, "GET", "/metrics")
    text = body.decode()
    assert status == 200
    assert 'onceflow_requests_total{request="Produce"}' in text
    assert 'onceflow_errors_total{error="NONE",request="InitProducerId"}' in text
    assert http(broker, "GET", "/nowhere")[0] == 404
    assert http(broker, "POST", "/metrics", b"")[0] == 405


def test_admin_endpoint_survives_garbage(broker):
    host, port = broker.admin_url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as raw:
        raw.sendall(b"\x00\xff garbage\r\n\r\n")
        assert raw.recv(100).startswith(b"HTTP/1.1 400")
    with socket.create_connection((host, int(port)), timeout=5) as raw:
        raw.sendall(b"POST /faults HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n")
        assert raw.recv(100).startswith(b"HTTP/1.1 413")
    assert http(broker, "GET", "/faults")[0] == 200


# --- the command line, against a broker process ----------------------------------------------


def test_cli_drives_faults_and_stats_of_a_broker_process(onceflow_broker_process):
    admin_port = free_port()
    process = onceflow_broker_process(args=("--admin-port", str(admin_port)))
    admin = f"http://127.0.0.1:{admin_port}"
    runner = CliRunner()

    def onceflow(*args: str):
        result = runner.invoke(app, [*args, "--admin", admin])
        assert result.exit_code == 0, result.output
        return result.output

    topic = create_topic(process.bootstrap_servers, unique("cli"))
    added = onceflow("faults", "add", "fail_requests", "--api", "produce",
                     "--error", "NOT_ENOUGH_REPLICAS", "--count", "1")
    assert "fail" in added and "NOT_ENOUGH_REPLICAS" in added
    with RawClient(process.bootstrap_servers) as client:
        producer = new_producer(client, topic)
        assert producer.produce(0).error == ErrorCode.not_enough_replicas
        assert producer.produce(0).error == ErrorCode.none
        assert producer.produce(0).error == ErrorCode.none  # a duplicate
    listed = onceflow("faults", "list")
    assert "spent" in listed and "NOT_ENOUGH_REPLICAS" in listed
    stats = onceflow("broker", "stats")
    assert "NOT_ENOUGH_REPLICAS" in stats and topic in stats and "Produce" in stats
    assert "cleared" in onceflow("faults", "clear")
    bad = runner.invoke(app, ["faults", "add", "explode", "--admin", admin])
    assert bad.exit_code == 1 and "unknown fault kind" in bad.output
    nobody = runner.invoke(app, ["broker", "stats", "--admin", f"http://127.0.0.1:{free_port()}"])
    assert nobody.exit_code == 1 and "no admin endpoint" in nobody.output

