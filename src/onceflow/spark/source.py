"""The `onceflow-kafka` source: Kafka topics as a Spark batch or streaming DataFrame.

Theory of operation. The driver plans, the executors read:

* Planning (driver, `KafkaBatchReader.partitions` / `KafkaStreamReader.latestOffset` and
  `.partitions`) asks Kafka for the subscribed topics' partitions and their earliest and
  latest offsets ("latest" = the last stable offset (LSO) under read_committed, the high
  watermark under read_uncommitted). A micro-batch is a pair of positions
  {topic: {"partition": next_offset}} (see offsets.py); Spark writes the end position to
  its checkpoint before the batch runs, so a replayed batch reads exactly the same
  [start, end) ranges. One input partition per topic-partition with a non-empty range.
* Reading (executors, `read_range`) assigns a confluent-kafka consumer at `start` and
  consumes in batches until the range is done, turning each run of up to
  ARROW_BATCH_ROWS messages into one pyarrow RecordBatch. Under read_committed the last
  offsets of a range may be control markers or aborted records that are never delivered,
  so "done" is not "saw end - 1" alone: the range is done when a delivered record reaches
  end - 1, when the consumer's position reaches `end`, or when the partition-EOF event
  (sent when the fetch position reaches the LSO) is at or past `end`. Records at or past
  `end` are dropped. A range that makes no progress for kafkaConsumer.pollTimeoutMs fails
  with an error naming the topic-partition and offsets.
* Admission control: `maxOffsetsPerTrigger` becomes Spark's default ReadMaxRows limit;
  `latestOffset` honours whatever limit Spark passes (offsets.rate_limit).
  `prepareForTriggerAvailableNow` freezes the latest offsets as the target of the query.

Options are documented in docs/spark-source.md.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Mapping

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from onceflow.spark.offsets import (
    DataLossError,
    OffsetReader,
    Positions,
    SourceOptionError,
    from_offsets,
    parse_offset_option,
    rate_limit,
    resolve,
    to_offsets,
)
from onceflow.spark.options import boolean_option, integer_option

__all__ = ["DataLossError", "KafkaBatchReader", "KafkaRange", "KafkaStreamReader",
           "SourceOptionError", "kafka_schema"]

# Rows per RecordBatch handed to Spark: big enough to amortise the Arrow hand-off,
# small enough to bound a task's memory (10k x 1 MB values is still 10 GB - a bound on
# the count, not the bytes; librdkafka's queued.max.messages.kbytes bounds the fetch side).
ARROW_BATCH_ROWS = 10_000
# How long one consume() call waits for its batch to fill before the loop re-checks the
# consumer position (the tail of a range may be markers that never arrive as messages).
CONSUME_WAIT_S = 0.1
# Spark's Kafka source default for kafkaConsumer.pollTimeoutMs (spark.network.timeout).
POLL_TIMEOUT_MS_DEFAULT = 120_000
# The executors' consumers never join or commit to this group; Kafka clients need one.
GROUP_ID_DEFAULT = "onceflow-spark-source"

# Spark options of the Kafka source that onceflow-kafka does not implement.
UNSUPPORTED_OPTIONS = ("assign", "subscribePattern", "startingOffsetsByTimestamp",
                       "endingOffsetsByTimestamp", "startingTimestamp", "endingTimestamp",
                       "startingOffsetsByTimestampStrategy", "minOffsetsPerTrigger",
                       "maxTriggerDelay", "minPartitions")
# kafka.* settings the source must control itself, with the reason given to the user.
REFUSED_KAFKA_SETTINGS = {
    "auto.offset.reset": "use startingOffsets (and failOnDataLoss for deleted offsets)",
    "enable.auto.commit": "the source never commits offsets to Kafka; Spark's checkpoint holds them",
    "enable.auto.offset.store": "the source never commits offsets to Kafka",
    "enable.partition.eof": "the read tasks rely on partition-EOF events",
    "key.deserializer": "keys and values are always returned as binary",
    "value.deserializer": "keys and values are always returned as binary",
}
ISOLATION_LEVELS = ("read_committed", "read_uncommitted")
# librdkafka consumer-only settings: the driver's AdminClient is a producer-type client and
# would log a warning for each; they only go to the executors' consumers.
CONSUMER_ONLY_PREFIXES = ("fetch.", "queued.", "group.", "auto.commit.")
CONSUMER_ONLY_SETTINGS = ("max.partition.fetch.bytes", "session.timeout.ms", "heartbeat.interval.ms",
                          "max.poll.interval.ms", "check.crcs", "partition.assignment.strategy",
                          "coordinator.query.interval.ms", "allow.auto.create.topics",
                          "consume.callback.max.messages")

# confluent-kafka error codes the read loop acts on (librdkafka's internal codes).
ERR_PARTITION_EOF = -191
ERR_AUTO_OFFSET_RESET = -140
ERR_OFFSET_OUT_OF_RANGE = 1


@dataclasses.dataclass(frozen=True)
class SourceOptions:
    """The parsed options; picklable, shipped to the executors with the reader."""

    topics: tuple[str, ...]
    starting: str | None
    ending: str | None
    max_offsets_per_trigger: int | None
    include_headers: bool
    read_committed: bool
    fail_on_data_loss: bool
    poll_timeout_ms: int
    kafka: dict[str, str]  # client settings without the "kafka." prefix

    def admin_config(self) -> dict[str, str]:
        return {key: value for key, value in self.kafka.items()
                if not key.startswith(CONSUMER_ONLY_PREFIXES) and key not in CONSUMER_ONLY_SETTINGS}

    def consumer_config(self) -> dict[str, str | bool]:
        return {"group.id": GROUP_ID_DEFAULT, **self.kafka,
                "isolation.level": "read_committed" if self.read_committed else "read_uncommitted",
                "enable.auto.commit": False, "enable.auto.offset.store": False,
                "enable.partition.eof": True,
                # "error" surfaces deleted offsets; "earliest" skips past them.
                "auto.offset.reset": "error" if self.fail_on_data_loss else "earliest"}


def parse_options(options: Mapping[str, str]) -> SourceOptions:
    """Check Spark's (case-insensitive) option map; SourceOptionError names the bad option."""
    given = {str(key).lower(): str(value) for key, value in options.items()}
    for name in UNSUPPORTED_OPTIONS:
        if name.lower() in given:
            raise SourceOptionError(f"option {name} is not supported by onceflow-kafka "
                                    "(use subscribe, startingOffsets, endingOffsets)")
    if not given.get("kafka.bootstrap.servers", "").strip():
        raise SourceOptionError("option kafka.bootstrap.servers is required")
    topics = tuple(t.strip() for t in given.get("subscribe", "").split(",") if t.strip())
    if not topics:
        raise SourceOptionError("option subscribe is required: a comma-separated list of topics")
    kafka = {key[len("kafka."):]: value for key, value in given.items() if key.startswith("kafka.")}
    for key, reason in REFUSED_KAFKA_SETTINGS.items():
        if key in kafka:
            raise SourceOptionError(f"option kafka.{key} is not allowed: {reason}")
    isolation = kafka.pop("isolation.level", "read_committed").strip().lower()
    if isolation not in ISOLATION_LEVELS:
        raise SourceOptionError(f"option kafka.isolation.level must be one of {ISOLATION_LEVELS}, "
                                f"got {isolation!r}")
    return SourceOptions(
        topics=topics, starting=given.get("startingoffsets"), ending=given.get("endingoffsets"),
        max_offsets_per_trigger=_positive_int(given, "maxoffsetspertrigger", "maxOffsetsPerTrigger"),
        include_headers=boolean_option(given, "includeheaders", "includeHeaders", False,
                                       SourceOptionError),
        read_committed=isolation == "read_committed",
        fail_on_data_loss=boolean_option(given, "failondataloss", "failOnDataLoss", True,
                                         SourceOptionError),
        poll_timeout_ms=_positive_int(given, "kafkaconsumer.polltimeoutms",
                                      "kafkaConsumer.pollTimeoutMs") or POLL_TIMEOUT_MS_DEFAULT,
        kafka=kafka)


