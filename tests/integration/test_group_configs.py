"""GROUP config resources (type 32, issue 15) over real sockets: described and altered with
Kafka's keys, bounds and errors, persisted across a restart, and used by the consumer group
coordinator (KIP-848) for that group only. confluent-kafka (2.16) and the Java client
(3.9) have no GROUP config resource type, so the requests go over a raw socket."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode

from onceflow.broker.embedded import Broker
from tests.helpers import TIMEOUT_S, create_topic, unique, wait_for
from tests.kafka_raw import RawClient

E = ErrorCode
DESCRIBE_CONFIGS, INCREMENTAL_ALTER_CONFIGS, ALTER_CONFIGS = 32, 44, 33
HEARTBEAT, DESCRIBE_GROUPS = 68, 69
GROUP = 32
SOURCE_DEFAULT, SOURCE_GROUP = 5, 8
SETTINGS = {"offsets_topic_num_partitions": 1, "group_initial_rebalance_delay_ms": 0,
            "consumer_group_min_session_timeout_ms": 1_000,
            "consumer_group_min_heartbeat_interval_ms": 100}


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with Broker(tmp_path_factory.mktemp("groupcfg"), **SETTINGS) as running:
        yield running


def _alter(bootstrap: str, group: str, ops: list[tuple[str, int, str | None]]):
    body = {"resources": [{"resource_type": GROUP, "resource_name": group, "configs": [
        {"name": k, "config_operation": op, "value": v} for k, op, v in ops]}],
        "validate_only": False}
    with RawClient(bootstrap) as client:
        (result,) = client.request(INCREMENTAL_ALTER_CONFIGS, 1, body).responses
    return result


def _describe(bootstrap: str, group: str):
    body = {"resources": [{"resource_type": GROUP, "resource_name": group,
                           "configuration_keys": None}],
            "include_synonyms": True, "include_documentation": False}
    with RawClient(bootstrap) as client:
        (result,) = client.request(DESCRIBE_CONFIGS, 4, body).results
    return result


def test_describe_alter_delete(broker):
    bootstrap, group = broker.bootstrap_servers, unique("g")
    before = {c.name: (c.value, c.config_source, c.config_type, c.read_only)
              for c in _describe(bootstrap, group).configs}
    assert before == {"consumer.session.timeout.ms": ("45000", SOURCE_DEFAULT, 3, False),
                      "consumer.heartbeat.interval.ms": ("5000", SOURCE_DEFAULT, 3, False)}
    result = _alter(bootstrap, group, [("consumer.session.timeout.ms", 0, "20000")])
    assert result.error_code == E.none, result.error_message
    entry = {c.name: c for c in _describe(bootstrap, group).configs}[
        "consumer.session.timeout.ms"]
    assert (entry.value, entry.config_source) == ("20000", SOURCE_GROUP)
    assert [(s.name, s.value, s.source) for s in entry.synonyms] == [
        ("consumer.session.timeout.ms", "20000", SOURCE_GROUP)]
    # Legacy AlterConfigs replaces the whole set.
    body = {"resources": [{"resource_type": GROUP, "resource_name": group, "configs": [
        {"name": "consumer.heartbeat.interval.ms", "value": "2000"}]}], "validate_only": False}
    with RawClient(bootstrap) as client:
        (legacy,) = client.request(ALTER_CONFIGS, 2, body).responses
    assert legacy.error_code == E.none, legacy.error_message
    after = {c.name: (c.value, c.config_source) for c in _describe(bootstrap, group).configs}
    assert after == {"consumer.session.timeout.ms": ("45000", SOURCE_DEFAULT),
                     "consumer.heartbeat.interval.ms": ("2000", SOURCE_GROUP)}
    assert _alter(bootstrap, group, [("consumer.heartbeat.interval.ms", 1, None)]).error_code \
        == E.none
    assert broker.server.state.resource_configs.names(GROUP).count(group) == 0


@pytest.mark.parametrize(("name", "ops", "code", "message"), [
    ("", [("consumer.session.timeout.ms", 0, "20000")], E.invalid_request,
     "Default group resources are not allowed."),
    ("g", [("share.session.timeout.ms", 0, "20000")], E.invalid_config,
     "Unknown group config name: share.session.timeout.ms"),
    ("g", [("consumer.session.timeout.ms", 0, "soon")], E.invalid_config,
     ("Invalid value soon for configuration consumer.session.timeout.ms: "
      "Not a number of type INT")),
    ("g", [("consumer.session.timeout.ms", 0, "500")], E.invalid_config,
     ("consumer.session.timeout.ms must be greater than or equal to "
      "group.consumer.min.session.timeout.ms")),
    ("g", [("consumer.heartbeat.interval.ms", 0, "16000")], E.invalid_config,
     ("consumer.heartbeat.interval.ms must be less than or equal to "
      "group.consumer.max.heartbeat.interval.ms")),
    ("g", [("consumer.session.timeout.ms", 0, "2000"),
           ("consumer.heartbeat.interval.ms", 0, "2000")], E.invalid_config,
     "consumer.session.timeout.ms must be greater than consumer.heartbeat.interval.ms"),
    ("g", [("consumer.session.timeout.ms", 2, "2000")], E.invalid_config,
     "Can't APPEND to key consumer.session.timeout.ms because its type is not LIST."),
])
def test_kafkas_refusals_store_nothing(broker, name, ops, code, message):
    result = _alter(broker.bootstrap_servers, name, ops)
    assert (result.error_code, result.error_message) == (code, message)
    assert name not in broker.server.state.resource_configs.names(GROUP)


def _heartbeat(client: RawClient, group: str, **fields):
    body = {"group_id": group, "member_id": "m", "member_epoch": 0, "instance_id": None,
            "rack_id": None, "rebalance_timeout": 30_000, "subscribed_topic_names": None,
            "subscribed_topic_regex": None, "server_assignor": None, "topic_partitions": [],
            **fields}
    return client.request(HEARTBEAT, 1, body)


def _members(client: RawClient, group: str) -> int:
    body = {"group_ids": [group], "include_authorized_operations": False}
    (described,) = client.request(DESCRIBE_GROUPS, 0, body).groups
    return len(described.members)


def test_the_coordinator_uses_the_groups_own_timeouts(broker):
    bootstrap = broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("t"))
    group, other = unique("own"), unique("plain")
    assert _alter(bootstrap, group, [("consumer.session.timeout.ms", 0, "1500"),
                                     ("consumer.heartbeat.interval.ms", 0, "300")]).error_code \
        == E.none
    with RawClient(bootstrap) as raw:
        raw.request(10, 1, {"key": group, "key_type": 0})  # FindCoordinator
        wait_for(lambda: _heartbeat(raw, other, member_epoch=-1).error_code
                 != E.coordinator_not_available, "the coordinator", TIMEOUT_S)
        joined = _heartbeat(raw, group, subscribed_topic_names=[topic])
        plain = _heartbeat(raw, other, subscribed_topic_names=[topic])
        assert (joined.error_code, joined.heartbeat_interval.total_seconds()) == (E.none, 0.3)
        assert (plain.error_code, plain.heartbeat_interval.total_seconds()) == (E.none, 5.0)
        # No more heartbeats: the group's 1.5 s session expires; the other group's broker
        # default (45 s) keeps its member.
        wait_for(lambda: _members(raw, group) == 0, "the member's session to expire",
                 TIMEOUT_S)
        assert _members(raw, other) == 1


def test_group_configs_survive_a_restart(tmp_path):
    group = unique("kept")
    with Broker(tmp_path, **SETTINGS) as first:
        assert _alter(first.bootstrap_servers, group,
                      [("consumer.session.timeout.ms", 0, "50000")]).error_code == E.none
    with Broker(tmp_path, **SETTINGS) as second:
        values = {c.name: c.value for c in _describe(second.bootstrap_servers, group).configs}
        assert values["consumer.session.timeout.ms"] == "50000"


def test_an_unknown_operation_is_refused(broker):
    result = _alter(broker.bootstrap_servers, "g", [("consumer.session.timeout.ms", 7, "1")])
    assert result.error_code == E.invalid_request
    assert "g" not in broker.server.state.resource_configs.names(GROUP)
