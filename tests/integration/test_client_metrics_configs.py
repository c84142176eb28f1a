"""CLIENT_METRICS config resources (KIP-714) and ListConfigResources (API 74: v0 as
ListClientMetricsResources, v1 with resource type filters, KIP-1142) over a raw socket,
with Kafka's validation messages. The Java Admin side is in test_java_admin.py."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode

from onceflow.broker.embedded import Broker
from tests.helpers import create_topic, unique
from tests.kafka_raw import RawClient

E = ErrorCode
DESCRIBE_CONFIGS, INCREMENTAL_ALTER_CONFIGS, LIST_CONFIG_RESOURCES = 32, 44, 74
TOPIC, BROKER, BROKER_LOGGER, CLIENT_METRICS, GROUP = 2, 4, 8, 16, 32


@pytest.fixture(scope="module")
def bootstrap(tmp_path_factory):
    with Broker(tmp_path_factory.mktemp("cm"), nodes=2, offsets_topic_num_partitions=1) as b:
        yield b.bootstrap_servers


def _request(bootstrap: str, api_key: int, version: int, body: dict):
    with RawClient(bootstrap.split(",")[0]) as client:
        return client.request(api_key, version, body)


def _alter(bootstrap: str, kind: int, name: str, ops: list[tuple[str, int, str | None]]):
    body = {"resources": [{"resource_type": kind, "resource_name": name, "configs": [
        {"name": k, "config_operation": op, "value": v} for k, op, v in ops]}],
        "validate_only": False}
    (result,) = _request(bootstrap, INCREMENTAL_ALTER_CONFIGS, 1, body).responses
    return result.error_code, result.error_message


def _describe(bootstrap: str, name: str):
    body = {"resources": [{"resource_type": CLIENT_METRICS, "resource_name": name,
                           "configuration_keys": None}],
            "include_synonyms": False, "include_documentation": False}
    (result,) = _request(bootstrap, DESCRIBE_CONFIGS, 4, body).results
    return result


def _listed(bootstrap: str, types: list[int]) -> set[tuple[int, str]]:
    response = _request(bootstrap, LIST_CONFIG_RESOURCES, 1, {"resource_types": types})
    assert response.error_code == E.none
    return {(int(r.resource_type), r.resource_name) for r in response.config_resources}


def test_subscriptions_stored_described_listed_and_deleted(bootstrap):
    name = unique("sub")
    assert _alter(bootstrap, CLIENT_METRICS, name, [
        ("metrics", 0, "org.apache.kafka.producer."), ("interval.ms", 0, "1000"),
        ("match", 0, "client_id=app-.*")]) == (E.none, None)
    assert _alter(bootstrap, CLIENT_METRICS, name, [
        ("metrics", 2, "org.apache.kafka.consumer.")]) == (E.none, None)  # APPEND
    described = _describe(bootstrap, name)
    assert {(c.name, c.value, c.config_source) for c in described.configs} == {
        ("metrics", "org.apache.kafka.producer.,org.apache.kafka.consumer.", 7),
        ("interval.ms", "1000", 7), ("match", "client_id=app-.*", 7)}
    v0 = _request(bootstrap, LIST_CONFIG_RESOURCES, 0, {})
    assert name in {r.resource_name for r in v0.config_resources}
    assert (CLIENT_METRICS, name) in _listed(bootstrap, [CLIENT_METRICS])
    assert _alter(bootstrap, CLIENT_METRICS, name, [
        ("metrics", 1, None), ("interval.ms", 1, None), ("match", 1, None)]) == (E.none, None)
    assert (CLIENT_METRICS, name) not in _listed(bootstrap, [CLIENT_METRICS])
    assert _describe(bootstrap, name).configs == ()


@pytest.mark.parametrize(("name", "ops", "expected"), [
    ("s", [("interval.ms", 0, "50")], (E.invalid_request, (
        "Invalid value 50 for interval.ms, interval must be between 100 and 3600000 (1 hour)"))),
    ("s", [("match", 0, "client_colour=red")],
     (E.invalid_config, "Illegal client matching pattern: client_colour=red")),
    ("s", [("colour", 0, "red")],
     (E.invalid_request, "Unknown client metrics configuration: colour")),
    ("s", [("interval.ms", 2, "100")],
     (E.invalid_config, "Can't APPEND to key interval.ms because its type is not LIST.")),
    ("", [("interval.ms", 0, "1000")], (E.invalid_request, "Subscription name can't be empty")),
])
def test_kafkas_refusals(bootstrap, name, ops, expected):
    assert _alter(bootstrap, CLIENT_METRICS, name, ops) == expected
    assert _describe(bootstrap, "s").configs == ()


def test_list_config_resources_by_type(bootstrap):
    topic = create_topic(bootstrap, unique("t"))
    group = unique("g")
    assert _alter(bootstrap, GROUP, group, [("consumer.session.timeout.ms", 0, "50000")]) == (
        E.none, None)
    everything = _listed(bootstrap, [])
    assert {(TOPIC, topic), (BROKER, "0"), (BROKER, "1"), (BROKER_LOGGER, "0"),
            (GROUP, group)} <= everything
    assert _listed(bootstrap, [GROUP, BROKER]) == {(GROUP, group), (BROKER, "0"), (BROKER, "1")}
    unsupported = _request(bootstrap, LIST_CONFIG_RESOURCES, 1, {"resource_types": [1]})
    assert (unsupported.error_code, unsupported.config_resources) == (
        E.unsupported_version, ())
