"""The exactly-once onceflow-kafka sink: real broker, real Spark (local[2]) queries from the
onceflow-kafka source, real confluent-kafka readers.

What the tests expect comes from what they produced (every input record carries a unique id)
and what a plain read_committed consumer sees, never from the sink under test.
"""

from __future__ import annotations

import json
import random
import re
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, ConfigResource
from pyspark.sql.types import IntegerType, StringType, StructType

from onceflow.broker.embedded import Broker
from onceflow.spark import progress
from onceflow.spark.kafka_sink import (
    SinkError,
    TransactionalWriter,
    close_cached_clients,
    progress_log,
    write_exactly_once,
)
from onceflow.spark.kafka_sink_options import SinkOptionError, parse_options, row_layout
from onceflow.spark.progress import ProgressRecord
from tests.spark.support import (
    DriverProcess,
    batches_committed,
    create_topic,
    read_committed,
    unique,
    wait_for,
)

QUERY_TIMEOUT_S = 120
DRIVER = Path(__file__).parent / "drivers" / "kafka_to_kafka.py"


# --- helpers ---------------------------------------------------------------------------------

def _produce_ids(bootstrap: str, topic: str, count: int, partitions: int) -> dict[str, tuple]:
    """`count` records `id-NNNNNN` with a key and a header, round robin over the partitions;
    returns {id: (key, headers)}."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "linger.ms": 5})
    sent = {}
    for i in range(count):
        record_id, key = f"id-{i:06d}", f"key-{i % 97}".encode()
        headers = [("n", str(i).encode()), ("tag", b"t" * (i % 3))]
        producer.produce(topic, record_id.encode(), key, partition=i % partitions, headers=headers)
        producer.poll(0)
        sent[record_id] = (key, headers)
    assert producer.flush(30) == 0
    return sent


def _source(spark, bootstrap: str, topic: str, per_trigger: int):
    return (spark.readStream.format("onceflow-kafka")
            .option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
            .option("startingOffsets", "earliest").option("includeHeaders", "true")
            .option("maxOffsetsPerTrigger", str(per_trigger)).load())


def _copied(frame):
    """The transformation under test: key and headers kept, the value marked."""
    return frame.selectExpr("key", "concat(CAST(value AS STRING), '|copied') AS value", "headers")


def _run_available_now(frame, bootstrap: str, output: str, checkpoint: Path, **options: str):
    writer = (frame.writeStream.format("onceflow-kafka")
              .option("kafka.bootstrap.servers", bootstrap).option("topic", output)
              .option("checkpointLocation", str(checkpoint)))
    for key, value in options.items():
        writer = writer.option(key, value)
    query = writer.trigger(availableNow=True).start()
    assert query.awaitTermination(QUERY_TIMEOUT_S), f"query still running after {QUERY_TIMEOUT_S} s"
    assert query.exception() is None, query.exception()
    return query


def _output_ids(records: list) -> Counter:
    ids: Counter = Counter()
    for record in records:
        value = record.value().decode()
        assert value.endswith("|copied"), value
        ids[value.removesuffix("|copied")] += 1
    return ids


def _progress_of(bootstrap: str, topic: str, query_id: str) -> list[ProgressRecord]:
    """The query's committed progress records, by (batch, partition): records of different
    progress-topic partitions arrive in no fixed order."""
    records = [ProgressRecord.decode(r.value()) for r in read_committed(bootstrap, topic)
               if r.key().decode().startswith(f"{query_id}/")]
    return sorted(records, key=lambda p: (p.batch, p.partition, p.time_ms))


def _values_batch(values: list[str]) -> pa.RecordBatch:
    return pa.record_batch([pa.array(values, pa.string())], names=["value"])


# --- 1. streaming Kafka -> Kafka ---------------------------------------------------------------

def test_stream_writes_every_input_once_with_keys_and_headers(spark, bootstrap, tmp_path):
    source = create_topic(bootstrap, unique("sink-in"), partitions=3)
    output = create_topic(bootstrap, unique("sink-out"), partitions=2)
    sent = _produce_ids(bootstrap, source, 3_000, partitions=3)
    query = _run_available_now(_copied(_source(spark, bootstrap, source, per_trigger=700)),
                               bootstrap, output, tmp_path / "ck")
    assert len(batches_committed(tmp_path / "ck")) >= 4  # several micro-batches, not one
    records = read_committed(bootstrap, output)
    assert _output_ids(records) == Counter(list(sent))  # every id, exactly once
    for record in records:
        key, headers = sent[record.value().decode().removesuffix("|copied")]
        assert record.key() == key
        assert record.headers() == headers
    assert sum(p["numInputRows"] for p in query.recentProgress) == len(sent)


# --- 2. a replayed batch is skipped -------------------------------------------------------------

def test_replayed_batch_is_skipped_not_written_again(spark, bootstrap, tmp_path):
    source = create_topic(bootstrap, unique("sink-in"), partitions=2)
    output = create_topic(bootstrap, unique("sink-out"), partitions=2)
    progress_topic = unique("progress")
    sent = _produce_ids(bootstrap, source, 1_200, partitions=2)
    checkpoint = tmp_path / "ck"
    first = _run_available_now(_copied(_source(spark, bootstrap, source, per_trigger=400)),
                               bootstrap, output, checkpoint, progressTopic=progress_topic)
    last = max(batches_committed(checkpoint))
    assert last >= 2
    before = read_committed(bootstrap, output)
    assert _output_ids(before) == Counter(list(sent))
    progress_before = _progress_of(bootstrap, progress_topic, first.id)
    # One committed record per (write partition, batch): the tasks' transactions.
    assert sorted((p.batch, p.partition) for p in progress_before) == \
        sorted({(p.batch, p.partition) for p in progress_before})
    assert {p.batch for p in progress_before} == set(range(last + 1))

    # What a driver crash between the tasks' commits and Spark's commit log leaves behind.
    (checkpoint / "commits" / str(last)).unlink()
    (checkpoint / "commits" / f".{last}.crc").unlink(missing_ok=True)  # Hadoop's checksum file
    second = _run_available_now(_copied(_source(spark, bootstrap, source, per_trigger=400)),
                                bootstrap, output, checkpoint, progressTopic=progress_topic)
    assert second.id == first.id
    replayed = [p for p in second.recentProgress if p["batchId"] == last]
    assert replayed and replayed[0]["numInputRows"] > 0, second.recentProgress  # it did run
    assert last in batches_committed(checkpoint)
    after = read_committed(bootstrap, output)
    assert _output_ids(after) == Counter(list(sent))  # no duplicates
    assert sorted(r.value() for r in after) == sorted(r.value() for r in before)
    # Every partition of the replayed batch was skipped: no new transaction, no new record.
    assert _progress_of(bootstrap, progress_topic, first.id) == progress_before
    # The sink created its progress topic on first use: compacted, default partition count.
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ConfigResource.Type.TOPIC, progress_topic)
    config = admin.describe_configs([resource])[resource].result(10)
    assert config["cleanup.policy"].value == "compact"
    topic = admin.list_topics(progress_topic, timeout=10).topics[progress_topic]
    assert len(topic.partitions) == progress.DEFAULT_PARTITIONS


# --- 3. zombie fencing -----------------------------------------------------------------------------

@pytest.fixture
def in_process_sink():
    """The sink's task code run in this process: close the clients it keeps afterwards."""
    yield
    close_cached_clients()


