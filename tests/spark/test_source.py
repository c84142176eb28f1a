"""The onceflow-kafka source: real broker, real confluent-kafka producers (plain and
transactional), real Spark (local[2]) reading batch and streaming queries.

The expected content always comes from Kafka itself (a plain read_committed consumer or the
records the test produced), never from the source under test.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions
from hypothesis import given, settings
from hypothesis import strategies as st

from onceflow.spark.offsets import rate_limit
from onceflow.spark.source import DataLossError, KafkaRange, parse_options, read_range
from tests.spark.support import create_topic, read_committed, unique, wait_for

QUERY_TIMEOUT_S = 90


# --- helpers -----------------------------------------------------------------------------

def _produce(bootstrap: str, topic: str, records: list[tuple[int, bytes | None, bytes, list | None]]) -> None:
    """(partition, key, value, headers) in order, acks=all, idempotent."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 2})
    for partition, key, value, headers in records:
        producer.produce(topic, value=value, key=key, partition=partition, headers=headers)
    assert producer.flush(30) == 0


def _txn_producer(bootstrap: str) -> Producer:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": unique("src-txn"),
                         "transaction.timeout.ms": 120_000})
    producer.init_transactions(30)
    return producer


def _transaction(producer: Producer, topic: str, values: list[tuple[int, bytes]], commit: bool | None) -> None:
    """One transaction of (partition, value); commit, abort, or leave open (None)."""
    producer.begin_transaction()
    for partition, value in values:
        producer.produce(topic, value=value, partition=partition)
    assert producer.flush(30) == 0
    if commit is True:
        producer.commit_transaction(30)
    elif commit is False:
        producer.abort_transaction(30)


