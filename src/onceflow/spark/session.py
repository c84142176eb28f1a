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
# every aggregation into 200 tiny tasks. On a cluster the default becomes the cluster's
# cores (Spark's defaultParallelism once the executors have registered), unless the
# caller sets spark.sql.shuffle.partitions: a streaming aggregation keeps the number of
# its first run in its checkpoint, and 200 state partitions made a small windowed job 6
# times slower than 4 on a 2-worker cluster.
LOCAL_SHUFFLE_PARTITIONS = 4
SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"

# What an executor's Python must import for onceflow's data sources; without them a task
# dies in its Python worker and the cause is only on that executor's stderr.
EXECUTOR_MODULES = ("onceflow", "confluent_kafka", "pyarrow")
# The probe runs on the executors, where onceflow may be missing: it is compiled into a
# module name that is not importable, so cloudpickle ships it by value, and it imports
# nothing but the standard library.
_PROBE_SOURCE = """
def probe(_rows, modules={modules!r}):
    import importlib.util
    import socket
    import sys
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    yield socket.gethostname(), sys.executable, sys.version.split()[0], tuple(missing)
"""


# Where Spark unpacks an environment archive (spark.archives `PATH#environment`) in each
# executor's working directory, and the executors' Python inside it. The driver keeps its
# own interpreter: the relative path means nothing in the driver's directory.
ARCHIVE_ALIAS = "environment"
ARCHIVE_PYTHON = f"./{ARCHIVE_ALIAS}/bin/python"


def archive_setting(archive: str) -> str:
    """spark.archives for an environment archive: `PATH#environment`; a local path is made
    absolute, a URI (hdfs://..., s3a://...) is kept as it is."""
    location = archive if "://" in archive else os.path.abspath(archive)
    return f"{location}#{ARCHIVE_ALIAS}"


def link_driver_environment(directory: str = ".") -> None:
    """Make `./environment/bin/python` this interpreter in the driver's working directory.

    Spark runs the Python of a Python data source's planning (schema, partitions, stream
    offsets) in a Python worker that the driver's JVM starts with the same interpreter
    path as the executors' (the data source's pythonExec, from PYSPARK_PYTHON), relative to
    the JVM's working directory, which is this process's. spark.pyspark.driver.python does
    not change that path. So the driver gets an `environment` link to its own virtual
    environment, unless the directory already has an `environment` (left as it is)."""
    link = os.path.join(directory, ARCHIVE_ALIAS)
    if os.path.lexists(link):
        return
    if not os.path.exists(os.path.join(sys.prefix, "bin", "python")):
        raise RuntimeError(
            f"session(archive=...) needs the driver in a virtual environment with bin/python; "
            f"{sys.executable} is not (its prefix {sys.prefix} has no bin/python)")
    os.symlink(sys.prefix, link)


class ExecutorEnvironmentError(RuntimeError):
    """An executor's Python lacks what onceflow's data sources need."""


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


def check_executors(spark: SparkSession, modules: tuple[str, ...] = EXECUTOR_MODULES) -> None:
    """Run a probe task on every executor core; ExecutorEnvironmentError naming each
    host and Python that lacks one of `modules`."""
    namespace: dict[str, Any] = {"__name__": "__onceflow_executor_probe__"}
    exec(_PROBE_SOURCE.format(modules=tuple(modules)), namespace)  # noqa: S102 - our own code
    context = spark.sparkContext
    slots = max(context.defaultParallelism, 1)
    found = set(context.parallelize(range(slots), slots).mapPartitions(namespace["probe"]).collect())
    lacking = sorted(entry for entry in found if entry[3])
    if lacking:
        detail = "; ".join(f"{host}: {python} (Python {version}) lacks {', '.join(missing)}"
                           for host, python, version, missing in lacking)
        raise ExecutorEnvironmentError(
            f"the executors' Python cannot run onceflow's data sources: {detail}. Install "
            "onceflow[spark] into that Python on every worker, or point PYSPARK_PYTHON at a "
            "Python that has it (docs/pipelines.md, 'Running on a cluster')")


def _needs_probe(master: str) -> bool:
    """Executors may run another Python than this one: a cluster, or PYSPARK_PYTHON set."""
    return not master.startswith("local") or os.path.realpath(
        os.environ.get("PYSPARK_PYTHON", sys.executable)) != os.path.realpath(sys.executable)


def session(master: str | None = None, app_name: str = "onceflow",
            conf: dict[str, str] | None = None, check: bool | None = None,
            archive: str | None = None) -> SparkSession:
    """Get or create a SparkSession with onceflow's data sources registered.

    `master` defaults to `local[*]`. The executors run this interpreter (PYSPARK_PYTHON),
    so they see the same onceflow, confluent-kafka and pyarrow as the driver; set
    PYSPARK_PYTHON yourself for a cluster whose workers have their own Python. `check`
    (default: when the executors may run another Python - a cluster master or
    PYSPARK_PYTHON set) first runs a probe task on the executors and raises
    ExecutorEnvironmentError when one lacks onceflow or its dependencies. On a cluster,
    spark.sql.shuffle.partitions defaults to the cluster's cores.

    `archive` (a packed environment, `onceflow spark pack`; a local path or a URI) is
    shipped to the executors as spark.archives `ARCHIVE#environment`, and they run
    `./environment/bin/python` from it (PYSPARK_PYTHON, set for this process), while the
    driver keeps this interpreter (PYSPARK_DRIVER_PYTHON, spark.pyspark.driver.python)
    and gets a link `./environment` to its own virtual environment in the working directory
    for Spark's driver-side Python workers (link_driver_environment).
    """
    if archive is not None:
        link_driver_environment()
        os.environ["PYSPARK_PYTHON"] = ARCHIVE_PYTHON
        os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    master = with_task_retries(master or DEFAULT_MASTER)
    builder = SparkSession.builder.master(master).appName(app_name)
    settings = {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false"}
    if archive is not None:
        settings.update({"spark.archives": archive_setting(archive),
                         "spark.pyspark.python": ARCHIVE_PYTHON,
                         "spark.pyspark.driver.python": sys.executable})
    if master.startswith("local"):
        settings["spark.sql.shuffle.partitions"] = str(LOCAL_SHUFFLE_PARTITIONS)
    settings.update(conf or {})
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    if _needs_probe(master) if check is None else check:
        check_executors(spark)   # also waits for executors to register their cores
    if not master.startswith("local") and SHUFFLE_PARTITIONS not in settings:
        spark.conf.set(SHUFFLE_PARTITIONS, str(max(spark.sparkContext.defaultParallelism, 1)))
    return spark