def test_zombie_attempt_is_fenced_and_its_rows_never_visible(bootstrap, in_process_sink):
    output = create_topic(bootstrap, unique("sink-out"), partitions=1)
    options = parse_options({"kafka.bootstrap.servers": bootstrap, "topic": output,
                             "progressTopic": unique("progress")})
    layout = row_layout(StructType().add("value", StringType()), options.topic)
    query, partition, batch = unique("query"), 0, 7
    transactional_id = f"{options.transactional_id_prefix}-{query}-{partition}"
    newer_values = [f"newer-{i}" for i in range(50)]
    newer: list = []
    zombie = TransactionalWriter(options, transactional_id)

    def zombie_rows():
        yield _values_batch([f"zombie-{i}" for i in range(50)])
        # Meanwhile Spark has given up on the zombie: a newer attempt of the same partition
        # and batch initialises the same transactional id and commits.
        newer.append(write_exactly_once(options, layout, query, partition, batch,
                                        iter([_values_batch(newer_values)])))
        yield _values_batch([f"zombie-{i}" for i in range(50, 100)])

    def progress_record(rows: int) -> ProgressRecord:
        return ProgressRecord(query, partition, batch, rows, int(time.time() * 1000),
                              transactional_id)

    with pytest.raises(SinkError, match="fenced"):
        zombie.write(layout, zombie_rows(), progress_record)
    assert newer[0].outcome == "written" and newer[0].rows == len(newer_values)
    assert sorted(r.value().decode() for r in read_committed(bootstrap, output)) == \
        sorted(newer_values)
    latest = progress_log(options).latest(query, partition, stable_timeout_ms=30_000)
    assert (latest.batch, latest.records) == (batch, len(newer_values))
    # And a third attempt of that batch (a replay) finds it committed and skips it.
    again = write_exactly_once(options, layout, query, partition, batch,
                               iter([_values_batch(["late"])]))
    assert again.outcome == "skipped"
    assert len(read_committed(bootstrap, output)) == len(newer_values)


