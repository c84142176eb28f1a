"""A SparkSession set up for onceflow: the executors' Python is ours, the data sources are
registered, and the settings suit one machine unless a master URL says otherwise."""

from __future__ import annotations

import os
import re
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"

# Spark's local mode gives a task exactly one attempt unless the master says otherwise
# (`local[N,F]`); a cluster retries 4 times. We want the cluster's behaviour locally too:
# a transient task failure is retried, and a retried attempt of an exactly-once sink is
# exactly what the transactional ids fence.
LOCAL_TASK_ATTEMPTS = 4

# Spark 4.3's Python streaming source runner (PythonStreamingSourceRunner.init) puts these
# four entries into the environment map of the data source's Python function, in place.
# That java.util.HashMap is shared by every Python function made from the data source,
# the readers inside the tasks included. Queries that start together put them from
# several threads at once, which can leave the map inconsistent (its size no longer
# matching its entries). From then on, every task carrying it fails to deserialize with
# java.io.OptionalDataException: every attempt, every query, until the driver restarts.
# `register` adds the entries once, before any query runs, so the runners' later puts
# only replace values, which is safe. The values are the ones the runner would put.
# Every consumer of the map sets its own values anyway.
RUNNER_ENV_KEYS = ("SPARK_LOCAL_DIRS", "SPARK_AUTH_SOCKET_TIMEOUT", "SPARK_BUFFER_SIZE",
                   "SPARK_PYTHON_RUNTIME")
_LOCAL_WITHOUT_ATTEMPTS = re.compile(r"^local\[(\d+|\*)\]$")

# A laptop or CI runner has few cores: Spark's default of 200 shuffle partitions turns
# every aggregation into 200 tiny tasks.
LOCAL_SHUFFLE_PARTITIONS = 4


def register(spark: SparkSession) -> SparkSession:
    """Register onceflow's data sources (`onceflow-kafka`, `onceflow-db`) with `spark`."""
    from onceflow.spark.datasources import DatabaseDataSource, KafkaDataSource

    for source in (KafkaDataSource, DatabaseDataSource):
        spark.dataSource.register(source)
        _add_runner_env(spark, source.name())
    return spark


def runner_env(spark: SparkSession) -> dict[str, str]:
    """The entries Spark's Python streaming source runner puts into a data source's
    environment map (see RUNNER_ENV_KEYS). The local dirs are the configured ones; the
    runner puts its block manager's subdirectories of them (SparkEnv is not reachable from
    py4j here: its methods name protobuf classes missing from the driver's class path)."""
    jvm, conf = spark.sparkContext._jvm, spark.sparkContext.getConf()
    local_dirs = jvm.org.apache.spark.util.Utils.getConfiguredLocalDirs(spark.sparkContext._jsc.sc().conf())
    timeout = conf.get("spark.python.authenticate.socketTimeout", "15s")
    return {
        "SPARK_LOCAL_DIRS": ",".join(str(d) for d in local_dirs),
        "SPARK_AUTH_SOCKET_TIMEOUT": str(jvm.org.apache.spark.util.Utils.timeStringAsSeconds(timeout)),
        "SPARK_BUFFER_SIZE": conf.get("spark.buffer.size", "65536"),
        "SPARK_PYTHON_RUNTIME": "PYTHON_WORKER",
    }


def data_source_env(spark: SparkSession, name: str) -> Any:
    """The (Java) environment map shared by the Python functions of a registered data source."""
    manager = spark._jsparkSession.sessionState().dataSourceManager()
    return manager.lookupDataSource(name).dataSourceCls().envVars()


def _add_runner_env(spark: SparkSession, name: str) -> None:
    env = data_source_env(spark, name)
    for key, value in runner_env(spark).items():
        if not env.containsKey(key):
            env.put(key, value)


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
