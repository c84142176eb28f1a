"""Pipelines: one source, one deterministic transformation, one or more exactly-once sinks.

Theory of operation. A `Pipeline` is a declaration; nothing touches Spark until `run`:

* Each sink becomes **one streaming query** with its own checkpoint `<checkpoint>/<sink
  name>`. Spark's exactly-once bookkeeping (offsets/N before a batch, commits/N after it;
  see checkpoint.py) is per query, and each sink's own marker (progress record, database
  row) is keyed by the query id, so two sinks never share a checkpoint. The price: each
  query reads the source itself, once per sink.
* The query is `source -> transform -> sink.transform -> sink`. A replayed batch re-reads
  the same offsets, so the transformations must be deterministic (no `rand()`, no
  `current_timestamp()`): the sinks skip the parts of a replayed batch they committed and
  write the rest, which is only "exactly once" if the rest is what the first attempt
  would have written.
* `run(spark, until)` starts the queries, then polls them every POLL_S: their progress
  feeds a monitor display (monitor.py), a failed query stops the others and raises
  `PipelineError`, and the stop condition is checked - forever (until SIGINT/SIGTERM,
  which stop the queries cleanly), `available_now` (Spark processes the backlog present
  at start and stops), or idle for N seconds. Stopping a query mid-batch is safe: the
  batch is replayed on the next start, like after a crash.

Bootstrap servers: the `bootstrap_servers` argument of `run` (the CLI flag), else the
pipeline's, else $ONCEFLOW_BOOTSTRAP_SERVERS (or $ONCEFLOW_BOOTSTRAP, the other commands'
variable). A Kafka sink may name its own cluster.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import re
import runpy
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from onceflow.spark import DATABASE_FORMAT, KAFKA_FORMAT
from onceflow.spark import checkpoint as spark_checkpoint
from onceflow.spark.monitor import Display, LogDisplay, ProgressTracker, QueryStats

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

Transform = Callable[["DataFrame"], "DataFrame"]

log = logging.getLogger(__name__)

BOOTSTRAP_ENVS = ("ONCEFLOW_BOOTSTRAP_SERVERS", "ONCEFLOW_BOOTSTRAP")
# How often the runner looks at its queries: often enough that every batch of a
# sub-second trigger is seen (missed ones are recovered from recentProgress), rarely
# enough that the py4j calls cost nothing next to a batch.
POLL_S = 0.25
# Names become directory names and Spark query names.
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
OUTPUT_MODES = ("append", "complete", "update")
# Spark 4.3 refuses update mode for Python data source sinks ("does not support Update
# mode"); complete mode works (every batch rewrites the whole result: upsert it).
PYTHON_SINK_OUTPUT_MODES = ("append", "complete")
DATABASE_MODES = ("append", "upsert")
DATABASE_SCHEMES = ("sqlite", "postgresql", "postgres")
# Lines of a failed query's error kept in PipelineError: the Python traceback of a
# failing transform or sink is long, its head says what and where.
ERROR_LINES_MAX = 30


class PipelineError(Exception):
    """A pipeline that cannot run as declared, or one whose query failed."""


def _check_name(kind: str, name: object) -> None:
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise PipelineError(f"{kind} name {name!r} must be 1-100 letters, digits, '_', '.' "
                            "or '-', starting with a letter or digit")


def _check_transform(owner: str, transform: object) -> None:
    if transform is not None and not callable(transform):
        raise PipelineError(f"{owner} transform must be a function DataFrame -> DataFrame, "
                            f"got {type(transform).__name__}")


def _check_options(owner: str, options: object) -> None:
    if not isinstance(options, Mapping):
        raise PipelineError(f"{owner} options must be a mapping of option name to value")


# ---------------------------------------------------------------------------- sources


@dataclasses.dataclass(frozen=True)
class KafkaSource:
    """Topics read by the `onceflow-kafka` source (read_committed by default).

    `starting_offsets`: "earliest" (default here: a new pipeline sees what is already in
    its topics), "latest", or Spark's JSON {"topic": {"0": offset}}; it only matters on
    the first start - afterwards the checkpoint says where to go on.
    """

    topics: Sequence[str]
    starting_offsets: str = "earliest"
    max_records_per_trigger: int | None = None
    isolation_level: str = "read_committed"
    include_headers: bool = False
    options: Mapping[str, str] = dataclasses.field(default_factory=dict)
    needs_bootstrap: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if isinstance(self.topics, str):
            object.__setattr__(self, "topics", (self.topics,))
        if not self.topics or not all(isinstance(t, str) and t for t in self.topics):
            raise PipelineError("KafkaSource needs topics: a list of topic names")
        object.__setattr__(self, "topics", tuple(self.topics))
        limit = self.max_records_per_trigger
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit <= 0):
            raise PipelineError(f"max_records_per_trigger must be a positive integer, got {limit!r}")
        if self.isolation_level not in ("read_committed", "read_uncommitted"):
            raise PipelineError("isolation_level must be read_committed or read_uncommitted, "
                                f"got {self.isolation_level!r}")
        start = self.starting_offsets
        if not isinstance(start, str) or (start not in ("earliest", "latest") and not start.startswith("{")):
            raise PipelineError("starting_offsets must be earliest, latest or a JSON map, "
                                f"got {self.starting_offsets!r}")
        _check_options("KafkaSource", self.options)

    def describe(self) -> str:
        return f"Kafka topics {', '.join(self.topics)}"

    def load(self, spark: SparkSession, bootstrap_servers: str | None) -> DataFrame:
        options = {
            "kafka.bootstrap.servers": str(bootstrap_servers),
            "subscribe": ",".join(self.topics),
            "startingOffsets": self.starting_offsets,
            "kafka.isolation.level": self.isolation_level,
            "includeHeaders": str(self.include_headers).lower(),
        }
        if self.max_records_per_trigger is not None:
            options["maxOffsetsPerTrigger"] = str(self.max_records_per_trigger)
        options.update({str(k): str(v) for k, v in self.options.items()})
        return spark.readStream.format(KAFKA_FORMAT).options(**options).load()


@dataclasses.dataclass(frozen=True)
class SparkSource:
    """Any streaming source Spark knows by format name (`rate`, files, ...): for trying a
    pipeline without Kafka. Its exactly-once replay is only as good as the source's."""

    format: str
    options: Mapping[str, str] = dataclasses.field(default_factory=dict)
    needs_bootstrap: ClassVar[bool] = False

    def __post_init__(self) -> None:
        if not isinstance(self.format, str) or not self.format:
            raise PipelineError("SparkSource needs a format name, e.g. 'rate'")
        _check_options("SparkSource", self.options)

    def describe(self) -> str:
        return f"Spark source {self.format}"

    def load(self, spark: SparkSession, bootstrap_servers: str | None) -> DataFrame:
        options = {str(k): str(v) for k, v in self.options.items()}
        return spark.readStream.format(self.format).options(**options).load()


