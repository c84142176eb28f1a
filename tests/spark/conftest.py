"""Fixtures of the Spark tests: one local[2] SparkSession and one onceflow broker per session.

The broker runs in this process on a real socket; Spark's Python workers are separate
processes that reach it over loopback like any client.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

# No importorskip: `make test` installs the spark extra, and a missing pyspark must fail
# the run rather than quietly skip the pipeline tests.


@pytest.fixture(scope="session")
def spark() -> Iterator:
    from onceflow.spark import session

    spark = session("local[2]", app_name="onceflow-tests")
    yield spark
    spark.stop()


@pytest.fixture(scope="session")
def bootstrap(onceflow_broker) -> str:
    return onceflow_broker.bootstrap_servers