# --- 4. driver SIGKILL x 3 ---------------------------------------------------------------------------

def _query_id(checkpoint: Path) -> str:
    return json.loads((checkpoint / "metadata").read_text())["id"]


def _batches_with_progress(bootstrap: str, query_id: str) -> set[int]:
    """Batches of which at least one write task has committed (read_committed)."""
    return {p.batch for p in _progress_of(bootstrap, progress.DEFAULT_TOPIC, query_id)}


@pytest.mark.slow
def test_driver_killed_three_times_mid_batch_output_exactly_once(bootstrap, tmp_path):
    source = create_topic(bootstrap, unique("sink-kill-in"), partitions=4)
    output = create_topic(bootstrap, unique("sink-kill-out"), partitions=3)
    sent = _produce_ids(bootstrap, source, 20_000, partitions=4)
    checkpoint = tmp_path / "ck"
    command = DriverProcess.python(DRIVER, bootstrap, source, output, str(checkpoint))
    with DriverProcess(command, tmp_path / "driver.log") as driver:
        kills: list[tuple[int, bool]] = []  # (batch in flight, replayed with committed tasks)
        for round_index in range(3):
            driver.start()
            batch = driver.wait_mid_batch(checkpoint, kills[-1][0] if kills else -1, 180)
            if round_index == 1:  # anywhere in the batch
                time.sleep(random.uniform(0.0, 1.0))
            else:  # just after the first of its tasks committed: Spark will replay the batch
                query_id = _query_id(checkpoint)
                wait_for(lambda b=batch, q=query_id: b in _batches_with_progress(bootstrap, q),
                         f"a task of batch {batch} to commit", timeout_s=120, poll_s=0.02)
            driver.kill()
            replayed = (batch not in batches_committed(checkpoint)
                        and batch in _batches_with_progress(bootstrap, _query_id(checkpoint)))
            kills.append((batch, replayed))
        driver.start()
        assert driver.wait(timeout_s=240) == 0, driver.tail()
    ids = _output_ids(read_committed(bootstrap, output))
    assert set(ids) == set(sent), f"missing {len(set(sent) - set(ids))}; log:\n{driver.tail()}"
    duplicated = {i: n for i, n in ids.items() if n > 1}
    assert not duplicated, f"{len(duplicated)} ids written more than once; kills: {kills}"
    assert len(batches_committed(checkpoint)) >= 10  # 20k records, 1500 per trigger
    # A batch killed after some of its tasks committed was replayed, and those partitions
    # were skipped - which the driver logs.
    log = (tmp_path / "driver.log").read_text(errors="replace")
    for batch, replayed in kills:
        if replayed:
            assert re.search(rf"onceflow-kafka batch {batch}: .* partitions skipped", log), kills


# --- 5. at-least-once mode and batch writes ----------------------------------------------------------

def test_at_least_once_mode_writes_everything(spark, bootstrap, tmp_path):
    source = create_topic(bootstrap, unique("sink-in"), partitions=2)
    output = create_topic(bootstrap, unique("sink-out"), partitions=2)
    progress_topic = unique("progress")
    sent = _produce_ids(bootstrap, source, 1_000, partitions=2)
    _run_available_now(_copied(_source(spark, bootstrap, source, per_trigger=300)),
                       bootstrap, output, tmp_path / "ck", exactlyOnce="false",
                       progressTopic=progress_topic)
    # No kills, no retries: every id once (at least once would allow more).
    assert _output_ids(read_committed(bootstrap, output)) == Counter(list(sent))
    topics = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics
    assert progress_topic not in topics  # no transactions, no progress records


