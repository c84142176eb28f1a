"""Fixtures of the processor tests: the Kafka cluster they run against.

`kafka_bootstrap` is the one switch. By default it is an onceflow broker in this
process, on a real socket, with group timings shortened so rebalances take well under
a second. Set ONCEFLOW_PROCESSOR_BROKER to run the same tests elsewhere:

    ONCEFLOW_PROCESSOR_BROKER=mock       librdkafka's built-in mock cluster (three brokers
                                         on real sockets; no real transactional offsets)
    ONCEFLOW_PROCESSOR_BROKER=external   any cluster, at ONCEFLOW_PROCESSOR_BOOTSTRAP
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import processor_support as support
import pytest
from confluent_kafka import Producer

BROKER_ENV = "ONCEFLOW_PROCESSOR_BROKER"
BOOTSTRAP_ENV = "ONCEFLOW_PROCESSOR_BOOTSTRAP"
MOCK_BROKERS = 3


# Group timings for the onceflow broker under test: Kafka's defaults (3 s initial
# rebalance delay, 6 s minimum session) only make the tests slower here.
ONCEFLOW_GROUP_SETTINGS = {"group_initial_rebalance_delay_ms": 100, "group_min_session_timeout_ms": 1000,
                           "consumer_group_heartbeat_interval_ms": 500,
                           "consumer_group_session_timeout_ms": 6000}


def broker_kind() -> str:
    return os.environ.get(BROKER_ENV, "onceflow")


@pytest.fixture(scope="session")
def kafka_bootstrap(request: pytest.FixtureRequest) -> Iterator[str]:
    kind = broker_kind()
    if kind == "onceflow":
        from onceflow import Broker

        with Broker(**ONCEFLOW_GROUP_SETTINGS) as broker:
            yield broker.bootstrap_servers
    elif kind == "external":
        yield os.environ[BOOTSTRAP_ENV]
    elif kind == "mock":
        owner = Producer({"test.mock.num.brokers": MOCK_BROKERS, "log_level": 4})
        brokers = owner.list_topics(timeout=10).brokers.values()
        yield ",".join(f"{broker.host}:{broker.port}" for broker in brokers)
        owner.flush(5)
    else:
        raise pytest.UsageError(f"{BROKER_ENV} must be mock, onceflow or external, not {kind!r}")


@pytest.fixture(scope="session")
def on_mock() -> bool:
    return broker_kind() == "mock"


@pytest.fixture
def make_topic(kafka_bootstrap: str) -> Callable[..., str]:
    """Create a fresh topic with 4 partitions (the mock's fixed auto-create count)."""

    def make(prefix: str) -> str:
        name = support.unique(prefix)
        support.create_topic(kafka_bootstrap, name, mock=broker_kind() == "mock")
        return name

    return make


@pytest.fixture(scope="session")
def group_config(on_mock: bool) -> dict[str, object]:
    """Consumer settings for the processors under test. The mock cluster holds a
    rebalance for (session timeout - 1 s) whenever the member count changed, so a short
    session keeps rebalances to seconds; Kafka refuses sessions under 6 s by default."""
    session_timeout_ms = support.env_session_timeout_ms(on_mock)
    return {"session.timeout.ms": session_timeout_ms, "heartbeat.interval.ms": 500}