Source = KafkaSource | SparkSource


# ------------------------------------------------------------------------------ sinks


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Sink:
    """What every sink declares: its name (query name and checkpoint subdirectory), an
    optional transformation of its own, and Spark's output mode."""

    name: str = ""
    transform: Transform | None = None
    output_mode: str = "append"
    options: Mapping[str, str] = dataclasses.field(default_factory=dict)
    allowed_output_modes: ClassVar[tuple[str, ...]] = PYTHON_SINK_OUTPUT_MODES

    def default_name(self) -> str:
        raise NotImplementedError

    def spark_format(self) -> str:
        raise NotImplementedError

    @property
    def needs_bootstrap(self) -> bool:
        return False

    def __post_init__(self) -> None:
        kind = type(self).__name__
        if not self.name:
            object.__setattr__(self, "name", self.default_name())
        _check_name(kind, self.name)
        _check_transform(f"{kind} {self.name}", self.transform)
        _check_options(f"{kind} {self.name}", self.options)
        if self.output_mode not in self.allowed_output_modes:
            hint = (" (Spark does not support update mode for Python data source sinks; "
                    "use complete mode and let the sink upsert)" if self.output_mode == "update" else "")
            raise PipelineError(f"{kind} {self.name}: output_mode must be one of "
                                f"{', '.join(self.allowed_output_modes)}, got {self.output_mode!r}{hint}")

    def writer_options(self, bootstrap_servers: str | None) -> dict[str, str]:
        return {str(k): str(v) for k, v in self.options.items()}