def test_batch_write_routes_rows_by_topic_and_partition_columns(spark, bootstrap):
    first = create_topic(bootstrap, unique("sink-a"), partitions=3)
    second = create_topic(bootstrap, unique("sink-b"), partitions=2)
    rows = [(f"k{i}", f"v{i}", first if i % 2 else second, i % 2, [("i", str(i).encode())])
            for i in range(200)]
    frame = spark.createDataFrame(
        rows, "key string, value string, topic string, partition int, "
              "headers array<struct<key:string,value:binary>>").repartition(4)
    (frame.write.format("onceflow-kafka").option("kafka.bootstrap.servers", bootstrap)
     .mode("append").save())
    written = {(r.topic(), r.partition(), r.key().decode(), r.value().decode(), tuple(r.headers()))
               for topic in (first, second) for r in read_committed(bootstrap, topic)}
    assert written == {(t, p, k, v, tuple(h)) for k, v, t, p, h in rows}
    assert len(read_committed(bootstrap, first)) + len(read_committed(bootstrap, second)) == 200


# --- 6. errors ------------------------------------------------------------------------------------------

def _value_and(*fields) -> StructType:
    schema = StructType().add("value", StringType())
    for name, data_type in fields:
        schema = schema.add(name, data_type)
    return schema


@pytest.mark.parametrize("options, message", [
    ({"kafka.bootstrap.servers": None}, "kafka.bootstrap.servers is required"),
    ({"kafka.transactional.id": "mine"}, "kafka.transactional.id is not allowed"),
    ({"kafka.enable.idempotence": "false"}, "enable.idempotence=false is not allowed"),
    ({"kafka.acks": "1"}, "kafka.acks=1 is not allowed"),
    ({"kafka.value.serializer": "x"}, "kafka.value.serializer is not allowed"),
    ({"exactlyOnce": "maybe"}, "exactlyOnce must be true or false"),
    ({"kafka.transaction.timeout.ms": "soon"}, "kafka.transaction.timeout.ms must be an integer"),
    ({"progressTopicPartitions": "0"}, "progressTopicPartitions must be an integer >= 1"),
    ({"transactionalIdPrefix": " "}, "transactionalIdPrefix must not be empty"),
    ({"progresTopic": "typo"}, "unknown option"),
])
def test_bad_options_are_refused_with_a_clear_message(options, message):
    given = {"kafka.bootstrap.servers": "127.0.0.1:1", "topic": "t", **options}
    with pytest.raises(SinkOptionError, match=message):
        parse_options({k: v for k, v in given.items() if v is not None})


def test_at_least_once_mode_may_turn_idempotence_off():
    options = parse_options({"kafka.bootstrap.servers": "h:1", "topic": "t", "exactlyOnce": "false",
                             "kafka.enable.idempotence": "false", "kafka.linger.ms": "5"})
    assert not options.exactly_once
    assert options.kafka == {"enable.idempotence": "false", "linger.ms": "5"}


@pytest.mark.parametrize("schema, topic, message", [
    (StructType().add("key", StringType()), "t", "needs a 'value' column"),
    (_value_and(), None, "no topic to write to"),
    (StructType().add("value", IntegerType()), "t", "column value must be string or binary"),
    (_value_and(("partition", StringType())), "t", "column partition must be int"),
    (_value_and(("headers", StringType())), "t", "array<struct<key:string,value:binary>>"),
])
def test_bad_columns_are_refused_with_a_clear_message(schema, topic, message):
    with pytest.raises(SinkOptionError, match=message):
        row_layout(schema, topic)


def test_errors_surface_when_the_query_starts(spark, bootstrap, tmp_path):
    frame = spark.readStream.format("rate").load().selectExpr("CAST(value AS STRING) AS key")
    with pytest.raises(Exception, match="needs a 'value' column"):
        (frame.writeStream.format("onceflow-kafka").option("kafka.bootstrap.servers", bootstrap)
         .option("topic", "t").option("checkpointLocation", str(tmp_path / "ck")).start()
         .awaitTermination(30))
    batch = spark.createDataFrame([("v",)], "value string")
    with pytest.raises(Exception, match="kafka.transactional.id is not allowed"):
        (batch.write.format("onceflow-kafka").option("kafka.bootstrap.servers", bootstrap)
         .option("topic", "t").option("kafka.transactional.id", "x").mode("append").save())


def test_transaction_timeout_above_the_brokers_maximum_is_explained():
    with Broker(transaction_max_timeout_ms=5_000) as broker:
        options = parse_options({"kafka.bootstrap.servers": broker.bootstrap_servers,
                                 "topic": "t", "kafka.transaction.timeout.ms": "60000"})
        with pytest.raises(SinkError, match="must not exceed the broker's transaction.max"):
            TransactionalWriter(options, unique("txn"))
