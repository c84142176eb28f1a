"""The onceflow-db sink: Kafka -> SQLite / PostgreSQL exactly once, across driver kills and
replayed batches; upsert mode; option errors.

Every input record carries a unique id, so "exactly once" is checked as: the table holds
each id once (no duplicates) and every id (none missing).
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from onceflow import db
from onceflow.spark.checkpoint import read_offsets
from tests.postgres_fixture import postgres_url  # noqa: F401
from tests.spark.support import (
    DriverProcess,
    batches_committed,
    batches_started,
    create_topic,
    produce,
    unique,
)

DRIVER = Path(__file__).parent / "drivers_db" / "kafka_to_db.py"
UUID_DRIVER = Path(__file__).parent / "drivers_db" / "uuid_to_db.py"
KILLS = 3
DRIVER_FINISH_S = 300


def table_name(prefix: str) -> str:
    return unique(prefix).replace("-", "_")


def sqlite_url(directory: Path) -> str:
    return f"sqlite:///{directory / 'sink.db'}"  # the path is absolute: sqlite:////...


def ids_in(url: str, table: str) -> list[int]:
    with db.connect(url) as database:
        return sorted(int(row[0]) for row in database.query(f'SELECT id FROM "{table}"'))


def stream_to_db(spark, bootstrap: str, topic: str, url: str, table: str, checkpoint: Path,
                 transform=lambda frame: frame, output_mode: str = "append", **options: str):
    """Run a streaming query from `topic` into `table` until it has caught up."""
    frame = (spark.readStream.format("onceflow-kafka")
             .option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
             .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "100").load()
             .selectExpr("CAST(key AS STRING) AS k", "CAST(value AS STRING) AS id",
                         "partition AS part", "offset AS off"))
    writer = transform(frame).writeStream.outputMode(output_mode).format("onceflow-db") \
        .option("url", url).option("table", table)
    for name, value in options.items():
        writer = writer.option(name, value)
    query = writer.option("checkpointLocation", str(checkpoint)).start()
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    return query


@pytest.mark.slow
def test_kafka_to_sqlite_and_postgres_exactly_once_across_driver_kills(
        bootstrap, postgres_url, tmp_path):  # noqa: F811
    records = 1_200
    topic = create_topic(bootstrap, unique("db-sink-in"), partitions=3)
    produce(bootstrap, topic, [(f"k{i}".encode(), str(i).encode()) for i in range(records)])
    table = table_name("events")
    urls = [sqlite_url(tmp_path), postgres_url]
    checkpoints = tmp_path / "checkpoints"
    command = DriverProcess.python(DRIVER, bootstrap, topic, table, str(checkpoints), *urls)
    with DriverProcess(command, tmp_path / "driver.log") as driver:
        for kill in range(KILLS):
            checkpoint = checkpoints / str(kill % len(urls))  # alternate the interrupted query
            driver.start()
            # A batch planned after this start: the restarted driver has replayed the batch
            # the last kill interrupted and moved on.
            driver.wait_mid_batch(checkpoint, max(batches_started(checkpoint), default=-1))
            driver.kill()
        driver.start()
        assert driver.wait(DRIVER_FINISH_S) == 0, driver.tail()
    for url in urls:
        assert ids_in(url, table) == list(range(records)), f"{db.redact(url)}: not exactly once"
    assert all(len(batches_committed(checkpoints / str(i))) > KILLS for i in range(len(urls)))


class TablePoller:
    """Reads the target table's rows per Kafka partition every few milliseconds while a
    driver runs, each read one database transaction: what any reader could see."""

    def __init__(self, url: str, table: str) -> None:
        self.url, self.table = url, table
        self.snapshots: list[dict[int, int]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> TablePoller:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        with db.connect(self.url) as database:
            while not self._stop.wait(0.02):
                try:
                    with database.transaction():
                        rows = database.query(f'SELECT part, count(*) FROM "{self.table}" GROUP BY part')
                except Exception as exc:  # noqa: BLE001 - the table may not exist yet
                    self.errors.append(str(exc))
                    continue
                counts = {int(part): int(count) for part, count in rows}
                if not self.snapshots or self.snapshots[-1] != counts:
                    self.snapshots.append(counts)


def batch_ends(checkpoint: Path, topic: str) -> list[dict[int, int]]:
    """Each planned micro-batch's end offset per partition (the source's offsets/N)."""
    ends = [{}]
    for batch in sorted(int(p.name) for p in (checkpoint / "offsets").iterdir() if p.name.isdigit()):
        source = read_offsets(checkpoint, batch).source_offsets[0] or {}
        ends.append({int(part): int(offset) for part, offset in source.get(topic, {}).items()})
    return ends


@pytest.mark.slow
def test_batch_atomicity_with_uuid_repartitioning_across_driver_kills(
        bootstrap, postgres_url, tmp_path):  # noqa: F811
    """uuid() per row and repartition(3, uuid): a replayed batch computes other rows for
    other tasks. With atomicity=batch every input row is in the table once, and a reader
    only ever sees whole micro-batches: its per-partition counts always equal the end
    offsets of one planned batch (the topic's offsets start at 0, with no gaps)."""
    records = 1_200
    topic = create_topic(bootstrap, unique("db-uuid-in"), partitions=3)
    produce(bootstrap, topic, [(f"k{i}".encode(), str(i).encode()) for i in range(records)])
    table, checkpoint = table_name("uuid_batch"), tmp_path / "checkpoint"
    command = DriverProcess.python(UUID_DRIVER, bootstrap, topic, table, str(checkpoint), postgres_url)
    with TablePoller(postgres_url, table) as poller, \
            DriverProcess(command, tmp_path / "driver.log") as driver:
        for _ in range(KILLS):
            driver.start()
            driver.wait_mid_batch(checkpoint, max(batches_started(checkpoint), default=-1))
            driver.kill()
        driver.start()
        assert driver.wait(DRIVER_FINISH_S) == 0, driver.tail()
    assert ids_in(postgres_url, table) == list(range(records)), "not exactly once"
    ends = batch_ends(checkpoint, topic)
    whole = [{p: n for p, n in end.items() if n} for end in ends]
    partial = [seen for seen in poller.snapshots if seen not in whole]
    assert not partial, f"a reader saw part of a micro-batch: {partial[:3]} (batch ends {whole})"
    assert len(poller.snapshots) > 3, "the reader saw too few states to tell"
    with db.connect(postgres_url) as database:
        staged = database.query(f'SELECT count(*) FROM "{table}_onceflow_staging"')[0][0]
    assert staged == 0, "staged rows were left behind"


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_replayed_batch_is_skipped(spark, bootstrap, postgres_url, tmp_path,  # noqa: F811
                                   database):
    records = 200
    topic = create_topic(bootstrap, unique("db-replay-in"), partitions=2)
    produce(bootstrap, topic, [(f"k{i}".encode(), str(i).encode()) for i in range(records)])
    url = sqlite_url(tmp_path) if database == "sqlite" else postgres_url
    table, checkpoint = table_name("replay"), tmp_path / "checkpoint"
    stream_to_db(spark, bootstrap, topic, url, table, checkpoint)
    assert ids_in(url, table) == list(range(records))

    last = max(batches_committed(checkpoint))
    # As if the driver had died before writing commits/N (and Hadoop's checksum of it).
    (checkpoint / "commits" / str(last)).unlink()
    (checkpoint / "commits" / f".{last}.crc").unlink(missing_ok=True)
    replay = stream_to_db(spark, bootstrap, topic, url, table, checkpoint)

    replayed = [p for p in replay.recentProgress if p["batchId"] == last]
    assert replayed and replayed[0]["numInputRows"] > 0, "Spark did not replay the batch"
    assert last in batches_committed(checkpoint)
    assert ids_in(url, table) == list(range(records)), "the replayed batch was written again"


@pytest.mark.parametrize("atomicity", ["partition", "batch"])
@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_upsert_keeps_the_latest_value_per_key(
        spark, bootstrap, postgres_url, tmp_path, database, atomicity):  # noqa: F811
    keys, rounds = 7, 5
    topic = create_topic(bootstrap, unique("db-upsert-in"), partitions=2)
    produce(bootstrap, topic, [(f"k{i % keys}".encode(), str(i).encode())
                               for i in range(keys * rounds)])
    url = sqlite_url(tmp_path) if database == "sqlite" else postgres_url
    table = table_name("latest")
    stream_to_db(spark, bootstrap, topic, url, table, tmp_path / "checkpoint",
                 mode="upsert", keyColumns="k", atomicity=atomicity)
    with db.connect(url) as database_:
        rows = database_.query(f'SELECT k, id FROM "{table}"')
        if atomicity == "batch":   # published and emptied at each commit
            assert database_.query(f'SELECT count(*) FROM "{table}_onceflow_staging"') == [(0,)]
    # Each key's records stay in one Kafka partition, in order: the last one wins.
    expected = {f"k{k}": str(k + keys * (rounds - 1)) for k in range(keys)}
    assert dict(rows) == expected


def test_complete_mode_aggregation_upserts_the_totals(spark, bootstrap, tmp_path):
    keys, records = 4, 150  # two micro-batches: the totals are rewritten in place
    topic = create_topic(bootstrap, unique("db-totals-in"), partitions=2)
    produce(bootstrap, topic, [(f"k{i % keys}".encode(), str(i).encode()) for i in range(records)])
    url, table = sqlite_url(tmp_path), table_name("totals")
    stream_to_db(spark, bootstrap, topic, url, table, tmp_path / "checkpoint",
                 transform=lambda frame: frame.groupBy("k").agg({"id": "count"})
                 .withColumnRenamed("count(id)", "records"),
                 output_mode="complete", mode="upsert", keyColumns="k")
    with db.connect(url) as database:
        totals = dict(database.query(f'SELECT k, records FROM "{table}"'))
    assert totals == {f"k{k}": len(range(k, records, keys)) for k in range(keys)}


@pytest.mark.parametrize("atomicity", ["partition", "batch"])
def test_batch_write_appends_rows(spark, postgres_url, atomicity):  # noqa: F811
    table = table_name("batch")
    frame = spark.createDataFrame([(i, f"name-{i}", i / 4) for i in range(50)],
                                  "id long, name string, score double").repartition(3)
    for _ in range(2):
        frame.write.format("onceflow-db").option("url", postgres_url).option("table", table) \
            .option("atomicity", atomicity).mode("append").save()
    with db.connect(postgres_url) as database:
        rows = database.query(f'SELECT id, name, score FROM "{table}" ORDER BY id')
    assert rows == sorted([(i, f"name-{i}", i / 4) for i in range(50)] * 2)


@pytest.mark.parametrize(("options", "message"), [
    ({}, "needs option 'table'"),
    ({"table": "t", "url": "mysql://h/db"}, "unsupported database URL"),
    ({"table": "absent", "createTable": "false"}, "does not exist"),
])
def test_bad_options_fail_the_write_with_a_clear_error(spark, tmp_path, options, message):
    frame = spark.createDataFrame([(1, "a")], "id long, name string")
    writer = frame.write.format("onceflow-db").mode("append")
    writer = writer.option("url", sqlite_url(tmp_path))
    for name, value in options.items():
        writer = writer.option(name, value)
    with pytest.raises(Exception, match=message):
        writer.save()


@pytest.mark.parametrize(("options", "message"), [
    ({"table": "t", "mode": "merge"}, "mode='merge'"),
    ({"table": "t", "mode": "upsert"}, "needs option 'keyColumns'"),
    ({"table": "t", "mode": "upsert", "keyColumns": "id,nope"}, r"keyColumns \['nope'\]"),
    ({"table": "t", "keyColumns": "id"}, "only applies to mode 'upsert'"),
    ({"table": "t", "createTable": "maybe"}, "createTable='maybe'"),
    ({"table": "t", "url": "sqlite://relative.db"}, "bad SQLite URL"),
    ({"table": "t", "atomicity": "task"}, "atomicity='task': use one of partition, batch"),
    ({"table": "t", "stagingTable": "t"}, "stagingTable must name another table"),
])
def test_option_checks(options, message):
    from pyspark.sql.types import LongType, StructField, StructType

    from onceflow.spark.db_sink import SinkOptionError, sink_options

    schema = StructType([StructField("id", LongType())])
    with pytest.raises((SinkOptionError, db.DatabaseError), match=message):
        sink_options(options, schema)
    assert sink_options({"TABLE": "t", "Mode": "UPSERT", "keycolumns": " id "}, schema).key_columns \
        == ("id",)  # Spark's options are case-insensitive


def test_complete_output_mode_needs_upsert():
    from pyspark.sql.types import LongType, StructField, StructType

    from onceflow.spark.db_sink import DatabaseStreamWriter, SinkOptionError

    schema = StructType([StructField("id", LongType())])
    with pytest.raises(SinkOptionError, match="complete output mode needs mode 'upsert'"):
        DatabaseStreamWriter({"table": "t", "url": "sqlite:///never.db"}, schema, overwrite=True)


def test_overwrite_is_refused(spark, tmp_path):
    frame = spark.createDataFrame([(1, "a")], "id long, name string")
    with pytest.raises(Exception, match="does not overwrite"):
        frame.write.format("onceflow-db").option("url", sqlite_url(tmp_path)) \
            .option("table", "t").mode("overwrite").save()
