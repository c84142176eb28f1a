"""onceflow.spark.session: the data sources' shared environment map is complete before any
query starts, so Spark's streaming source runners never change its structure (a concurrent
change there breaks the serialization of every task; see RUNNER_ENV_KEYS)."""

from __future__ import annotations

from pathlib import Path

from onceflow.spark.session import RUNNER_ENV_KEYS, data_source_env, register
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
