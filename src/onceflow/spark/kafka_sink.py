"""The `onceflow-kafka` sink: Spark rows into Kafka topics, exactly once per micro-batch.

Theory of operation. Spark runs one write task per partition of the write stage and
micro-batch, in the executors' Python workers; `KafkaStreamWriter.write` is that task.

* Identity. A task knows its query id (stable across restarts from one checkpoint), its
  micro-batch id and its partition id. Its producer's transactional id is
  `<prefix>-<query id>-<partition id>` - the same for every attempt of that partition in
  every batch, never the attempt number: `init_transactions()` bumps the id's epoch, which
  completes or aborts whatever an earlier attempt left open and fences that attempt (its
  later produce or commit fails), so of two attempts only the last to initialise can commit.
* Replay. After `init_transactions()` the task looks up the latest committed progress
  record of (query, partition) (progress.py explains why that lookup is correct). If it is
  for this batch or a later one, the batch was already written by an earlier run whose
  driver died before Spark's commit log recorded it: the task drains its rows and writes
  nothing ("skipped"). Otherwise it begins a transaction, produces every row, produces the
  progress record last (it holds the progress partition back from other tasks' lookups only
  for the commit's duration) and commits. Any error aborts the transaction when the
  producer still can and raises, so Spark retries the task. A partition with no rows
  commits nothing.
* So a read_committed reader sees each batch's rows of each partition once: per-partition
  atomic per micro-batch, exactly once under replay as long as a replay gives each
  partition the same rows (deterministic transformations, stable partitioning of the write
  stage). docs/spark-kafka-sink.md states the guarantee and what breaks it.
* The driver side (`commit`/`abort`) does nothing that could double: it logs a summary
  (rows written, partitions skipped - a WARNING, since a skip means a replay happened).
* `exactlyOnce=false`: an idempotent producer and a flush per task (at least once).
* Batch writes (`df.write`): one transaction per task with a per-job transactional id, no
  progress record - atomic per task only; a task re-run after it committed writes again.

Costs. A new transactional producer is created and initialised per task: with
`enable.sparse.connections=false` that takes ~3-8 ms against a local broker (measured), and
it runs in a background thread, together with the progress lookup, while Spark delivers the
task's first rows (held, bounded, until the transaction may begin), so it adds no latency
in a Kafka -> Kafka query. A producer kept between tasks would save little and could not be
trusted without a round trip anyway (another worker may have initialised the same id since),
so there is none. What is kept per Python worker: the progress topic's lookup consumers and
the at-least-once mode's idempotent producer - neither holds transactional state. The rows
cost one `produce()` call each: the writer takes Arrow batches (DataSourceStreamArrowWriter)
and turns whole columns into Python lists at once instead of building Spark Rows (measured:
0.2 us per row before produce(), against 2.8 us for PySpark's Row iterator).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import itertools
import logging
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from typing import ClassVar, Self

from confluent_kafka import KafkaError, KafkaException, Producer
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from onceflow.spark import batch_commit, progress
from onceflow.spark.kafka_sink_options import (
    RowLayout,
    SinkOptionError,
    SinkOptions,
    parse_options,
    row_layout,
)
from onceflow.spark.progress import ProgressLog, ProgressRecord

__all__ = ["KafkaBatchWriter", "KafkaCommitMessage", "KafkaStreamWriter", "SinkError",
           "TransactionalWriter", "close_cached_clients", "progress_log", "write_at_least_once",
           "write_exactly_once"]

logger = logging.getLogger(__name__)

INIT_TIMEOUT_MARGIN_S = 30.0   # init waits for an earlier attempt's commit/abort to finish
COMMIT_ATTEMPTS_MAX = 5        # retriable commit errors (a coordinator moved, a timeout)
BUFFER_FULL_WAIT_S = 0.05      # a full producer queue: serve deliveries, then retry
FLUSH_TIMEOUT_S = 300.0        # at-least-once: a task's rows must be acknowledged by then
# Input held in memory while the transactional id is initialised (tens of ms, usually).
OPEN_HELD_BYTES_MAX = 64 * 1024 * 1024


class SinkError(RuntimeError):
    """A write task could not write its rows; Spark retries the task."""


@dataclasses.dataclass
class KafkaCommitMessage(WriterCommitMessage):
    """What one write task did; `outcome` is written, skipped (replayed batch) or empty."""

    partition: int
    batch: int | None
    rows: int
    outcome: str
    transactional_id: str | None = None
    duration_ms: int = 0
    # atomicity=batch (batch_commit.py): the open transaction handed to the driver
    query: str | None = None
    producer_id: int = -1
    producer_epoch: int = -1
    path: str | None = None


def summarize(batch: int | None, messages: Iterable[KafkaCommitMessage | None]) -> str:
    """One line about a batch's tasks (a None message: a task that failed)."""
    count: Counter = Counter()
    for message in messages:
        outcome = "failed" if message is None else message.outcome
        count[outcome] += 1
        count[f"{outcome} rows"] += 0 if message is None else message.rows
    text = f"onceflow-kafka batch {'(write)' if batch is None else batch}: "
    if count["prepared"]:
        text += (f"{count['prepared rows']} rows prepared by {count['prepared']} partitions, ")
    text += (f"{count['written rows']} rows written by {count['written']} partitions, "
            f"{count['empty']} partitions empty, {count['failed']} failed")
    if count["skipped"]:
        text += (f"; {count['skipped']} partitions skipped ({count['skipped rows']} rows already "
                 "committed by an earlier run of this batch)")
    return text


