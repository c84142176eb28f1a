"""Fixtures of the console tests: one broker, one console and one Chromium per session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from onceflow.console.settings import ConsoleSettings
from tests.console.support import RunningConsole, chromium

# Few internal partitions (each is a directory of files) and a short initial rebalance.
BROKER_SETTINGS = {"offsets_topic_num_partitions": 4, "transaction_state_num_partitions": 4,
                   "group_initial_rebalance_delay_ms": 200, "group_min_session_timeout_ms": 1000}


@pytest.fixture(scope="session")
def console_broker() -> Iterator:
    from onceflow.broker.embedded import Broker

    with Broker(**BROKER_SETTINGS) as broker:
        yield broker


@pytest.fixture(scope="session")
def console(console_broker) -> Iterator[RunningConsole]:
    running = RunningConsole(ConsoleSettings(console_broker.bootstrap_servers))
    yield running
    running.stop()


@pytest.fixture(scope="session")
def browser() -> Iterator:
    with chromium() as driver:
        yield driver
