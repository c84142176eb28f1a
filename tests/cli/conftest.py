"""Fixtures for the `onceflow` command tests: run a command in-process, fresh topics."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic
from typer.testing import CliRunner, Result

from onceflow.cli.app import app
from tests.cli.helpers import new_topic_name

ADMIN_TIMEOUT_S = 30.0

Invoke = Callable[..., Result]


@pytest.fixture
def bootstrap(onceflow_broker) -> str:
    return onceflow_broker.bootstrap_servers


@pytest.fixture
def onceflow() -> Invoke:
    """`onceflow("topics", "list", input=...)`: the command run in-process, its Result."""
    runner = CliRunner()

    def invoke(*args: str, input: str | None = None, env: dict[str, str] | None = None) -> Result:
        return runner.invoke(app, list(args), input=input, env=env)

    return invoke


@pytest.fixture
def make_topic(bootstrap: str) -> Iterator[Callable[..., str]]:
    """Creates topics through AdminClient (not the CLI under test); deletes them after."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    created: list[str] = []

    def make(partitions: int = 1) -> str:
        name = new_topic_name()
        admin.create_topics([NewTopic(name, partitions, 1)])[name].result(ADMIN_TIMEOUT_S)
        created.append(name)
        return name

    yield make
    for future in admin.delete_topics(created).values() if created else ():
        try:
            future.result(ADMIN_TIMEOUT_S)
        except KafkaException:  # the test deleted it through the CLI already
            pass