def _positive_int(given: Mapping[str, str], key: str, name: str) -> int | None:
    return integer_option(given, key, name, None, 1, SourceOptionError, "a positive integer")


def kafka_schema(options: Mapping[str, str]) -> StructType:
    """Spark's Kafka source schema; `headers` only with includeHeaders=true."""
    # Parsing here makes bad options fail at load(), not at the first micro-batch.
    return spark_schema(parse_options(options).include_headers)


def spark_schema(include_headers: bool) -> StructType:
    fields = [StructField("key", BinaryType()), StructField("value", BinaryType()),
              StructField("topic", StringType()), StructField("partition", IntegerType()),
              StructField("offset", LongType()), StructField("timestamp", TimestampType()),
              StructField("timestampType", IntegerType())]
    if include_headers:
        header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
        fields.append(StructField("headers", ArrayType(header)))
    return StructType(fields)


class KafkaRange(InputPartition):
    """One Spark task: offsets [start, end) of one topic-partition."""

    def __init__(self, topic: str, partition: int, start: int, end: int) -> None:
        super().__init__((topic, partition, start, end))
        self.topic, self.partition, self.start, self.end = topic, partition, start, end


class _KafkaReader:
    """What the batch and the stream reader share: options, the schema check, the driver's
    offset reader (created on first use, never pickled) and the executors' read()."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.options = parse_options(options)
        expected = kafka_schema(options)
        if schema.simpleString() != expected.simpleString():
            raise SourceOptionError(f"onceflow-kafka has a fixed schema {expected.simpleString()}; "
                                    f"got {schema.simpleString()} (do not call .schema() on it)")
        self._offset_reader: OffsetReader | None = None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_offset_reader"] = None  # an AdminClient holds threads and sockets
        return state

    def offset_reader(self) -> OffsetReader:
        if self._offset_reader is None:
            self._offset_reader = OffsetReader(self.options.admin_config(), list(self.options.topics),
                                               self.options.read_committed)
        return self._offset_reader

    def read(self, partition: InputPartition) -> Iterator:
        if not isinstance(partition, KafkaRange):  # Spark's placeholder when there is nothing
            return iter(())
        return read_range(self.options, partition)

    def _check_data_loss(self, positions: Positions, earliest: Positions) -> Positions:
        """`positions` moved up to the log start where retention deleted records, or an error."""
        lost = {tp: offset for tp, offset in positions.items() if tp in earliest and offset < earliest[tp]}
        if lost and self.options.fail_on_data_loss:
            detail = ", ".join(f"{t}-{p} needs offset {o} but the log starts at {earliest[(t, p)]}"
                               for (t, p), o in sorted(lost.items()))
            raise DataLossError(f"onceflow-kafka: records were deleted before they were read "
                                f"({detail}); set failOnDataLoss=false to skip them")
        return {tp: max(offset, earliest.get(tp, offset)) for tp, offset in positions.items()}


class KafkaBatchReader(_KafkaReader, DataSourceReader):
    """`spark.read.format("onceflow-kafka")`: startingOffsets (default earliest) to
    endingOffsets (default latest), fixed when the query is planned."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        super().__init__(options, schema)
        topics = self.options.topics
        self._starting = parse_offset_option("startingOffsets", self.options.starting or "earliest",
                                             topics, allow_earliest=True, allow_latest=False)
        self._ending = parse_offset_option("endingOffsets", self.options.ending or "latest",
                                           topics, allow_earliest=False, allow_latest=True)

    def partitions(self) -> list[KafkaRange]:
        reader = self.offset_reader()
        found = reader.partitions()
        earliest, latest = reader.earliest(found), reader.latest(found)
        start = resolve("startingOffsets", self._starting, found, earliest, latest)
        end = resolve("endingOffsets", self._ending, found, earliest, latest)
        start = self._check_data_loss(start, earliest)
        for (topic, partition), offset in sorted(start.items()):
            if offset > end[(topic, partition)]:
                raise SourceOptionError(f"startingOffsets {offset} of {topic}-{partition} is after "
                                        f"its endingOffsets {end[(topic, partition)]}")
        return [KafkaRange(t, p, start[(t, p)], end[(t, p)]) for t, p in found
                if end[(t, p)] > start[(t, p)]]