class KafkaStreamWriter(DataSourceStreamArrowWriter):
    """`df.writeStream.format("onceflow-kafka")`: one transaction per task and micro-batch."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.options = parse_options(options)
        self.layout = row_layout(schema, self.options.topic)

    def write(self, iterator: Iterator) -> KafkaCommitMessage:
        from pyspark import TaskContext

        context = TaskContext.get()
        query = context.getLocalProperty("sql.streaming.queryId")
        batch_text = context.getLocalProperty("streaming.sql.batchId")
        if not query or batch_text is None:
            raise SinkError("no streaming query id or batch id in the task context")
        partition, batch = context.partitionId(), int(batch_text)
        if not self.options.exactly_once:
            return write_at_least_once(self.options, self.layout, partition, batch, iterator)
        if self.options.atomicity == "batch":
            return batch_commit.write_prepared(
                self.options, self.layout, query, partition, batch, _nonempty(iterator),
                TransactionalWriter, KafkaCommitMessage)
        return write_exactly_once(self.options, self.layout, query, partition, batch, iterator)

    def commit(self, messages: list[KafkaCommitMessage | None], batchId: int) -> None:
        if self.options.exactly_once and self.options.atomicity == "batch":
            outcome = batch_commit.BatchCommitter(self.options).commit(
                messages, batchId, progress_log(self.options))
            logger.info("%s; %s", summarize(batchId, messages), outcome)
            return
        # A skip means the batch ran before (the driver died between the tasks' commits and
        # Spark's commit log): worth seeing without raising the log level.
        skipped = any(m is not None and m.outcome == "skipped" for m in messages)
        logger.log(logging.WARNING if skipped else logging.INFO, summarize(batchId, messages))

    def abort(self, messages: list[KafkaCommitMessage | None], batchId: int) -> None:
        if self.options.exactly_once and self.options.atomicity == "batch":
            batch_commit.BatchCommitter(self.options).abort(messages)
            logger.warning("aborted by Spark, prepared transactions aborted: %s",
                           summarize(batchId, messages))
            return
        # Nothing to undo here: committed partitions stay committed and a replay skips them;
        # a failed task's open transaction is aborted by its next attempt's init or by the
        # broker after transaction.timeout.ms.
        logger.warning("aborted by Spark: %s", summarize(batchId, messages))


class KafkaBatchWriter(DataSourceArrowWriter):
    """`df.write.format("onceflow-kafka")`: one transaction per task (atomic per task only)."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.options = parse_options(options)
        if self.options.atomicity == "batch":
            raise SinkOptionError("option atomicity=batch is for streaming writes "
                                  "(writeStream); a batch write commits per task")
        self.layout = row_layout(schema, self.options.topic)
        # Made once on the driver and pickled into every task: the attempts of one task
        # share a transactional id (a retry fences its predecessor), jobs do not.
        self.job = uuid.uuid4().hex[:16]

    def write(self, iterator: Iterator) -> KafkaCommitMessage:
        from pyspark import TaskContext

        partition = TaskContext.get().partitionId()
        if not self.options.exactly_once:
            return write_at_least_once(self.options, self.layout, partition, None, iterator)
        started = time.monotonic()
        batches = _nonempty(iterator)
        first = next(batches, None)
        if first is None:
            return KafkaCommitMessage(partition, None, 0, "empty")
        transactional_id = f"{self.options.transactional_id_prefix}-batch-{self.job}-{partition}"
        with TransactionalWriter(self.options, transactional_id) as writer:
            rows = writer.write(self.layout, itertools.chain([first], batches))
        return KafkaCommitMessage(partition, None, rows, "written", transactional_id,
                                  _elapsed_ms(started))

    def commit(self, messages: list[KafkaCommitMessage | None]) -> None:
        logger.info(summarize(None, messages))

    def abort(self, messages: list[KafkaCommitMessage | None]) -> None:
        logger.warning("aborted by Spark (tasks that committed stay committed): %s",
                       summarize(None, messages))


