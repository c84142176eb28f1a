"""`onceflow topics create|list|describe|delete` against a real broker."""

from __future__ import annotations

from confluent_kafka import Producer

from tests.cli.helpers import assert_one_line_error, new_topic_name, table_rows


def test_create_list_describe_delete(onceflow, bootstrap):
    name = new_topic_name()
    created = onceflow("topics", "create", name, "--partitions", "3", "--replication-factor", "1",
                       "--config", "retention.ms=3600000", "--config", "cleanup.policy=delete",
                       "--bootstrap-servers", bootstrap)
    assert created.exit_code == 0, created.output
    assert f"created topic {name} (3 partitions" in created.stdout

    listed = onceflow("topics", "list", "-b", bootstrap)
    assert listed.exit_code == 0, listed.output
    assert [name, "3", "1"] in table_rows(listed.stdout)

    described = onceflow("topics", "describe", name, "-b", bootstrap)
    assert described.exit_code == 0, described.output
    rows = table_rows(described.stdout)
    partitions = [row for row in rows if len(row) == 6]
    assert [row[0] for row in partitions] == ["0", "1", "2"]
    assert all(row[4:] == ["0", "0"] for row in partitions)  # empty: log start = end = 0
    configs = {row[0]: row[1] for row in rows if len(row) == 3}
    assert configs["retention.ms"] == "3600000"

    deleted = onceflow("topics", "delete", name, "-b", bootstrap)
    assert deleted.exit_code == 0, deleted.output
    assert name not in onceflow("topics", "list", "-b", bootstrap).stdout


def test_describe_shows_log_end_offsets(onceflow, bootstrap, make_topic):
    name = make_topic(partitions=2)
    producer = Producer({"bootstrap.servers": bootstrap})
    for index in range(7):
        producer.produce(name, value=b"v%d" % index, partition=index % 2)
    assert producer.flush(30) == 0
    described = onceflow("topics", "describe", name, "-b", bootstrap)
    assert described.exit_code == 0, described.output
    ends = {row[0]: row[5] for row in table_rows(described.stdout) if len(row) == 6}
    assert ends == {"0": "4", "1": "3"}


def test_create_existing_topic_is_one_line_error(onceflow, bootstrap, make_topic):
    name = make_topic()
    result = onceflow("topics", "create", name, "-b", bootstrap)
    assert_one_line_error(result, f"topic '{name}' already exists")


def test_create_rejects_replication_factor_above_node_count(onceflow, bootstrap):
    result = onceflow("topics", "create", new_topic_name(), "-r", "3", "-b", bootstrap)
    assert_one_line_error(result, "INVALID_REPLICATION_FACTOR")


def test_create_rejects_malformed_config(onceflow, bootstrap):
    result = onceflow("topics", "create", new_topic_name(), "--config", "retention.ms", "-b",
                      bootstrap)
    assert_one_line_error(result, "--config expects name=value")


def test_create_rejects_invalid_config_value(onceflow, bootstrap):
    result = onceflow("topics", "create", new_topic_name(), "--config", "retention.ms=soon",
                      "-b", bootstrap)
    assert_one_line_error(result, "INVALID_CONFIG")


def test_unknown_topic_is_one_line_error(onceflow, bootstrap):
    missing = new_topic_name("missing")
    for command in ("describe", "delete"):
        result = onceflow("topics", command, missing, "-b", bootstrap)
        assert_one_line_error(result, f"unknown topic '{missing}'")
