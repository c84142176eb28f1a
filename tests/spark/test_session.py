"""onceflow.spark.session: the data sources' shared environment map is complete before any
query starts, so Spark's streaming source runners never change its structure (a concurrent
change there breaks the serialization of every task; see RUNNER_ENV_KEYS); executors
whose Python lacks onceflow or its dependencies are named before any query runs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from onceflow.spark.session import (
    RUNNER_ENV_KEYS,
    ExecutorEnvironmentError,
    check_executors,
    data_source_env,
    register,
)
from tests.spark.support import create_topic, produce, unique


def env_keys(spark, name: str) -> set[str]:
    return {str(key) for key in data_source_env(spark, name).keySet()}


def test_streaming_queries_leave_the_shared_environment_map_unchanged(
        spark, bootstrap: str, tmp_path: Path) -> None:
    register(spark)  # a new registration: a new map, which no query has used yet
    before = env_keys(spark, "onceflow-kafka")
    assert set(RUNNER_ENV_KEYS) <= before

    topic = create_topic(bootstrap, unique("session-env"), partitions=2)
    produce(bootstrap, topic, [(b"k", b"v")] * 20)
    queries = [(spark.readStream.format("onceflow-kafka")
                .option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
                .option("startingOffsets", "earliest").load()
                .writeStream.format("noop").option("checkpointLocation", str(tmp_path / str(i)))
                .trigger(availableNow=True).start()) for i in range(2)]
    for query in queries:
        assert query.awaitTermination(120) and query.exception() is None

    # The runners put the same keys again: values replaced, no entry added.
    assert env_keys(spark, "onceflow-kafka") == before


def test_executor_probe_names_what_an_executor_lacks(spark) -> None:
    check_executors(spark)   # the executors run this Python: nothing missing
    with pytest.raises(ExecutorEnvironmentError, match=r"lacks no_such_module_0b1f.*Install onceflow\[spark\]"):
        check_executors(spark, ("onceflow", "no_such_module_0b1f", "pyarrow"))


OTHER_PYTHON = shutil.which("python3", path="/usr/bin")


@pytest.mark.skipif(OTHER_PYTHON is None or os.path.realpath(OTHER_PYTHON) == os.path.realpath(sys.executable),
                    reason="needs the system's python3 apart from the project's virtual environment")
def test_session_refuses_executors_without_onceflow(tmp_path: Path) -> None:
    """PYSPARK_PYTHON pointing at a Python without onceflow (a worker set up without
    onceflow[spark]): session() fails on the driver with the executor's Python named."""
    env = {**os.environ, "PYSPARK_PYTHON": str(OTHER_PYTHON)}
    script = "from onceflow.spark import session; session('local[1]')"
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                          timeout=300, cwd=tmp_path, check=False)
    assert done.returncode != 0
    assert "ExecutorEnvironmentError" in done.stderr, done.stderr[-2000:]
    assert f"{OTHER_PYTHON} (Python 3." in done.stderr and "pyarrow" in done.stderr.split(" lacks ")[-1]