def write_exactly_once(options: SinkOptions, layout: RowLayout, query: str, partition: int,
                       batch: int, batches: Iterable) -> KafkaCommitMessage:
    """One streaming write task in exactly-once mode (see the module docstring)."""
    started = time.monotonic()
    transactional_id = f"{options.transactional_id_prefix}-{query}-{partition}"
    batches = _nonempty(batches)
    # init_transactions and the progress lookup are broker round trips; the input rows are
    # upstream work (the source's reads). Overlap them: open in the background while the
    # first batches arrive, holding those batches (bounded) until the transaction may begin.
    opening = _background().submit(_open, options, transactional_id, query, partition)
    try:
        held = _read_while(lambda: not opening.done(), batches, OPEN_HELD_BYTES_MAX)
    finally:
        # Even when the input failed: let the open finish, so no producer outlives the task
        # half-initialised; its own error (if any) is raised here only when the input is fine.
        concurrent.futures.wait([opening])
    writer, last = opening.result()
    rows_in = itertools.chain(held, batches)
    with writer:
        if last is not None and last.batch >= batch:
            rows = sum(b.num_rows for b in rows_in)
            return KafkaCommitMessage(partition, batch, rows, "skipped", transactional_id,
                                      _elapsed_ms(started))
        first = next(rows_in, None)
        if first is None:
            return KafkaCommitMessage(partition, batch, 0, "empty", transactional_id,
                                      _elapsed_ms(started))

        def progress_record(rows: int) -> ProgressRecord:
            return ProgressRecord(query=query, partition=partition, batch=batch, records=rows,
                                  time_ms=int(time.time() * 1000),
                                  transactional_id=transactional_id)

        rows = writer.write(layout, itertools.chain([first], rows_in), progress_record)
    return KafkaCommitMessage(partition, batch, rows, "written", transactional_id,
                              _elapsed_ms(started))


def _open(options: SinkOptions, transactional_id: str, query: str,
          partition: int) -> tuple[TransactionalWriter, ProgressRecord | None]:
    """Initialise the transactional id (fencing earlier attempts), then read its progress."""
    writer = TransactionalWriter(options, transactional_id)
    return writer, progress_log(options).latest(query, partition, options.transaction_timeout_ms)


def _read_while(condition, batches: Iterator, bytes_max: int) -> list:
    """Take batches while `condition()` holds, up to `bytes_max` bytes."""
    held: list = []
    size = 0
    while condition() and size < bytes_max:
        batch = next(batches, None)
        if batch is None:
            break
        held.append(batch)
        size += batch.nbytes
    return held