def _ends(bootstrap: str, topic: str, partitions: int, committed: bool) -> dict[int, int]:
    """LSO (committed) or high watermark of each partition, from a plain consumer."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("ends"),
                         "isolation.level": "read_committed" if committed else "read_uncommitted"})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in range(partitions)}
    finally:
        consumer.close()


def _stream(spark, bootstrap: str, topic: str, **options: str):
    reader = (spark.readStream.format("onceflow-kafka")
              .option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic))
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def _batch(spark, bootstrap: str, topic: str, **options: str):
    reader = (spark.read.format("onceflow-kafka")
              .option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic))
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


class Collector:
    """foreachBatch target: keeps every micro-batch's rows on the driver, keyed by batch id
    like an idempotent sink would. A batch Spark runs again (stopped before its commit was
    logged) must bring exactly the same rows: `replays` records any difference."""

    def __init__(self, on_batch=None) -> None:
        self.by_id: dict[int, list[dict]] = {}
        self.replays: list[tuple[int, bool]] = []   # (batch id, same rows as before)
        self.on_batch = on_batch

    def __call__(self, frame, batch_id: int) -> None:
        rows = [row.asDict(recursive=True) for row in frame.collect()]
        if batch_id in self.by_id:
            self.replays.append((batch_id, self.by_id[batch_id] == rows))
        self.by_id[batch_id] = rows
        if self.on_batch is not None:
            self.on_batch(batch_id)

    @property
    def batches(self) -> list[tuple[int, list[dict]]]:
        return sorted(self.by_id.items())

    @property
    def rows(self) -> list[dict]:
        return [row for _, rows in self.batches for row in rows]

    def values(self) -> list[bytes]:
        return [row["value"] for row in self.rows]


def _start(frame, checkpoint: Path, collector: Collector, available_now: bool = False):
    writer = frame.writeStream.foreachBatch(collector).option("checkpointLocation", str(checkpoint))
    writer = writer.trigger(availableNow=True) if available_now else writer.trigger(processingTime="200 milliseconds")
    return writer.start()


def _run_available_now(frame, checkpoint: Path, collector: Collector | None = None) -> Collector:
    collector = collector or Collector()
    query = _start(frame, checkpoint, collector, available_now=True)
    assert query.awaitTermination(QUERY_TIMEOUT_S), f"availableNow query still running after {QUERY_TIMEOUT_S} s"
    return collector


def _checkpoint_end(checkpoint: Path) -> dict[str, dict[str, int]]:
    """The source position Spark logged for the newest planned micro-batch ({} if none)."""
    directory = checkpoint / "offsets"
    logged = sorted((int(entry.name), entry) for entry in directory.iterdir()
                    if entry.name.isdigit()) if directory.is_dir() else []
    return json.loads(logged[-1][1].read_text().splitlines()[-1]) if logged else {}


def _by_partition(rows: list[dict]) -> dict[int, list[tuple[int, bytes]]]:
    result: dict[int, list[tuple[int, bytes]]] = {}
    for row in rows:
        result.setdefault(row["partition"], []).append((row["offset"], row["value"]))
    return result


def _expected(bootstrap: str, topic: str) -> dict[int, list[tuple[int, bytes]]]:
    """What a plain read_committed consumer sees, per partition in offset order."""
    result: dict[int, list[tuple[int, bytes]]] = {}
    for message in read_committed(bootstrap, topic):
        result.setdefault(message.partition(), []).append((message.offset(), message.value()))
    return result


def _options(bootstrap: str, topic: str, **extra: str):
    return parse_options({"kafka.bootstrap.servers": bootstrap, "subscribe": topic, **extra})


# --- 1. content, order, schema --------------------------------------------------------------

KAFKA_COLUMNS = [("key", "binary"), ("value", "binary"), ("topic", "string"), ("partition", "int"),
                 ("offset", "bigint"), ("timestamp", "timestamp"), ("timestampType", "int")]
HEADERS_COLUMN = ("headers", "array<struct<key:string,value:binary>>")


def test_batch_and_stream_read_exact_content(spark, bootstrap, tmp_path):
    topic = create_topic(bootstrap, unique("src-content"), partitions=3)
    records = [(i % 3, f"k{i}".encode() if i % 4 else None, f"v{i}".encode(),
                [("h", f"x{i}".encode()), ("n", None)] if i % 2 else None) for i in range(30)]
    _produce(bootstrap, topic, records)
    consumer_view: dict[int, list] = {}
    for message in read_committed(bootstrap, topic):
        consumer_view.setdefault(message.partition(), []).append(message)

    with_headers = _batch(spark, bootstrap, topic, includeHeaders="true")
    assert [(f.name, f.dataType.simpleString()) for f in with_headers.schema] == KAFKA_COLUMNS + [HEADERS_COLUMN]
    batch_rows = [row.asDict(recursive=True) for row in with_headers.collect()]
    stream_rows = _run_available_now(_stream(spark, bootstrap, topic, includeHeaders="true",
                                             startingOffsets="earliest"), tmp_path / "ck").rows
    for rows in (batch_rows, stream_rows):
        assert len(rows) == len(records)
        for partition, messages in consumer_view.items():
            got = sorted((r for r in rows if r["partition"] == partition), key=lambda r: r["offset"])
            assert [r["offset"] for r in got] == [m.offset() for m in messages]
            for row, message in zip(got, messages):
                assert (row["key"], row["value"], row["topic"]) == (message.key(), message.value(), topic)
                assert round(row["timestamp"].timestamp() * 1000) == message.timestamp()[1]
                assert row["timestampType"] == 0   # CreateTime, as Kafka numbers it
                headers = [(h["key"], h["value"]) for h in row["headers"]] if row["headers"] else None
                assert headers == message.headers()
        # Per partition, rows arrive in offset order (one task reads one partition in order).
        for partition in consumer_view:
            offsets = [r["offset"] for r in rows if r["partition"] == partition]
            assert offsets == sorted(offsets)

    plain = _batch(spark, bootstrap, topic)
    assert [(f.name, f.dataType.simpleString()) for f in plain.schema] == KAFKA_COLUMNS
    assert plain.count() == len(records)


# --- 2. transactions: aborted, open, trailing markers ------------------------------------

def test_read_committed_with_open_aborted_and_trailing_transactions(spark, bootstrap, tmp_path):
    topic = create_topic(bootstrap, unique("src-txn"), partitions=2)
    txn = _txn_producer(bootstrap)
    _produce(bootstrap, topic, [(0, None, b"p0-a", None), (0, None, b"p0-b", None), (1, None, b"p1-a", None)])
    _transaction(txn, topic, [(0, b"c1-0"), (0, b"c1-1"), (1, b"c1-p1")], commit=True)
    _transaction(txn, topic, [(0, b"aborted-2-0"), (0, b"aborted-2-1")], commit=False)
    _produce(bootstrap, topic, [(0, None, b"p0-c", None)])
    _transaction(txn, topic, [(0, b"c3-0")], commit=None)          # stays open for now
    _produce(bootstrap, topic, [(0, None, b"p0-d", None), (1, None, b"p1-b", None)])
    lso_open = _ends(bootstrap, topic, 2, committed=True)
    assert lso_open[0] < _ends(bootstrap, topic, 2, committed=False)[0]

    collector = Collector()
    checkpoint = tmp_path / "live"
    query = _start(_stream(spark, bootstrap, topic, startingOffsets="earliest"), checkpoint, collector)
    try:
        before_open = {b"p0-a", b"p0-b", b"c1-0", b"c1-1", b"p0-c", b"p1-a", b"c1-p1", b"p1-b"}
        wait_for(lambda: before_open <= set(collector.values()), "rows up to the LSO", QUERY_TIMEOUT_S)
        wait_for(lambda: _checkpoint_end(checkpoint)[topic] == {"0": lso_open[0], "1": lso_open[1]},
                 "the query's position to reach the LSO", QUERY_TIMEOUT_S)
        time.sleep(1.0)   # a few more triggers: still nothing past the open transaction
        assert set(collector.values()) == before_open
        assert query.isActive

        txn.commit_transaction(30)
        wait_for(lambda: {b"c3-0", b"p0-d"} <= set(collector.values()), "rows of the committed txn",
                 QUERY_TIMEOUT_S)
        _transaction(txn, topic, [(0, b"aborted-4")], commit=False)   # the topic ends with a marker
        end = _ends(bootstrap, topic, 2, committed=False)
        wait_for(lambda: _checkpoint_end(checkpoint)[topic] == {"0": end[0], "1": end[1]},
                 "the position to pass the trailing abort marker", QUERY_TIMEOUT_S)
    finally:
        query.stop()
    expected = _expected(bootstrap, topic)
    assert _by_partition(collector.rows) == expected
    assert not [v for v in collector.values() if v.startswith(b"aborted")]

    # availableNow over the whole topic, with ranges cut inside aborted records and markers.
    ck = tmp_path / "now"
    rows = _run_available_now(_stream(spark, bootstrap, topic, startingOffsets="earliest",
                                      maxOffsetsPerTrigger="3"), ck).rows
    assert _by_partition(rows) == expected
    assert _checkpoint_end(ck)[topic] == {"0": end[0], "1": end[1]}
    assert _by_partition([row.asDict() for row in _batch(spark, bootstrap, topic).collect()]) == expected


# --- 3. starting offsets, admission control, availableNow ---------------------------------

def test_starting_offsets_json_stream_and_batch(spark, bootstrap, tmp_path):
    topic = create_topic(bootstrap, unique("src-start"), partitions=2)
    _produce(bootstrap, topic, [(i % 2, None, f"old{i}".encode(), None) for i in range(10)])

    json_start = json.dumps({topic: {"0": 3, "1": -2}})
    rows = _run_available_now(_stream(spark, bootstrap, topic, startingOffsets=json_start), tmp_path / "json").rows
    assert sorted((r["partition"], r["offset"]) for r in rows) == [(0, o) for o in range(3, 5)] + [(1, o) for o in range(5)]
    batch_rows = _batch(spark, bootstrap, topic, startingOffsets=json_start,
                        endingOffsets=json.dumps({topic: {"0": 4, "1": -1}})).collect()
    assert sorted((r.partition, r.offset) for r in batch_rows) == [(0, 3)] + [(1, o) for o in range(5)]



def test_latest_start_and_new_partitions_and_topics_from_earliest(spark, bootstrap, tmp_path):
    topic, later_topic = create_topic(bootstrap, unique("src-latest"), partitions=1), unique("src-later")
    _produce(bootstrap, topic, [(0, None, f"old{i}".encode(), None) for i in range(5)])
    collector = Collector()
    query = _start(_stream(spark, bootstrap, f"{topic},{later_topic}", startingOffsets="latest"),
                   tmp_path / "latest", collector)
    try:
        wait_for(lambda: query.lastProgress is not None, "the first trigger", QUERY_TIMEOUT_S)
        _produce(bootstrap, topic, [(0, None, f"new{i}".encode(), None) for i in range(3)])
        # A partition and a topic that appear while the query runs are read from offset 0.
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_partitions([NewPartitions(topic, 2)])[topic].result(15)
        create_topic(bootstrap, later_topic, partitions=1)
        _produce(bootstrap, topic, [(1, None, f"added{i}".encode(), None) for i in range(3)])
        _produce(bootstrap, later_topic, [(0, None, f"later{i}".encode(), None) for i in range(2)])
        wait_for(lambda: len(collector.rows) >= 8, "the new rows", QUERY_TIMEOUT_S)
        # reportLatestOffset feeds the progress report's latestOffset (lag display).
        wanted = {topic: {"0": 8, "1": 3}, later_topic: {"0": 2}}
        wait_for(lambda: json.loads(query.lastProgress["sources"][0]["latestOffset"] or "{}") == wanted,
                 "the reported latest offsets", QUERY_TIMEOUT_S)
        time.sleep(0.5)
    finally:
        query.stop()
    got = sorted((r["topic"], r["partition"], r["offset"], r["value"]) for r in collector.rows)
    assert got == sorted([(topic, 0, 5 + i, f"new{i}".encode()) for i in range(3)]
                         + [(topic, 1, i, f"added{i}".encode()) for i in range(3)]
                         + [(later_topic, 0, i, f"later{i}".encode()) for i in range(2)])


def test_max_offsets_per_trigger_and_available_now_target(spark, bootstrap, tmp_path):
    topic = create_topic(bootstrap, unique("src-limit"), partitions=2)
    # A skewed backlog: 17 records in partition 0, 6 in partition 1.
    _produce(bootstrap, topic, [(0 if i % 4 else 1, None, f"r{i}".encode(), None) for i in range(23)])
    target = _ends(bootstrap, topic, 2, committed=True)
    late = [(i % 2, None, f"late{i}".encode(), None) for i in range(4)]

    def produce_late(batch_id: int) -> None:   # after availableNow froze its target
        if batch_id == 0:
            _produce(bootstrap, topic, late)

    checkpoint = tmp_path / "ck"
    first = _run_available_now(_stream(spark, bootstrap, topic, startingOffsets="earliest",
                                       maxOffsetsPerTrigger="5"), checkpoint, Collector(produce_late))
    sizes = [len(rows) for _, rows in first.batches]
    assert len(sizes) >= 5 and all(size <= 5 for size in sizes), sizes
    assert sorted(first.values()) == sorted(f"r{i}".encode() for i in range(23))
    assert _checkpoint_end(checkpoint)[topic] == {"0": target[0], "1": target[1]}

    # The same checkpoint again: exactly the records that arrived after the frozen target.
    second = _run_available_now(_stream(spark, bootstrap, topic, maxOffsetsPerTrigger="5"), checkpoint)
    assert sorted(second.values()) == sorted(value for _, _, value, _ in late)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.integers(0, 6), st.tuples(st.integers(0, 50), st.integers(0, 200)), min_size=1),
       st.integers(1, 300))
def test_rate_limit_spreads_budget_within_limit(ranges, rows_max):
    start = {("t", p): begin for p, (begin, _) in ranges.items()}
    available = {("t", p): begin + size for p, (begin, size) in ranges.items()}
    end = rate_limit(start, available, rows_max)
    assert set(end) == set(available)
    assert all(start[tp] <= end[tp] <= available[tp] for tp in end)
    total = sum(available[tp] - start[tp] for tp in start)
    assert sum(end[tp] - start[tp] for tp in end) == min(total, rows_max)
    if rows_max >= len([tp for tp in start if available[tp] > start[tp]]):
        assert all(end[tp] > start[tp] for tp in start if available[tp] > start[tp])


# --- 4. restart from the checkpoint ---------------------------------------------------------

def test_restart_from_checkpoint_has_no_duplicates_or_gaps(spark, bootstrap, tmp_path):
    topic = create_topic(bootstrap, unique("src-restart"), partitions=2)
    _produce(bootstrap, topic, [(i % 2, None, f"a{i}".encode(), None) for i in range(12)])
    checkpoint, collector = tmp_path / "ck", Collector()
    query = _start(_stream(spark, bootstrap, topic, startingOffsets="earliest", maxOffsetsPerTrigger="4"),
                   checkpoint, collector)
    try:
        wait_for(lambda: len(collector.rows) >= 12, "the first rows", QUERY_TIMEOUT_S)
    finally:
        query.stop()
    _produce(bootstrap, topic, [(i % 2, None, f"b{i}".encode(), None) for i in range(9)])
    # startingOffsets only applies to a new checkpoint: "latest" here must not skip anything.
    _run_available_now(_stream(spark, bootstrap, topic, startingOffsets="latest"), checkpoint, collector)
    assert _by_partition(collector.rows) == _expected(bootstrap, topic)
    assert len(collector.rows) == 21
    assert all(same for _, same in collector.replays), collector.replays


# --- 5. errors -------------------------------------------------------------------------------

@pytest.mark.parametrize("options, message", [
    ({"kafka.bootstrap.servers": None}, "kafka.bootstrap.servers is required"),
    ({"subscribe": " , "}, "subscribe is required"),
    ({"startingOffsets": "{not json"}, "startingOffsets: expected 'earliest', 'latest' or JSON"),
    ({"startingOffsets": '{"other-topic": {"0": 1}}'}, "topic 'other-topic' is not in subscribe"),
    ({"startingOffsets": "latest", "batch": True}, "startingOffsets: 'latest' is not allowed"),
    ({"endingOffsets": "earliest", "batch": True}, "endingOffsets: 'earliest' is not allowed"),
    ({"endingOffsets": "latest"}, "endingOffsets is for batch queries only"),
    ({"kafka.auto.offset.reset": "earliest"}, "kafka.auto.offset.reset is not allowed"),
    ({"kafka.isolation.level": "serializable"}, "kafka.isolation.level must be one of"),
    ({"maxOffsetsPerTrigger": "-3"}, "maxOffsetsPerTrigger must be a positive integer"),
    ({"includeHeaders": "yes"}, "includeHeaders must be true or false"),
    ({"subscribePattern": "t.*"}, "subscribePattern is not supported"),
])
def test_bad_options_fail_with_a_clear_message(spark, bootstrap, options, message):
    options = dict(options)
    batch = options.pop("batch", False)
    given = {"kafka.bootstrap.servers": bootstrap, "subscribe": "some-topic", **options}
    reader = spark.read if batch else spark.readStream
    reader = reader.format("onceflow-kafka")
    for key, value in given.items():
        if value is not None:
            reader = reader.option(key, value)
    with pytest.raises(Exception, match=message):
        frame = reader.load()
        if batch:
            frame.collect()
        else:
            frame.writeStream.format("noop").trigger(availableNow=True).start().awaitTermination(30)


def test_json_offsets_must_name_existing_partitions(spark, bootstrap):
    topic = create_topic(bootstrap, unique("src-json"), partitions=2)
    with pytest.raises(Exception, match=rf"missing {topic}-1"):
        _batch(spark, bootstrap, topic, startingOffsets=json.dumps({topic: {"0": 0}})).collect()
    with pytest.raises(Exception, match=rf"partitions {topic}-7 do not exist"):
        _batch(spark, bootstrap, topic, startingOffsets=json.dumps({topic: {"0": 0, "1": 0, "7": 0}})).collect()


def test_empty_and_missing_topics_read_nothing(spark, bootstrap, tmp_path):
    empty, missing = create_topic(bootstrap, unique("src-empty"), partitions=2), unique("src-missing")
    assert _batch(spark, bootstrap, f"{empty},{missing}").collect() == []
    collector = _run_available_now(_stream(spark, bootstrap, f"{empty},{missing}", startingOffsets="earliest"),
                                   tmp_path / "ck")
    assert collector.rows == []


def test_deleted_offsets_fail_or_are_skipped(spark, bootstrap):
    topic = create_topic(bootstrap, unique("src-loss"), partitions=1)
    _produce(bootstrap, topic, [(0, None, f"v{i}".encode(), None) for i in range(10)])
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_records([TopicPartition(topic, 0, 4)]).values():
        future.result(15)
    start = json.dumps({topic: {"0": 0}})
    with pytest.raises(Exception, match="records were deleted before they were read"):
        _batch(spark, bootstrap, topic, startingOffsets=start).collect()
    rows = _batch(spark, bootstrap, topic, startingOffsets=start, failOnDataLoss="false").collect()
    assert sorted(r.offset for r in rows) == list(range(4, 10))

    # The executors' own check, for offsets deleted after the batch was planned.
    with pytest.raises(DataLossError, match=rf"{topic}-0 offsets \[0, 10\)"):
        list(read_range(_options(bootstrap, topic), KafkaRange(topic, 0, 0, 10)))
    skipped = list(read_range(_options(bootstrap, topic, failOnDataLoss="false"), KafkaRange(topic, 0, 0, 10)))
    assert [o for b in skipped for o in b.column("offset").to_pylist()] == list(range(4, 10))


# --- the executors' read loop on its own (no Spark) -----------------------------------------

def test_read_range_ends_on_markers_and_bounds_a_stalled_read(bootstrap):
    topic = create_topic(bootstrap, unique("src-range"), partitions=1)
    txn = _txn_producer(bootstrap)
    _produce(bootstrap, topic, [(0, b"k", b"plain", None)])
    _transaction(txn, topic, [(0, b"aborted-a"), (0, b"aborted-b")], commit=False)   # offsets 1-3
    _transaction(txn, topic, [(0, b"c-a")], commit=True)                            # offsets 4-5
    options = _options(bootstrap, topic)
    end = _ends(bootstrap, topic, 1, committed=True)[0]
    assert end == 6

    def offsets(start: int, stop: int) -> list[int]:
        began = time.monotonic()
        batches = list(read_range(options, KafkaRange(topic, 0, start, stop)))
        assert time.monotonic() - began < 5, "the read waited for offsets that are never delivered"
        return [o for batch in batches for o in batch.column("offset").to_pylist()]

    assert offsets(0, end) == [0, 4]       # ends on the commit marker at 5
    assert offsets(0, 3) == [0]            # ends inside the aborted transaction
    assert offsets(1, 4) == []             # aborted records and their abort marker only
    assert offsets(4, 5) == [4]
    uncommitted = _options(bootstrap, topic, **{"kafka.isolation.level": "read_uncommitted"})
    assert [o for b in read_range(uncommitted, KafkaRange(topic, 0, 0, end))
            for o in b.column("offset").to_pylist()] == [0, 1, 2, 4]

    _transaction(txn, topic, [(0, b"open")], commit=None)
    _produce(bootstrap, topic, [(0, None, b"after-open", None)])
    high = _ends(bootstrap, topic, 1, committed=False)[0]
    assert offsets(0, _ends(bootstrap, topic, 1, committed=True)[0]) == [0, 4]
    stalled = _options(bootstrap, topic, **{"kafkaConsumer.pollTimeoutMs": "1500"})
    with pytest.raises(TimeoutError, match=rf"{topic}-0 offsets \[4, {high}\) made no progress"):
        list(read_range(stalled, KafkaRange(topic, 0, 4, high)))
    txn.abort_transaction(30)