@dataclasses.dataclass(frozen=True, kw_only=True)
class KafkaSink(_Sink):
    """Rows (`value`, optional `key`, `topic`, `partition`, `headers`) written to `topic`
    by the exactly-once `onceflow-kafka` sink (docs/spark-sinks.md)."""

    topic: str
    exactly_once: bool = True
    progress_topic: str | None = None
    transactional_id_prefix: str | None = None
    bootstrap_servers: str | None = None  # another cluster than the pipeline's

    def default_name(self) -> str:
        return f"kafka-{self.topic}"

    def spark_format(self) -> str:
        return KAFKA_FORMAT

    @property
    def needs_bootstrap(self) -> bool:
        return self.bootstrap_servers is None

    def __post_init__(self) -> None:
        if not isinstance(self.topic, str) or not self.topic:
            raise PipelineError("KafkaSink needs a topic")
        super().__post_init__()

    def writer_options(self, bootstrap_servers: str | None) -> dict[str, str]:
        options = {"kafka.bootstrap.servers": str(self.bootstrap_servers or bootstrap_servers),
                   "topic": self.topic, "exactlyOnce": str(self.exactly_once).lower()}
        if self.progress_topic is not None:
            options["progressTopic"] = self.progress_topic
        if self.transactional_id_prefix is not None:
            options["transactionalIdPrefix"] = self.transactional_id_prefix
        return {**options, **super().writer_options(bootstrap_servers)}


@dataclasses.dataclass(frozen=True, kw_only=True)
class DatabaseSink(_Sink):
    """Rows written to `table` by the exactly-once `onceflow-db` sink: `url` is
    `sqlite:///path.db` or `postgresql://...`; `mode` append or upsert on `key_columns`."""

    url: str
    table: str
    mode: str = "append"
    key_columns: Sequence[str] = ()

    def default_name(self) -> str:
        return f"db-{self.table}"

    def spark_format(self) -> str:
        return DATABASE_FORMAT

    def __post_init__(self) -> None:
        scheme = self.url.partition(":")[0] if isinstance(self.url, str) else ""
        if scheme not in DATABASE_SCHEMES:
            raise PipelineError("DatabaseSink url must start with sqlite:/// or postgresql://, "
                                f"got {self.url!r}")
        if not isinstance(self.table, str) or not self.table:
            raise PipelineError("DatabaseSink needs a table")
        if self.mode not in DATABASE_MODES:
            raise PipelineError(f"DatabaseSink mode must be append or upsert, got {self.mode!r}")
        keys = (self.key_columns,) if isinstance(self.key_columns, str) else tuple(self.key_columns)
        object.__setattr__(self, "key_columns", keys)
        if (self.mode == "upsert") != bool(keys):
            raise PipelineError(f"DatabaseSink {self.table}: key_columns are needed by, and only "
                                "by, mode='upsert'")
        super().__post_init__()

    def writer_options(self, bootstrap_servers: str | None) -> dict[str, str]:
        options = {"url": self.url, "table": self.table, "mode": self.mode}
        if self.key_columns:
            options["keyColumns"] = ",".join(self.key_columns)
        return {**options, **super().writer_options(bootstrap_servers)}


@dataclasses.dataclass(frozen=True, kw_only=True)
class SparkSink(_Sink):
    """Any sink Spark knows by format name: `memory` (a table named after the sink),
    `console`, `noop`... For trying and testing pipelines; not exactly-once."""

    format: str
    allowed_output_modes: ClassVar[tuple[str, ...]] = OUTPUT_MODES

    def default_name(self) -> str:
        return self.format

    def spark_format(self) -> str:
        return self.format

    def __post_init__(self) -> None:
        if not isinstance(self.format, str) or not self.format:
            raise PipelineError("SparkSink needs a format, e.g. 'memory' or 'console'")
        super().__post_init__()


Sink = KafkaSink | DatabaseSink | SparkSink
SINK_TYPES = (KafkaSink, DatabaseSink, SparkSink)
SOURCE_TYPES = (KafkaSource, SparkSource)


# ------------------------------------------------------------------------------ until


@dataclasses.dataclass(frozen=True)
class Until:
    """When `Pipeline.run` returns: never (until a signal), once the backlog present at
    start is processed (`available_now`), or once no query had data for `idle_s`."""

    available_now: bool = False
    idle_s: float | None = None

    @classmethod
    def forever(cls) -> Until:
        return cls()

    @classmethod
    def backlog_processed(cls) -> Until:
        return cls(available_now=True)

    @classmethod
    def idle(cls, seconds: float) -> Until:
        if not isinstance(seconds, int | float) or not math.isfinite(seconds) or seconds <= 0:
            raise PipelineError(f"idle time must be a positive number of seconds, got {seconds!r}")
        return cls(idle_s=float(seconds))

    def describe(self) -> str:
        if self.available_now:
            return "until the backlog is processed"
        if self.idle_s is not None:
            return f"until idle for {self.idle_s:g} s"
        return "until stopped (Ctrl-C or SIGTERM)"