_BACKGROUND: list[concurrent.futures.ThreadPoolExecutor] = []


def _background() -> concurrent.futures.ThreadPoolExecutor:
    # Made on first use, in the Python worker (never at import on the driver).
    if not _BACKGROUND:
        _BACKGROUND.append(concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="onceflow-sink-open"))
    return _BACKGROUND[0]


def write_at_least_once(options: SinkOptions, layout: RowLayout, partition: int,
                        batch: int | None, batches: Iterable) -> KafkaCommitMessage:
    """An idempotent producer and a flush: every row at least once (duplicates on retries)."""
    started = time.monotonic()
    producer = IdempotentProducer.for_options(options)
    try:
        rows = produce_rows(producer.producer, layout, options.topic, _nonempty(batches))
        producer.flush()
    except BaseException:
        producer.discard()
        raise
    outcome = "written" if rows else "empty"
    return KafkaCommitMessage(partition, batch, rows, outcome, None, _elapsed_ms(started))


class IdempotentProducer:
    """The at-least-once mode's producer, kept per Python worker and settings: it has
    nothing to fence, and a new one often waits ~0.5 s for its producer id (measured:
    librdkafka retries that request on a timer if it races the bootstrap connection)."""

    _cache: ClassVar[dict[tuple, IdempotentProducer]] = {}

    def __init__(self, options: SinkOptions) -> None:
        self.failures: list[KafkaError] = []
        config = options.producer_config(None)
        config["on_delivery"] = lambda error, _message: self.failures.append(error)  # errors only
        config["error_cb"] = lambda error: self.failures.append(error) if error.fatal() else None
        self.producer = Producer(config)
        self.key = _options_key(options)

    @classmethod
    def for_options(cls, options: SinkOptions) -> IdempotentProducer:
        key = _options_key(options)
        producer = cls._cache.get(key)
        if producer is None:
            producer = cls._cache[key] = IdempotentProducer(options)
        return producer

    def flush(self) -> None:
        left = self.producer.flush(FLUSH_TIMEOUT_S)
        if self.failures or left:
            raise SinkError(f"{len(self.failures)} rows failed and {left} were unacknowledged "
                            f"after {FLUSH_TIMEOUT_S:.0f} s; first error: {self.failures[:1]}")

    def discard(self) -> None:
        """Forget this producer after an error: the task's retry starts from a clean one."""
        self._cache.pop(self.key, None)


def _options_key(options: SinkOptions) -> tuple:
    return (options.bootstrap, tuple(sorted(options.kafka.items())))


