"""DescribeClientQuotas and AlterClientQuotas (issue 15) as Kafka answers them: entity
types and combinations, match types and strict filters, key and value validation, and
quotas that survive a restart (broker/quotas.py)."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode as E

from onceflow import Broker
from tests.kafka_raw import RawClient

DESCRIBE, ALTER = 48, 49
EXACT, DEFAULT, ANY = 0, 1, 2


SMALL = {"offsets_topic_num_partitions": 1, "transaction_state_num_partitions": 1}


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with Broker(tmp_path_factory.mktemp("quotas") / "data", **SMALL) as running:
        yield running


def alter(client: RawClient, entity: dict, ops: dict, validate_only: bool = False):
    """One entry: entity {type: name or None}, ops {key: value or None (remove)}."""
    answer = client.request(ALTER, 1, {"validate_only": validate_only, "entries": [{
        "entity": [{"entity_type": t, "entity_name": n} for t, n in entity.items()],
        "ops": [{"key": k, "value": 0.0 if v is None else v, "remove": v is None}
                for k, v in ops.items()]}]})
    [entry] = answer.entries
    return entry.error_code, entry.error_message


def describe(client: RawClient, *components: tuple[str, int, str | None], strict=False):
    answer = client.request(DESCRIBE, 1, {"strict": strict, "components": [
        {"entity_type": t, "match_type": m, "match": n} for t, m, n in components]})
    if answer.error_code != E.none:
        return answer.error_code, answer.error_message
    return {tuple((e.entity_type, e.entity_name) for e in entry.entity):
            {v.key: v.value for v in entry.values} for entry in answer.entries}


def test_alter_then_describe_with_every_match_type_and_a_restart(tmp_path):
    broker = Broker(tmp_path / "data", **SMALL).start()
    with RawClient(broker.bootstrap_servers) as client:
        assert alter(client, {"user": "alice"}, {"producer_byte_rate": 1024.0}) == (E.none, None)
        assert alter(client, {"user": None}, {"consumer_byte_rate": 2048.0})[0] == E.none
        assert alter(client, {"user": "alice", "client-id": "app"},
                     {"request_percentage": 12.5})[0] == E.none
        assert alter(client, {"client-id": "app"}, {"producer_byte_rate": 5.0})[0] == E.none
        assert alter(client, {"ip": "10.0.0.1"}, {"connection_creation_rate": 3.0})[0] == E.none
        assert alter(client, {"user": "bob"}, {"producer_byte_rate": 9.0},
                     validate_only=True)[0] == E.none

        alice, default = (("user", "alice"),), (("user", None),)
        both = (("client-id", "app"), ("user", "alice"))
        assert describe(client, ("user", EXACT, "alice"), strict=True) == {
            alice: {"producer_byte_rate": 1024.0}}
        assert describe(client, ("user", EXACT, "alice")) == {
            alice: {"producer_byte_rate": 1024.0}, both: {"request_percentage": 12.5}}
        assert describe(client, ("user", DEFAULT, None)) == {default: {"consumer_byte_rate": 2048.0}}
        assert set(describe(client, ("user", ANY, None), strict=True)) == {alice, default}
        assert set(describe(client, ("user", ANY, None), ("client-id", ANY, None))) == {both}
        assert describe(client, ("user", EXACT, "bob")) == {}  # validate_only kept nothing
        assert len(describe(client)) == 5  # no component: everything

        # A removal; the entity with no value left disappears.
        assert alter(client, {"client-id": "app"}, {"producer_byte_rate": None})[0] == E.none
        assert describe(client, ("client-id", EXACT, "app"), strict=True) == {}
        expected = describe(client)
    broker.stop()
    with Broker(tmp_path / "data", **SMALL) as again, RawClient(again.bootstrap_servers) as client:
        assert describe(client) == expected


@pytest.mark.parametrize(("entity", "ops", "message"), [
    ({"group": "g"}, {"producer_byte_rate": 1.0}, "Unhandled client quota entity type: group"),
    ({}, {"producer_byte_rate": 1.0}, "Invalid empty client quota entity"),
    ({"user": ""}, {"producer_byte_rate": 1.0}, "Empty user not supported"),
    ({"ip": "10.0.0.1", "user": "a"}, {"connection_creation_rate": 1.0},
     "Invalid quota entity combination"),
    ({"ip": "not an ip"}, {"connection_creation_rate": 1.0}, "is not a valid IP"),
    ({"user": "a"}, {"connection_creation_rate": 1.0}, "Invalid configuration key"),
    ({"user": "a"}, {"bogus_rate": 1.0}, "Invalid configuration key bogus_rate"),
    ({"user": "a"}, {"producer_byte_rate": 0.0}, "must be greater than 0"),
    ({"user": "a"}, {"producer_byte_rate": 1.5}, "cannot be a fractional value"),
])
def test_alter_rejects_what_kafka_rejects(broker, entity, ops, message):
    with RawClient(broker.bootstrap_servers) as client:
        before = describe(client)
        code, text = alter(client, entity, ops)
        assert code == E.invalid_request and message in text
        assert describe(client) == before  # nothing of a failed entry applied


def test_one_bad_entry_fails_alone(broker):
    with RawClient(broker.bootstrap_servers) as client:
        answer = client.request(ALTER, 0, {"validate_only": False, "entries": [
            {"entity": [{"entity_type": "user", "entity_name": "ok-alone"}],
             "ops": [{"key": "producer_byte_rate", "value": 10.0, "remove": False}]},
            {"entity": [{"entity_type": "user", "entity_name": "bad-alone"}],
             "ops": [{"key": "nope", "value": 10.0, "remove": False}]}]})
        assert [e.error_code for e in answer.entries] == [E.none, E.invalid_request]
        assert set(describe(client, ("user", ANY, None))) == {(("user", "ok-alone"),)}


@pytest.mark.parametrize(("components", "code", "message"), [
    ([("group", EXACT, "g")], E.unsupported_version, "Unsupported entity type group"),
    ([("user", EXACT, None)], E.invalid_request, "MATCH_TYPE_EXACT"),
    ([("user", DEFAULT, "x")], E.invalid_request, "MATCH_TYPE_DEFAULT"),
    ([("user", ANY, "x")], E.invalid_request, "MATCH_TYPE_SPECIFIED"),
    ([("user", 7, None)], E.invalid_request, "Unknown match type 7"),
    ([("user", ANY, None), ("user", EXACT, "a")], E.invalid_request, "more than once"),
    ([("ip", ANY, None), ("user", ANY, None)], E.invalid_request, "IP filter component"),
])
def test_describe_rejects_bad_filters(broker, components, code, message):
    with RawClient(broker.bootstrap_servers) as client:
        got_code, text = describe(client, *components)
        assert got_code == code and message in text


def test_cli_alters_and_describes_like_kafka_configs(broker):
    from typer.testing import CliRunner

    from onceflow.cli.app import app

    runner = CliRunner()
    bootstrap = ["--bootstrap-servers", broker.bootstrap_servers]
    done = runner.invoke(app, ["quotas", "alter", "--user", "cli-user", "--client-default",
                               "--add-config", "producer_byte_rate=1048576,request_percentage=50",
                               *bootstrap])
    assert done.exit_code == 0, done.output
    shown = runner.invoke(app, ["quotas", "describe", "--user", "cli-user", *bootstrap],
                          terminal_width=200)
    assert shown.exit_code == 0, shown.output
    assert "user=cli-user" in shown.output and "client-id=<default>" in shown.output
    assert "1048576" in shown.output and "request_percentage" in shown.output
    with RawClient(broker.bootstrap_servers) as client:
        assert describe(client, ("user", EXACT, "cli-user"), ("client-id", DEFAULT, None)) == {
            (("client-id", None), ("user", "cli-user")): {"producer_byte_rate": 1048576.0,
                                                          "request_percentage": 50.0}}
    bad = runner.invoke(app, ["quotas", "alter", "--user", "cli-user", "--add-config",
                              "bogus=1", *bootstrap])
    assert bad.exit_code == 1 and "Invalid configuration key bogus" in bad.output


def test_java_admin_client_alters_and_describes(broker):
    from tests.java_support import run_java

    user = "java-user"
    [result] = run_java("ClientQuotas", broker.bootstrap_servers, user)
    assert result["user"] == {f"user={user}": {"producer_byte_rate": 1048576.0}}
    assert result["clients"]["client-id=<default>"] == {"consumer_byte_rate": 2048.0}
    assert "cli-user" not in str(result["user"])
    assert result["bad_key_error"].startswith("InvalidRequestException: Invalid configuration key")


def test_quota_apis_need_cluster_describe_and_alter_configs(onceflow_secure_broker):
    """A user without Cluster DescribeConfigs/AlterConfigs is refused; a super user is not."""
    from onceflow.client.wire import Connection
    from onceflow.protocol.apis import ApiKey

    secure = onceflow_secure_broker
    host, port = secure.bootstrap_servers.split(",")[0].rsplit(":", 1)
    alteration = {"validate_only": False, "entries": [
        {"entity": [{"entity_type": "user", "entity_name": "x"}],
         "ops": [{"key": "producer_byte_rate", "value": 10.0, "remove": False}]}]}
    answers = {}
    for principal in ("app", "admin"):
        properties = {k: v for k, v in secure.client_config(principal).items()
                      if k != "bootstrap.servers"}
        with Connection(host, int(port), properties=properties) as connection:
            altered = connection.call(ApiKey.ALTER_CLIENT_QUOTAS, (0, 1), **alteration)
            described = connection.call(ApiKey.DESCRIBE_CLIENT_QUOTAS, (0, 1),
                                        components=[], strict=False)
            answers[principal] = (altered.entries[0].error_code, described.error_code)
    assert answers == {"app": (E.cluster_authorization_failed, E.cluster_authorization_failed),
                       "admin": (E.none, E.none)}