class KafkaStreamReader(_KafkaReader, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """`spark.readStream.format("onceflow-kafka")`. One instance lives in the driver's
    planning process for the whole run of a query; its state (the resolved initial
    position, the availableNow target) lasts that long."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        super().__init__(options, schema)
        if self.options.ending is not None:
            raise SourceOptionError("option endingOffsets is for batch queries only "
                                    "(a streaming query has no end; use Trigger.AvailableNow)")
        self._starting = parse_offset_option("startingOffsets", self.options.starting or "latest",
                                             self.options.topics, allow_earliest=True, allow_latest=True)
        self._initial: Positions | None = None
        self._target: Positions | None = None

    def initialOffset(self) -> dict:
        # Resolved once per run: Spark asks again on every trigger until the first batch.
        if self._initial is None:
            reader = self.offset_reader()
            found = reader.partitions()
            self._initial = resolve("startingOffsets", self._starting, found,
                                    reader.earliest(found), reader.latest(found))
        return to_offsets(self._initial)

    def getDefaultReadLimit(self) -> ReadLimit:
        rows_max = self.options.max_offsets_per_trigger
        return ReadAllAvailable() if rows_max is None else ReadMaxRows(rows_max)

    def prepareForTriggerAvailableNow(self) -> None:
        reader = self.offset_reader()
        self._target = reader.latest(reader.partitions())

    def reportLatestOffset(self) -> dict:
        reader = self.offset_reader()
        return to_offsets(reader.latest(reader.partitions()))

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = from_offsets(start)
        reader = self.offset_reader()
        # Under availableNow the frozen target is the end of the world: partitions created
        # after it are not read, and no partition is read past it.
        latest = dict(self._target) if self._target is not None else reader.latest(reader.partitions())
        earliest = reader.earliest(latest)
        self._check_went_back(begin, latest)
        origin = self._check_data_loss({tp: begin.get(tp, earliest[tp]) for tp in latest}, earliest)
        if self._target is not None:
            latest = {tp: max(offset, origin[tp]) for tp, offset in latest.items()}
        end = dict(begin)
        if isinstance(limit, ReadMaxRows):
            end.update(rate_limit(origin, latest, limit.max_rows))
        elif isinstance(limit, ReadMinRows) and _backlog(origin, latest) < limit.min_rows:
            return start
        else:  # ReadAllAvailable; file and byte limits do not apply to Kafka offsets
            end.update(latest)
        return to_offsets(end)

    def _check_went_back(self, begin: Positions, latest: Positions) -> None:
        shrunk = {tp: o for tp, o in begin.items() if tp in latest and latest[tp] < o}
        if shrunk and self.options.fail_on_data_loss:
            detail = ", ".join(f"{t}-{p} is at offset {o} but ends at {latest[(t, p)]}"
                               for (t, p), o in sorted(shrunk.items()))
            raise DataLossError(f"onceflow-kafka: positions past the end of their partitions "
                                f"({detail}): the topic was deleted and recreated, or an offset in "
                                "startingOffsets is too large; set failOnDataLoss=false to go on")

    def partitions(self, start: dict, end: dict) -> list[KafkaRange]:
        begin, finish = from_offsets(start), from_offsets(end)
        new = [tp for tp in finish if tp not in begin]
        if new:  # partitions discovered by this batch start at their earliest offset
            begin.update(self.offset_reader().earliest(new))
        return [KafkaRange(t, p, begin[(t, p)], finish[(t, p)]) for t, p in sorted(finish)
                if finish[(t, p)] > begin[(t, p)]]

    def commit(self, end: dict) -> None:
        """Nothing to do: positions live in Spark's checkpoint, never in a Kafka group."""

    def stop(self) -> None:
        self._offset_reader = None


def _backlog(origin: Positions, latest: Positions) -> int:
    return sum(max(0, latest[tp] - origin[tp]) for tp in latest)


def read_range(options: SourceOptions, part: KafkaRange) -> Iterator:
    """The records of offsets [part.start, part.end) as pyarrow RecordBatches (executor side)."""
    from confluent_kafka import Consumer, TopicPartition

    if part.end <= part.start:
        return
    schema = _arrow_schema(options)
    consumer = Consumer(options.consumer_config())
    try:
        position = [TopicPartition(part.topic, part.partition)]
        consumer.assign([TopicPartition(part.topic, part.partition, part.start)])
        progress = RangeProgress(part, options, time.monotonic())
        pending: list = []
        while not progress.done:
            # One past the range's remaining offsets: the EOF event or the first record
            # past `end` fills the batch, so consume() rarely waits for its timeout.
            wanted = min(ARROW_BATCH_ROWS - len(pending), progress.remaining + 1)
            pending.extend(progress.accept(consumer.consume(wanted, CONSUME_WAIT_S), time.monotonic()))
            if not progress.done:
                progress.note_position(consumer.position(position)[0].offset, time.monotonic())
            if len(pending) >= ARROW_BATCH_ROWS or (progress.done and pending):
                yield record_batch(pending, part, schema, options.include_headers)
                pending = []
    finally:
        consumer.close()


class RangeProgress:
    """Decides when the read of [start, end) is complete, from what the consumer delivers
    (records, EOF and error events) and from its position; bounds a read that stalls."""

    def __init__(self, part: KafkaRange, options: SourceOptions, now_s: float) -> None:
        self.part = part
        self.fail_on_data_loss = options.fail_on_data_loss
        self.stall_max_s = options.poll_timeout_ms / 1000
        self.next_offset = part.start   # the next offset not yet accounted for
        self.progress_at_s = now_s
        self.done = False
        self.last_error: object = None
        self.log_end: int | None = None   # where the last partition-EOF event was

    @property
    def remaining(self) -> int:
        return max(1, self.part.end - self.next_offset)

    def accept(self, messages: list, now_s: float) -> list:
        """The records of `messages` inside the range; handles the events among them."""
        if not messages:
            return []
        events = [m for m in messages if m.error() is not None]
        records = [m for m in messages if m.error() is None] if events else messages
        for event in events:
            self._event(event)
        if not records:
            return records
        self.progress_at_s = now_s
        last = records[-1].offset()
        self.next_offset = max(self.next_offset, last + 1)
        if last >= self.part.end - 1:
            self.done = True
            # Offsets ascend within a partition: trim the records at or past `end`.
            while records and records[-1].offset() >= self.part.end:
                records.pop()
        if records and records[0].offset() < self.part.start:  # only after a reset to earliest
            records = [m for m in records if m.offset() >= self.part.start]
        return records

    def note_position(self, position: int, now_s: float) -> None:
        """The consumer's position passes markers and aborted records that no message shows."""
        if position >= self.part.end:
            self.done = True
        elif position > self.next_offset:
            self.next_offset = position
            self.progress_at_s = now_s
        elif now_s - self.progress_at_s > self.stall_max_s:
            raise TimeoutError(
                f"onceflow-kafka: reading {self._range()} made no progress for "
                f"{self.stall_max_s:.0f} s (kafkaConsumer.pollTimeoutMs), stuck at offset "
                f"{self.next_offset} (partition end seen: {self.log_end}); last client error: "
                f"{self.last_error}")

    def _event(self, event) -> None:
        error = event.error()
        code = error.code()
        if code == ERR_PARTITION_EOF:
            # EOF = the fetch position reached the LSO (read_committed) or the high watermark.
            # Short of `end` (a range planned past today's LSO, e.g. by a read_uncommitted run
            # of the same checkpoint) the read waits, bounded by the stall limit.
            self.log_end = event.offset()
            if event.offset() >= self.part.end:
                self.done = True
        elif code in (ERR_AUTO_OFFSET_RESET, ERR_OFFSET_OUT_OF_RANGE) and self.fail_on_data_loss:
            raise DataLossError(f"onceflow-kafka: offsets of {self._range()} are no longer in "
                                f"Kafka (deleted by retention or DeleteRecords): {error.str()}; "
                                "set failOnDataLoss=false to skip them")
        elif error.fatal():
            raise RuntimeError(f"onceflow-kafka: reading {self._range()} failed: {error.str()}")
        else:  # transient (broker down, leader moving): librdkafka retries; the stall bound holds
            self.last_error = error.str()

    def _range(self) -> str:
        return f"{self.part.topic}-{self.part.partition} offsets [{self.part.start}, {self.part.end})"


def _arrow_schema(options: SourceOptions):
    from pyspark.sql.pandas.types import to_arrow_schema

    # Spark checks every RecordBatch against exactly this schema (timestamps in UTC).
    return to_arrow_schema(spark_schema(options.include_headers), timezone="UTC")


def record_batch(messages: list, part: KafkaRange, schema, include_headers: bool):
    """One RecordBatch of `messages` (records of one partition), column by column: one pass
    per field keeps the per-record Python work to a method call."""
    import pyarrow as pa
    import pyarrow.compute as pc

    count = len(messages)
    # confluent-kafka numbers timestamp types 0 = none, 1 = create, 2 = log append;
    # Kafka (and Spark's column) -1, 0, 1.
    kinds, millis = zip(*[m.timestamp() for m in messages])
    kinds, millis = pa.array(kinds, pa.int32()), pa.array(millis, pa.int64())
    columns = [
        pa.array([m.key() for m in messages], pa.binary()),
        pa.array([m.value() for m in messages], pa.binary()),
        pa.repeat(pa.scalar(part.topic, pa.string()), count),
        pa.repeat(pa.scalar(part.partition, pa.int32()), count),
        pa.array([m.offset() for m in messages], pa.int64()),
        pc.multiply(millis, pa.scalar(1000, pa.int64())).cast(schema.field("timestamp").type),
        pc.subtract(kinds, pa.scalar(1, pa.int32())),
    ]
    if include_headers:
        columns.append(_headers(messages, schema.field("headers").type))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _headers(messages: list, list_type):
    """Headers as list<struct<key, value>>; null for a record without headers, as Spark."""
    import pyarrow as pa

    bounds, keys, values, missing = [0], [], [], []
    for message in messages:
        headers = message.headers()
        missing.append(not headers)
        for key, value in headers or ():
            keys.append(key)
            values.append(value)
        bounds.append(len(keys))
    struct_type = list_type.value_type
    entries = pa.StructArray.from_arrays(
        [pa.array(keys, struct_type.field("key").type), pa.array(values, struct_type.field("value").type)],
        fields=[struct_type.field("key"), struct_type.field("value")])
    return pa.ListArray.from_arrays(pa.array(bounds, pa.int32()), entries, type=list_type,
                                    mask=pa.array(missing, pa.bool_()))