class TransactionalWriter:
    """A transactional producer for one write task attempt; a context manager.

    Creating it runs `init_transactions()`: the earlier attempts of this transactional id are
    completed or aborted and fenced before this one reads progress or writes anything.
    """

    def __init__(self, options: SinkOptions, transactional_id: str) -> None:
        self.options = options
        self.transactional_id = transactional_id
        # librdkafka names the cause of a fatal error (such as being fenced) only here;
        # later calls just fail with _FATAL.
        self.fatal_error: KafkaError | None = None
        # The first failed delivery: a failed commit only says "N message(s) failed
        # delivery", this says why (TOPIC_AUTHORIZATION_FAILED without Write, ...).
        self.delivery_error: KafkaError | None = None
        config = options.producer_config(transactional_id)
        config["error_cb"] = self._on_error
        config["on_delivery"] = self._on_delivery   # errors only (delivery.report.only.error)
        self.producer = Producer(config)
        init_timeout_s = options.transaction_timeout_ms / 1000 + INIT_TIMEOUT_MARGIN_S
        try:
            self.producer.init_transactions(init_timeout_s)
        except KafkaException as exception:
            error = exception.args[0]
            hint = (f"; kafka.transaction.timeout.ms={options.transaction_timeout_ms} must not "
                    "exceed the broker's transaction.max.timeout.ms"
                    if error.code() == KafkaError.INVALID_TRANSACTION_TIMEOUT else "")
            raise SinkError(f"init_transactions of {transactional_id} failed: {error}{hint}") \
                from None

    def _on_error(self, error: KafkaError) -> None:
        if error.fatal() and self.fatal_error is None:
            self.fatal_error = error

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        # Nothing is left in flight after a commit or an abort; dropping the producer
        # closes its connections.
        self.producer = None

    def write(self, layout: RowLayout, batches: Iterable, progress_record=None) -> int:
        """Produce every row and (if given) the progress record in one transaction; commit.

        `progress_record(rows)` makes the progress record once the row count is known. On any
        error the transaction is aborted when the producer still can, and the error raised.
        """
        producer = self.producer
        producer.begin_transaction()
        with self._aborted_on_error():
            rows = produce_rows(producer, layout, self.options.topic, batches)
            if progress_record is not None:
                record = progress_record(rows)
                log = progress_log(self.options)
                target = progress.progress_partition(record.query, record.partition,
                                                     log.partition_count())
                producer.produce(self.options.progress_topic, record.encode(), record.key(),
                                 partition=target)
            self._commit()
        return rows

    def prepare(self, layout: RowLayout, batches: Iterable) -> int:
        """Produce every row in a transaction and flush, leaving it open (atomicity=batch:
        the driver commits it). On any error the transaction is aborted and the error raised."""
        producer = self.producer
        producer.begin_transaction()
        with self._aborted_on_error():
            rows = produce_rows(producer, layout, self.options.topic, batches)
            left = producer.flush(self.options.transaction_timeout_ms / 1000)
            if left or self.delivery_error is not None:
                raise SinkError(f"prepare of {self.transactional_id} failed: {left} rows "
                                f"unacknowledged; first delivery error: {self.delivery_error}")
            if self.fatal_error is not None:
                raise SinkError(self._explain(self.fatal_error))
        return rows

    @contextlib.contextmanager
    def _aborted_on_error(self) -> Iterator[None]:
        """The open transaction aborted (when the producer still can) on any error, which
        is raised again; a client error as SinkError with its explanation."""
        try:
            yield
        except KafkaException as exception:
            self._abort_quietly()
            raise SinkError(self._explain(exception.args[0])) from None
        except BaseException:
            self._abort_quietly()
            raise

    def abort_quietly(self) -> None:
        """Abort the open transaction if the producer still can (see `_abort_quietly`)."""
        self._abort_quietly()

    def _commit(self) -> None:
        timeout_s = self.options.transaction_timeout_ms / 1000
        for _ in range(COMMIT_ATTEMPTS_MAX):
            try:
                self.producer.commit_transaction(timeout_s)
                return
            except KafkaException as exception:
                error = exception.args[0]
                if error.retriable():
                    continue
                raise SinkError(self._explain(error)) from None
        raise SinkError(f"commit of {self.transactional_id} failed {COMMIT_ATTEMPTS_MAX} times "
                        "with retriable errors")

    def _explain(self, error: KafkaError) -> str:
        if error.code() == KafkaError._FATAL:
            if self.fatal_error is None:
                try:
                    self.producer.poll(0)  # serves error_cb, or raises, with the cause
                except KafkaException as cause:
                    self.fatal_error = cause.args[0]
            error = self.fatal_error or error
        if error.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
                            KafkaError.INVALID_PRODUCER_EPOCH):
            return (f"transaction of {self.transactional_id} was fenced: a newer attempt of this "
                    f"partition initialised the same transactional id, so this attempt's rows "
                    f"are discarded ({error})")
        if error.code() == KafkaError._INCONSISTENT and self.delivery_error is not None:
            return (f"commit of {self.transactional_id} failed: {error}; first delivery "
                    f"error: {self.delivery_error}")
        return f"commit of {self.transactional_id} failed: {error}"

    def _on_delivery(self, error: KafkaError | None, _message) -> None:
        if error is not None and self.delivery_error is None:
            self.delivery_error = error

    def _abort_quietly(self) -> None:
        try:
            self.producer.abort_transaction(self.options.transaction_timeout_ms / 1000)
        except KafkaException as error:
            # A fenced or fatally failed producer cannot abort; the next attempt's init (or
            # the broker's transaction timeout) aborts the transaction instead.
            logger.info("abort of %s did not complete: %s", self.transactional_id, error)