def as_until(value: Until | str | float | None) -> Until:
    """None/"forever", "available_now", a number of idle seconds, or an Until."""
    if isinstance(value, Until):
        return value
    if value is None or value == "forever":
        return Until.forever()
    if value in ("available_now", "available-now"):
        return Until.backlog_processed()
    if isinstance(value, int | float) and not isinstance(value, bool):
        return Until.idle(value)
    raise PipelineError(f"until must be 'forever', 'available_now', idle seconds or an Until, "
                        f"got {value!r}")


# --------------------------------------------------------------------------- pipeline


@dataclasses.dataclass(frozen=True)
class RunResult:
    """How a run ended: why it stopped and what each query did in it."""

    reason: str
    stats: list[QueryStats]


@dataclasses.dataclass(frozen=True)
class Pipeline:
    """source -> transform -> each sink (one streaming query per sink)."""

    name: str
    source: Source
    sinks: Sequence[Sink]
    checkpoint: str | os.PathLike[str]
    transform: Transform | None = None
    trigger_seconds: float = 1.0
    bootstrap_servers: str | None = None

    def __post_init__(self) -> None:
        _check_name("pipeline", self.name)
        if not isinstance(self.source, SOURCE_TYPES):
            raise PipelineError(f"pipeline {self.name}: source must be a KafkaSource or "
                                f"SparkSource, got {type(self.source).__name__}")
        sinks = (self.sinks,) if isinstance(self.sinks, SINK_TYPES) else tuple(self.sinks or ())
        if not sinks:
            raise PipelineError(f"pipeline {self.name} has no sinks: give at least one "
                                "KafkaSink, DatabaseSink or SparkSink")
        for sink in sinks:
            if not isinstance(sink, SINK_TYPES):
                raise PipelineError(f"pipeline {self.name}: {sink!r} is not a sink")
        names = [sink.name for sink in sinks]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise PipelineError(f"pipeline {self.name}: sink names must differ (each has its own "
                                f"checkpoint); give name= to the sinks named {', '.join(duplicates)}")
        object.__setattr__(self, "sinks", sinks)
        _check_transform(f"pipeline {self.name}", self.transform)
        if not str(self.checkpoint or ""):
            raise PipelineError(f"pipeline {self.name} needs a checkpoint directory")
        seconds = self.trigger_seconds
        if not isinstance(seconds, int | float) or not math.isfinite(seconds) or seconds < 0:
            raise PipelineError(f"trigger_seconds must be a number >= 0, got {seconds!r}")

    def replace(self, **changes: Any) -> Pipeline:
        """A copy with some fields changed (the CLI's --checkpoint, --bootstrap-servers)."""
        return dataclasses.replace(self, **changes)

    def with_kafka_properties(self, properties: Mapping[str, str]) -> Pipeline:
        """A copy whose Kafka source and Kafka sinks on the pipeline's cluster also get
        `properties` (security.protocol, sasl.*, ssl.*: the CLI's --command-config) as
        `kafka.*` options; they win over the same options in the pipeline file, as the
        command line's --bootstrap-servers wins over the file's. Sinks naming another
        cluster keep their own settings."""
        extra = {f"kafka.{k}": str(v) for k, v in properties.items()}
        if not extra:
            return self
        source = self.source
        if isinstance(source, KafkaSource):
            source = dataclasses.replace(source, options={**source.options, **extra})
        sinks = [dataclasses.replace(sink, options={**sink.options, **extra})
                 if isinstance(sink, KafkaSink) and sink.bootstrap_servers is None else sink
                 for sink in self.sinks]
        return dataclasses.replace(self, source=source, sinks=sinks)

    def query_checkpoint(self, sink: Sink) -> str:
        """`<checkpoint>/<sink name>`; local paths made absolute, URIs (hdfs://...) kept."""
        root = str(self.checkpoint)
        if "://" in root or root.startswith("file:"):
            return f"{root.rstrip('/')}/{sink.name}"
        return str(Path(root).resolve() / sink.name)

    def resolve_bootstrap(self, override: str | None = None) -> str | None:
        """The bootstrap servers to use, or PipelineError when Kafka needs some and none is set."""
        found = override or self.bootstrap_servers
        for env in BOOTSTRAP_ENVS:
            found = found or os.environ.get(env)
        needed = self.source.needs_bootstrap or any(sink.needs_bootstrap for sink in self.sinks)
        if needed and not found:
            raise PipelineError(f"pipeline {self.name} reads or writes Kafka but no bootstrap "
                                "servers are set: pass --bootstrap-servers, set "
                                f"Pipeline(bootstrap_servers=...) or ${BOOTSTRAP_ENVS[0]}")
        return found or None

    def build(self, spark: SparkSession, bootstrap_servers: str | None = None) -> list[tuple[Sink, DataFrame]]:
        """The DataFrame each sink writes (nothing runs yet)."""
        bootstrap = self.resolve_bootstrap(bootstrap_servers)
        with _spark_errors(f"pipeline {self.name}: loading the source"):
            frame = self.source.load(spark, bootstrap)
        frame = _apply(f"pipeline {self.name} transform", self.transform, frame)
        return [(sink, _apply(f"sink {sink.name} transform", sink.transform, frame)) for sink in self.sinks]

    def start(self, spark: SparkSession, until: Until | str | float | None = None,
              bootstrap_servers: str | None = None) -> dict[str, StreamingQuery]:
        """Start one query per sink; on a failure stop those already started."""
        until = as_until(until)
        bootstrap = self.resolve_bootstrap(bootstrap_servers)
        queries: dict[str, StreamingQuery] = {}
        try:
            for sink, frame in self.build(spark, bootstrap):
                with _spark_errors(f"pipeline {self.name}: starting the query of sink {sink.name}"):
                    queries[sink.name] = self._start_query(sink, frame, until, bootstrap)
        except BaseException:
            _stop_all(queries.values())
            raise
        return queries

    def _start_query(self, sink: Sink, frame: DataFrame, until: Until,
                     bootstrap: str | None) -> StreamingQuery:
        self._remove_partial_writes(sink)
        writer = (frame.writeStream.format(sink.spark_format()).outputMode(sink.output_mode)
                  .queryName(sink.name).options(**sink.writer_options(bootstrap))
                  .option("checkpointLocation", self.query_checkpoint(sink)))
        if until.available_now:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=f"{round(self.trigger_seconds * 1000)} milliseconds")
        return writer.start()

    def _remove_partial_writes(self, sink: Sink) -> None:
        location = self.query_checkpoint(sink)
        try:
            removed = spark_checkpoint.remove_partial_writes(location)
        except spark_checkpoint.CheckpointError:
            return  # not a local directory: Spark's own file system, left to Spark
        for path in removed:
            log.info("pipeline %s: removed %s, left by a driver killed mid-write", self.name, path)

    def run(self, spark: SparkSession, until: Until | str | float | None = None,
            display: Display | None = None, bootstrap_servers: str | None = None) -> RunResult:
        """Run until `until` (see `Until`); progress goes to `display` (log lines by default).

        Returns how the run ended; raises PipelineError when a query fails (the others are
        stopped first). SIGINT and SIGTERM stop the queries cleanly and return normally.
        """
        from py4j.protocol import Py4JError

        until = as_until(until)
        display = display or LogDisplay(self.name)
        stop_requested = threading.Event()
        with _signals_set(stop_requested), display:
            queries = self.start(spark, until, bootstrap_servers)
            display.note(f"{len(queries)} quer{'y' if len(queries) == 1 else 'ies'} "
                         f"({', '.join(queries)}) reading {self.source.describe()}, "
                         f"{until.describe()}; checkpoints under {self.checkpoint}")
            runner = _Runner(queries)
            try:
                reason = runner.wait(until, display, stop_requested)
            except Py4JError as exc:  # the JVM died under us: nothing left to stop
                raise PipelineError(f"lost the Spark driver: {_summary(exc)}") from exc
            finally:
                _stop_all(queries.values())
            runner.poll(display, time.monotonic())  # the last batches and the final states
            display.note(f"stopped: {reason}")
        return RunResult(reason, runner.tracker.all())


