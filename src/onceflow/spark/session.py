"""A SparkSession set up for onceflow: the executors' Python is ours, the data sources are
registered, and the settings suit one machine unless a master URL says otherwise."""

from __future__ import annotations

import os
import re
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"

# Spark's local mode gives a task exactly one attempt unless the master says otherwise
# (`local[N,F]`); a cluster retries 4 times. We want the cluster's behaviour locally too:
# a transient task failure (seen here: a rare java.io.OptionalDataException while two
# queries' tasks are deserialised at once) is retried, and a retried attempt of an
# exactly-once sink is exactly what the transactional ids fence.
LOCAL_TASK_ATTEMPTS = 4
_LOCAL_WITHOUT_ATTEMPTS = re.compile(r"^local\[(\d+|\*)\]$")

# A laptop or CI runner has few cores: Spark's default of 200 shuffle partitions turns
# every aggregation into 200 tiny tasks.
LOCAL_SHUFFLE_PARTITIONS = 4


def register(spark: SparkSession) -> SparkSession:
    """Register onceflow's data sources (`onceflow-kafka`, `onceflow-db`) with `spark`."""
    from onceflow.spark.datasources import DatabaseDataSource, KafkaDataSource

    spark.dataSource.register(KafkaDataSource)
    spark.dataSource.register(DatabaseDataSource)
    return spark


def with_task_retries(master: str) -> str:
    """`local[N]` -> `local[N,4]`: local mode with the task retries a cluster has."""
    match = _LOCAL_WITHOUT_ATTEMPTS.match(master)
    return f"local[{match.group(1)},{LOCAL_TASK_ATTEMPTS}]" if match else master


def session(master: str | None = None, app_name: str = "onceflow",
            conf: dict[str, str] | None = None) -> SparkSession:
    """Get or create a SparkSession with onceflow's data sources registered.

    `master` defaults to `local[*]`. The executors run this interpreter (PYSPARK_PYTHON),
    so they see the same onceflow, confluent-kafka and pyarrow as the driver; set
    PYSPARK_PYTHON yourself for a cluster whose workers have their own Python.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    master = with_task_retries(master or DEFAULT_MASTER)
    builder = SparkSession.builder.master(master).appName(app_name)
    settings = {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false"}
    if master.startswith("local"):
        settings["spark.sql.shuffle.partitions"] = str(LOCAL_SHUFFLE_PARTITIONS)
    settings.update(conf or {})
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return register(spark)