def produce_rows(producer: Producer, layout: RowLayout, topic_option: str | None,
                 batches: Iterable) -> int:
    """Produce every row of the Arrow batches; the row count. The hot loop of the sink."""
    rows = 0
    produce = producer.produce
    for batch in batches:
        count = batch.num_rows
        values = batch.column(layout.value).to_pylist()
        keys = (batch.column(layout.key).to_pylist() if layout.key is not None
                else itertools.repeat(None, count))
        if layout.plain:
            for key, value in zip(keys, values):
                try:
                    produce(topic_option, value, key)
                except BufferError:
                    _produce_when_room(producer, topic_option, value, key)
        else:
            _produce_general(producer, layout, topic_option, batch, keys, values)
        rows += count
    return rows


def _produce_general(producer: Producer, layout: RowLayout, topic_option: str | None, batch,
                     keys: Iterable, values: list) -> None:
    count = batch.num_rows
    # As in Spark's Kafka sink, the topic option (when set) overrides the topic column.
    topics = (batch.column(layout.topic).to_pylist() if layout.topic is not None
              and topic_option is None else itertools.repeat(topic_option, count))
    partitions = (batch.column(layout.partition).to_pylist() if layout.partition is not None
                  else itertools.repeat(None, count))
    headers = (batch.column(layout.headers).to_pylist() if layout.headers is not None
               else itertools.repeat(None, count))
    for key, value, topic, partition, header in zip(keys, values, topics, partitions, headers):
        if topic is None:
            raise SinkError("a row has a null topic and no topic option is set")
        kwargs = {"partition": -1 if partition is None else partition}
        if header:
            kwargs["headers"] = [(h["key"], h["value"]) for h in header]
        try:
            producer.produce(topic, value, key, **kwargs)
        except BufferError:
            _produce_when_room(producer, topic, value, key, **kwargs)


def _produce_when_room(producer: Producer, topic: str, value, key, **kwargs) -> None:
    """The producer's queue is full: serve deliveries until the row fits (bounded)."""
    deadline = time.monotonic() + FLUSH_TIMEOUT_S
    while True:
        producer.poll(BUFFER_FULL_WAIT_S)
        try:
            producer.produce(topic, value, key, **kwargs)
            return
        except BufferError:
            if time.monotonic() > deadline:
                raise SinkError(f"producer queue stayed full for {FLUSH_TIMEOUT_S:.0f} s") from None


def _nonempty(batches: Iterable) -> Iterator:
    return (batch for batch in batches if batch.num_rows)


def _elapsed_ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


# One ProgressLog per Python worker and progress topic (see its docstring).
_PROGRESS_LOGS: dict[tuple, ProgressLog] = {}


def progress_log(options: SinkOptions) -> ProgressLog:
    client_config = options.client_config()
    key = (options.bootstrap, options.progress_topic, options.progress_partitions,
           options.progress_replication_factor, tuple(sorted(client_config.items())))
    log = _PROGRESS_LOGS.get(key)
    if log is None:
        log = ProgressLog(options.bootstrap, options.progress_topic,
                          partitions=options.progress_partitions,
                          replication_factor=options.progress_replication_factor,
                          client_config=client_config)
        _PROGRESS_LOGS[key] = log
    return log


def close_cached_clients() -> None:
    """Close the clients this process keeps between tasks (for embedding and tests)."""
    while _PROGRESS_LOGS:
        _PROGRESS_LOGS.popitem()[1].close()
    IdempotentProducer._cache.clear()
    batch_commit.close_clusters()