class _Runner:
    """Polls the queries of one run: progress into the tracker, failures, stop conditions."""

    def __init__(self, queries: dict[str, StreamingQuery]) -> None:
        self.queries = queries
        self.tracker = ProgressTracker(list(queries))

    def wait(self, until: Until, display: Display, stop_requested: threading.Event) -> str:
        while not stop_requested.wait(POLL_S):
            now_s = time.monotonic()
            failure = self.poll(display, now_s)
            if failure is not None:
                _stop_all(self.queries.values())
                raise PipelineError(failure)
            if not any(query.isActive for query in self.queries.values()):
                return "backlog processed" if until.available_now else "every query stopped"
            if until.idle_s is not None and self.tracker.idle_for_s(now_s) >= until.idle_s:
                return f"no new data for {until.idle_s:g} s"
        return "stop requested (signal)"

    def poll(self, display: Display, now_s: float) -> str | None:
        """Fold every query's news into the tracker and the display; the first failure."""
        new_batches, failure = [], None
        for name, query in self.queries.items():
            stats = self.tracker.stats[name]
            for progress in _progress_since(query, stats.seen):
                if self.tracker.observe(name, progress, now_s):
                    new_batches.append(name)
            active = query.isActive
            error = None if active else query.exception()
            status = query.status if active else None
            self.tracker.observe_status(name, status, active, error is not None, now_s)
            if error is not None and failure is None:
                failure = f"query {name} failed: {_summary(error)}"
        display.update(self.tracker.all(), new_batches)
        return failure


