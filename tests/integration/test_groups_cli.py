"""`onceflow groups list|describe|reset-offsets` against a broker with a live consumer group."""

from __future__ import annotations

import time

from confluent_kafka import Consumer, TopicPartition
from typer.testing import CliRunner

from onceflow.cli.app import app
from tests.cli.helpers import table_rows
from tests.helpers import TIMEOUT_S, create_topic, unique
from tests.integration.groups_support import Records, groups_broker  # noqa: F401, F811

WIDE = {"COLUMNS": "300"}  # member ids are long: keep every table row on one line


def _onceflow(*args: str):
    return CliRunner().invoke(app, list(args), env=WIDE)


def _consume_and_commit(consumer: Consumer, topic: str, count: int,
                        commit: dict[int, int]) -> None:
    seen = 0
    deadline = time.monotonic() + TIMEOUT_S
    while seen < count and time.monotonic() < deadline:
        seen += len([m for m in consumer.consume(100, timeout=0.2) if not m.error()])
    assert seen == count
    consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in commit.items()],
                    asynchronous=False)


def test_list_and_describe_show_members_offsets_and_lag(groups_broker):
    bootstrap = groups_broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("cli-groups"), 2)
    group = unique("cli-group")
    Records(bootstrap, topic, 2).produce(10)  # 5 records per partition
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "client.id": "cli-test-consumer", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    try:
        _consume_and_commit(consumer, topic, 10, {0: 5, 1: 2})  # partition 1 lags by 3

        listed = _onceflow("groups", "list", "-b", bootstrap)
        assert listed.exit_code == 0, listed.output
        assert [group, "classic", "stable", "no"] in table_rows(listed.stdout)

        described = _onceflow("groups", "describe", group, "-b", bootstrap)
        assert described.exit_code == 0, described.output
        rows = table_rows(described.stdout)
        members = [row for row in rows if len(row) == 5]
        assert len(members) == 1
        assert members[0][2:] == ["cli-test-consumer", "/127.0.0.1", f"{topic}:0,1"]
        offsets = [row for row in rows if len(row) == 7]
        assert offsets == [[topic, "0", "5", "5", "5", "0", "cli-test-consumer"],
                           [topic, "1", "2", "5", "5", "3", "cli-test-consumer"]]
        assert "total lag 3" in described.stdout
    finally:
        consumer.close()

    unknown = _onceflow("groups", "describe", unique("nobody"), "-b", bootstrap)
    assert unknown.exit_code == 1
    assert "unknown group" in unknown.stderr


def test_reset_offsets_dry_run_then_execute(groups_broker):
    bootstrap = groups_broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("cli-reset"), 2)
    group = unique("cli-reset-group")
    Records(bootstrap, topic, 2).produce(10)  # 5 records per partition
    committer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    committer.commit(offsets=[TopicPartition(topic, 0, 4), TopicPartition(topic, 1, 5)],
                     asynchronous=False)
    committer.close()

    plan = _onceflow("groups", "reset-offsets", group, "-b", bootstrap, "--shift-by", "-3")
    assert plan.exit_code == 0, plan.output
    assert [r for r in table_rows(plan.stdout) if len(r) == 4] == [[topic, "0", "4", "1"],
                                                                  [topic, "1", "5", "2"]]
    assert "add --execute" in plan.stdout
    unchanged = _onceflow("groups", "describe", group, "-b", bootstrap)
    assert "total lag 1" in unchanged.stdout

    done = _onceflow("groups", "reset-offsets", group, "-b", bootstrap, "--to-offset", "99",
                     "--topic", topic, "--execute")
    assert done.exit_code == 0, done.output
    assert [r[3] for r in table_rows(done.stdout) if len(r) == 4] == ["5", "5"]  # clamped
    assert "total lag 0" in _onceflow("groups", "describe", group, "-b", bootstrap).stdout

    both = _onceflow("groups", "reset-offsets", group, "-b", bootstrap, "--to-earliest",
                     "--to-latest")
    assert both.exit_code == 1 and "exactly one of" in both.stderr