def _progress_since(query: StreamingQuery, seen: tuple[int, str] | None) -> list[dict[str, Any]]:
    """The progress records not folded yet, oldest first: the last one, or every recent one
    when batches were missed between two polls (or this is the first look)."""
    last = query.lastProgress
    if last is None:
        return []
    progress = json.loads(last.json)
    if seen is not None and int(progress.get("batchId", -1)) <= seen[0] + 1:
        return [progress]
    return [json.loads(p.json) for p in query.recentProgress]


def _stop_all(queries: Any) -> None:
    for query in list(queries):
        with contextlib.suppress(Exception):  # already stopped, or the JVM is gone
            if query.isActive:
                query.stop()


def _apply(owner: str, transform: Transform | None, frame: DataFrame) -> DataFrame:
    if transform is None:
        return frame
    with _spark_errors(f"{owner} failed"):
        result = transform(frame)
    if not hasattr(result, "writeStream") or not getattr(result, "isStreaming", False):
        raise PipelineError(f"{owner} must return the streaming DataFrame it builds, "
                            f"got {type(result).__name__}")
    return result


@contextlib.contextmanager
def _spark_errors(what: str) -> Iterator[None]:
    """Spark's analysis and option errors (a missing column, a bad source option) as
    PipelineError with the first lines of Spark's message."""
    from pyspark.errors import PySparkException

    try:
        yield
    except PySparkException as exc:
        raise PipelineError(f"{what}: {_summary(exc)}") from exc


def _summary(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    kept = "\n".join(lines[:ERROR_LINES_MAX])
    return kept + (f"\n... ({len(lines) - ERROR_LINES_MAX} more lines)" if len(lines) > ERROR_LINES_MAX else "")


@contextlib.contextmanager
def _signals_set(stop_requested: threading.Event) -> Iterator[None]:
    """SIGINT and SIGTERM set `stop_requested` instead of raising inside a py4j call
    (which could leave the gateway connection half-read). Main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, lambda *_: stop_requested.set())
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def load_pipeline(path: str | os.PathLike[str]) -> Pipeline:
    """Run a pipeline file (Python defining `pipeline = Pipeline(...)`) and return it."""
    file = Path(path)
    if not file.is_file():
        raise PipelineError(f"{file}: no such file")
    try:
        namespace = runpy.run_path(str(file), run_name="__onceflow_pipeline__")
    except PipelineError as exc:
        raise PipelineError(f"{file}: {exc}") from exc
    except SyntaxError as exc:
        raise PipelineError(f"{file}:{exc.lineno}: syntax error: {exc.msg}") from exc
    except Exception as exc:
        raise PipelineError(f"{file}: {type(exc).__name__}: {exc}") from exc
    found = namespace.get("pipeline")
    if found is None:
        raise PipelineError(f"{file} defines no `pipeline` (expected pipeline = Pipeline(...))")
    if not isinstance(found, Pipeline):
        raise PipelineError(f"{file}: `pipeline` is a {type(found).__name__}, not a "
                            "onceflow.spark.pipeline.Pipeline")
    return found
