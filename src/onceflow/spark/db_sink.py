"""The `onceflow-db` sink: Spark rows into an SQLite or PostgreSQL table, exactly once.

Theory of operation. Spark runs a micro-batch as one write task per partition and may run
a task again: a task retried after a failure, a batch replayed after the driver restarts
from its checkpoint (Spark writes `offsets/N` when it plans batch N and `commits/N` when
the batch is done; a batch without `commits/N` runs again). Given the same input - the
Kafka source replays exactly the offsets recorded in `offsets/N` - a replayed task
recomputes the same rows, so it suffices to remember which tasks have written:

    one database transaction per task:
        claim the marker (query id, table, batch id, partition id) in `progressTable`
        marker already there -> a previous attempt committed: write nothing, drain the input
        otherwise            -> insert the rows, record their count in the marker, commit

The rows and the marker commit together or not at all, so every (batch, partition) is in
the table exactly once whatever crashes and replays happen. Claiming the marker *first*
also serializes two attempts running at the same time (speculation, a zombie executor):
PostgreSQL makes the second `INSERT ... ON CONFLICT DO NOTHING` wait for the first
transaction and then do nothing; SQLite's `BEGIN IMMEDIATE` serializes all writers anyway.
The query id is Spark's stable id for the checkpoint, so markers survive restarts.

This needs deterministic transformations between the source and the sink (the same
batch must produce the same rows per partition); a non-deterministic `rand()` or
`current_timestamp()` column is written as computed by the first successful attempt.

The driver's `commit(batch N)` deletes the markers of batches before N: once Spark
commits N-1 it never replays them. It is idempotent. Batch (non-streaming) writes are one
transaction per task without markers (Spark retries a failed batch job as a whole).

`atomicity=batch` (streaming) makes a micro-batch appear in one step and lifts the need
for deterministic transformations:

    each task attempt, one database transaction:
        insert its rows into the staging table, tagged (query id, batch id, partition id,
        attempt id - a fresh random id), and return the attempt id to the driver
    the driver's commit(messages, batch N), one database transaction:
        claim the batch marker (query id, table, N, partition -1)
        claimed      -> copy the rows of exactly the attempts in `messages` from staging
                        into the target
        already held -> a previous driver committed N and died before Spark logged it:
                        copy nothing
        delete staging rows of this query up to batch N (every attempt: failed ones, the
        dead driver's) and the markers of batches before N

Nothing of the batch is in the target until that one transaction commits, and the rows of
a replayed batch are the ones its first committed attempt set computed, whatever a
non-deterministic transformation or partitioning computes on the replay. The cost: every
row is written twice (staging, then target) and the driver's commit does the copy.

Aggregations in the update or complete output mode want mode=upsert on the grouping
columns; complete mode with append (the whole result appended every batch) is refused.

Options (case-insensitive):
  url            database URL (default `sqlite:///onceflow.db`, relative to each process's
                 working directory); see `onceflow.db`
  table          target table (required)
  mode           `append` (default) or `upsert` (insert or update by `keyColumns`)
  keyColumns     comma-separated key columns, required by (and only for) `upsert`
  createTable    `true` (default): create a missing table from the DataFrame's schema
  progressTable  marker table (default `onceflow_spark_progress`)
  atomicity      `partition` (default: each task commits its rows on its own) or `batch`
                 (streaming: a micro-batch appears in the target in one transaction)
  stagingTable   where `batch` tasks put their rows (default `<table>_onceflow_staging`)
"""

from __future__ import annotations

import dataclasses
import itertools
import uuid
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructField, StructType

from onceflow import db

DEFAULT_URL = "sqlite:///onceflow.db"
DEFAULT_PROGRESS_TABLE = "onceflow_spark_progress"
MODES = ("append", "upsert")
ATOMICITIES = ("partition", "batch")
STAGING_SUFFIX = "_onceflow_staging"
# The staging table's own columns, after the target's: which query, batch, task and attempt
# a row belongs to, and its position in the task's output (the last row of a key wins).
STAGE_COLUMNS = ("onceflow_query_id", "onceflow_batch_id", "onceflow_partition_id",
                 "onceflow_attempt", "onceflow_seq")
# Marker rows of whole batches (atomicity=batch) use this partition id.
BATCH_MARKER_PARTITION = -1
# Rows a task gathers before it opens its transaction. A partition no larger than this is
# written in one short transaction (SQLite's write lock is held only for the inserts); a
# larger one keeps the transaction open while it reads the rest of its input.
CHUNK_ROWS_MAX = 20_000

QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"


class SinkOptionError(ValueError):
    """An `onceflow-db` option is missing or wrong."""


@dataclasses.dataclass(frozen=True)
class SinkOptions:
    url: str
    table: str
    mode: str
    key_columns: tuple[str, ...]
    create_table: bool
    progress_table: str
    atomicity: str = "partition"
    staging_table: str = ""


def sink_options(options: Any, schema: StructType) -> SinkOptions:
    """Validate Spark's option map against the DataFrame's schema."""
    given = {str(k).lower(): str(v) for k, v in dict(options).items()}
    table = given.get("table", "").strip()
    if not table:
        raise SinkOptionError("onceflow-db needs option 'table' (the table to write to)")
    mode = given.get("mode", "append").strip().lower()
    if mode not in MODES:
        raise SinkOptionError(f"onceflow-db option mode='{mode}': use one of {', '.join(MODES)}")
    keys = tuple(k.strip() for k in given.get("keycolumns", "").split(",") if k.strip())
    if mode == "upsert" and not keys:
        raise SinkOptionError("onceflow-db mode 'upsert' needs option 'keyColumns' "
                              "(comma-separated key column names)")
    if mode == "append" and keys:
        raise SinkOptionError("onceflow-db option 'keyColumns' only applies to mode 'upsert'")
    missing = [k for k in keys if k not in schema.fieldNames()]
    if missing:
        raise SinkOptionError(f"onceflow-db keyColumns {missing} are not columns of the "
                              f"DataFrame ({', '.join(schema.fieldNames())})")
    create = given.get("createtable", "true").strip().lower()
    if create not in ("true", "false"):
        raise SinkOptionError(f"onceflow-db option createTable='{create}': use true or false")
    url = given.get("url", DEFAULT_URL)
    db.parse_url(url)  # a bad URL fails here, on the driver, before any task runs
    atomicity = given.get("atomicity", "partition").strip().lower()
    if atomicity not in ATOMICITIES:
        raise SinkOptionError(f"onceflow-db option atomicity='{atomicity}': use one of "
                              f"{', '.join(ATOMICITIES)}")
    staging = given.get("stagingtable", f"{table}{STAGING_SUFFIX}").strip()
    if staging == table:
        raise SinkOptionError("onceflow-db option stagingTable must name another table than 'table'")
    return SinkOptions(url, table, mode, keys, create == "true",
                       given.get("progresstable", DEFAULT_PROGRESS_TABLE).strip(),
                       atomicity, staging)


@dataclasses.dataclass
class DatabaseCommitMessage(WriterCommitMessage):
    """What one write task did, for the driver's commit."""

    query_id: str | None
    batch_id: int | None
    partition_id: int
    rows_written: int
    skipped: bool  # a previous attempt of this (batch, partition) had committed
    attempt: str | None = None  # atomicity=batch: the staged attempt's id (None: no rows)


def prepare_tables(options: SinkOptions, schema: StructType, streaming: bool) -> None:
    """Create the target and marker tables if asked to; check the target's columns."""
    with db.connect(options.url) as database, database.transaction():
        # Serializes drivers preparing the same table at once: PostgreSQL's CREATE TABLE IF
        # NOT EXISTS is not safe against a concurrent create of the same name.
        database.lock(f"table:{options.table}")
        if options.create_table:
            database.execute(db.create_table_sql(database.dialect, options.table,
                                                 schema.fields, options.key_columns))
        columns = database.table_columns(options.table)
        if not columns:
            raise SinkOptionError(f"table '{options.table}' does not exist in "
                                  f"{database.display} (and createTable is false)")
        missing = [name for name in schema.fieldNames() if name not in columns]
        if missing:
            raise SinkOptionError(f"table '{options.table}' in {database.display} has no "
                                  f"column(s) {missing}")
        if streaming:
            database.execute(_progress_table_sql(database.dialect, options.progress_table))
        if options.atomicity == "batch":
            _create_staging(database, options, schema)


def _create_staging(database: db.Database, options: SinkOptions, schema: StructType) -> None:
    """The staging table: the target's columns (no key, any may repeat) and STAGE_COLUMNS."""
    types = ("TEXT NOT NULL", "BIGINT NOT NULL", "INTEGER NOT NULL", "TEXT NOT NULL",
             "BIGINT NOT NULL")
    fields = [StructField(f.name, f.dataType, nullable=True) for f in schema.fields]
    database.execute(db.create_table_sql(
        database.dialect, options.staging_table, fields,
        extra_columns=[f"{name} {kind}" for name, kind in zip(STAGE_COLUMNS, types, strict=True)]))
    index = db.quote_identifier(f"{options.staging_table}_batch")
    database.execute(f"CREATE INDEX IF NOT EXISTS {index} ON "
                     f"{db.quote_identifier(options.staging_table)} "
                     f"(onceflow_query_id, onceflow_batch_id)")


def _progress_table_sql(dialect: db.Dialect, table: str) -> str:
    return (f"CREATE TABLE IF NOT EXISTS {db.quote_identifier(table)} ("
            f"query_id TEXT NOT NULL, sink_table TEXT NOT NULL, batch_id BIGINT NOT NULL, "
            f"partition_id INTEGER NOT NULL, rows_written BIGINT NOT NULL, "
            f"attempt INTEGER NOT NULL, "
            f"written_at {dialect.types['timestamp']} DEFAULT CURRENT_TIMESTAMP, "
            f"PRIMARY KEY (query_id, sink_table, batch_id, partition_id))")


class _RowWriter:
    """The part both writers share: options, schema, and writing rows in a transaction."""

    def __init__(self, options: Any, schema: StructType, streaming: bool) -> None:
        self.options = sink_options(options, schema)
        self.schema = schema
        prepare_tables(self.options, schema, streaming)

    def _chunks(self, batches: Iterator[Any], dialect: db.Dialect) -> Iterator[list[tuple]]:
        """Arrow record batches as lists of at most ~CHUNK_ROWS_MAX row tuples."""
        adapters = [db.value_adapter(dialect, field.dataType) for field in self.schema.fields]
        chunk: list[tuple] = []
        for batch in batches:
            columns = []
            for adapter, column in zip(adapters, batch.columns, strict=True):
                values = column.to_pylist()
                columns.append(values if adapter is None else [adapter(v) for v in values])
            chunk.extend(zip(*columns, strict=True))
            if len(chunk) >= CHUNK_ROWS_MAX:
                yield chunk
                chunk = []
        if chunk:
            yield chunk

    def _write(self, database: db.Database, chunks: Iterator[list[tuple]]) -> int:
        names, written = self.schema.fieldNames(), 0
        for chunk in chunks:
            if self.options.mode == "upsert":
                database.upsert_rows(self.options.table, names, self.options.key_columns, chunk)
            else:
                database.insert_rows(self.options.table, names, chunk)
            written += len(chunk)
        return written

    def _stage(self, marker: tuple, chunks: Iterator[list[tuple]]) -> DatabaseCommitMessage:
        """atomicity=batch: this attempt's rows into the staging table, tagged."""
        query_id, _table, batch_id, partition_id = marker
        attempt, seq = uuid.uuid4().hex, itertools.count()
        names = [*self.schema.fieldNames(), *STAGE_COLUMNS]
        written = 0
        with db.connect(self.options.url) as database, database.transaction():
            for chunk in chunks:
                database.insert_rows(self.options.staging_table, names,
                                     [(*row, query_id, batch_id, partition_id, attempt, next(seq))
                                      for row in chunk])
                written += len(chunk)
        return DatabaseCommitMessage(query_id, batch_id, partition_id, written, False, attempt)

    def _claim(self, database: db.Database, marker: tuple, attempt: int) -> bool:
        """Insert the marker unless it exists; False means a previous attempt committed."""
        table = db.quote_identifier(self.options.progress_table)
        cursor = database.execute(
            f"INSERT INTO {table} (query_id, sink_table, batch_id, partition_id, rows_written, "
            f"attempt) VALUES ({database.dialect.placeholders(6)}) ON CONFLICT DO NOTHING",
            (*marker, 0, attempt))
        return cursor.rowcount == 1

    def _record(self, database: db.Database, marker: tuple, written: int) -> None:
        p = database.dialect.placeholder
        database.execute(
            f"UPDATE {db.quote_identifier(self.options.progress_table)} SET rows_written = {p} "
            f"WHERE query_id = {p} AND sink_table = {p} AND batch_id = {p} "
            f"AND partition_id = {p}", (written, *marker))

    def _publish(self, database: db.Database, query_id: str, batch_id: int,
                 attempts: list[str], rows: int, once: bool = True) -> None:
        """Copy the chosen attempts' rows into the target - with `once`, only if the batch
        marker says no previous driver did - then empty the staging rows up to this batch."""
        p = database.dialect.placeholder
        marker = (query_id, self.options.table, batch_id, BATCH_MARKER_PARTITION)
        if (not once or self._claim(database, marker, 0)) and attempts:
            if once:
                self._record(database, marker, rows)
            database.execute(self._publish_sql(database.dialect, len(attempts)),
                             (query_id, batch_id, *attempts))
        database.execute(f"DELETE FROM {db.quote_identifier(self.options.staging_table)} "
                         f"WHERE onceflow_query_id = {p} AND onceflow_batch_id <= {p}",
                         (query_id, batch_id))

    def _publish_sql(self, dialect: db.Dialect, attempts: int) -> str:
        names = self.schema.fieldNames()
        columns = ", ".join(db.quote_identifier(n) for n in names)
        staged = (f"FROM {db.quote_identifier(self.options.staging_table)} "
                  f"WHERE onceflow_query_id = {dialect.placeholder} AND onceflow_batch_id = "
                  f"{dialect.placeholder} AND onceflow_attempt IN ({dialect.placeholders(attempts)})")
        if self.options.mode == "append":
            select = f"SELECT {columns} {staged}"
            return dialect.insert_select_sql(self.options.table, names, select)
        # Upsert: one row per key, the last one (highest partition, then position) wins,
        # as if the tasks' rows had been upserted one after another.
        keys = ", ".join(db.quote_identifier(k) for k in self.options.key_columns)
        ranked = (f"SELECT {columns}, ROW_NUMBER() OVER (PARTITION BY {keys} ORDER BY "
                  f"onceflow_partition_id DESC, onceflow_seq DESC) AS onceflow_rank {staged}")
        select = f"SELECT {columns} FROM ({ranked}) AS ranked WHERE onceflow_rank = 1"
        return dialect.insert_select_sql(self.options.table, names, select, self.options.key_columns)


class DatabaseStreamWriter(_RowWriter, DataSourceStreamArrowWriter):
    """Streaming writes: rows and marker in one transaction per task (module docstring)."""

    def __init__(self, options: Any, schema: StructType, overwrite: bool = False) -> None:
        # Spark asks for overwrite in the complete output mode: every batch is the whole
        # result again, which appended would pile up copy after copy.
        if overwrite and sink_options(options, schema).mode == "append":
            raise SinkOptionError("onceflow-db in the complete output mode needs mode 'upsert' "
                                  "with keyColumns (each batch rewrites the whole result)")
        super().__init__(options, schema, streaming=True)

    def write(self, iterator: Iterator[Any]) -> DatabaseCommitMessage:
        from pyspark import TaskContext

        context = TaskContext.get()
        query_id = context.getLocalProperty(QUERY_ID_PROPERTY)
        batch_text = context.getLocalProperty(BATCH_ID_PROPERTY)
        if not query_id or batch_text is None:
            raise RuntimeError("onceflow-db streaming write without a streaming query id "
                               "or batch id in the task's properties")
        marker = (query_id, self.options.table, int(batch_text), context.partitionId())
        dialect = db.parse_url(self.options.url).dialect
        chunks = self._chunks(iterator, dialect)
        first = next(chunks, None)
        if first is None:  # nothing to write, nothing to remember
            return DatabaseCommitMessage(query_id, marker[2], marker[3], 0, False)
        if self.options.atomicity == "batch":
            return self._stage(marker, itertools.chain([first], chunks))
        with db.connect(self.options.url) as database, database.transaction():
            claimed = self._claim(database, marker, context.attemptNumber())
            if claimed:
                written = self._write(database, itertools.chain([first], chunks))
                self._record(database, marker, written)
        if not claimed:
            for _ in chunks:  # a replay: consume the input Spark sends, write nothing
                pass
            return DatabaseCommitMessage(query_id, marker[2], marker[3], 0, True)
        return DatabaseCommitMessage(query_id, marker[2], marker[3], written, False)

    def commit(self, messages: list[DatabaseCommitMessage | None], batchId: int) -> None:
        """Forget the markers of batches Spark will never replay (idempotent); with
        atomicity=batch first move the batch's staged rows into the target."""
        query_ids = {m.query_id for m in messages if m is not None and m.query_id}
        if not query_ids:
            return
        p = db.parse_url(self.options.url).dialect.placeholder
        with db.connect(self.options.url) as database, database.transaction():
            for query_id in query_ids:
                if self.options.atomicity == "batch":
                    attempts = sorted({m.attempt for m in messages
                                       if m is not None and m.query_id == query_id and m.attempt})
                    self._publish(database, query_id, batchId, attempts,
                                  sum(m.rows_written for m in messages if m is not None))
                database.execute(
                    f"DELETE FROM {db.quote_identifier(self.options.progress_table)} "
                    f"WHERE query_id = {p} AND sink_table = {p} AND batch_id < {p}",
                    (query_id, self.options.table, batchId))

    def abort(self, messages: list[DatabaseCommitMessage | None], batchId: int) -> None:
        # Tasks that committed keep their rows and markers: the retried batch skips them.
        # (atomicity=batch: staged rows go at the next commit.)
        return None


class DatabaseBatchWriter(_RowWriter, DataSourceArrowWriter):
    """Batch writes: each task's rows in one transaction (no markers)."""

    def __init__(self, options: Any, schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise SinkOptionError("onceflow-db does not overwrite tables (it would empty the "
                                  "table apart from the transactions that fill it); empty the "
                                  "table yourself and use mode('append')")
        super().__init__(options, schema, streaming=False)
        # atomicity=batch: the job's rows are staged under this id (made on the driver,
        # shipped to the tasks with the writer) and published by commit().
        self.job_id = f"job-{uuid.uuid4().hex}"

    def write(self, iterator: Iterator[Any]) -> DatabaseCommitMessage:
        from pyspark import TaskContext

        dialect = db.parse_url(self.options.url).dialect
        written = 0
        chunks = self._chunks(iterator, dialect)
        first = next(chunks, None)
        if first is not None and self.options.atomicity == "batch":
            marker = (self.job_id, self.options.table, 0, TaskContext.get().partitionId())
            return self._stage(marker, itertools.chain([first], chunks))
        if first is not None:
            with db.connect(self.options.url) as database, database.transaction():
                written = self._write(database, itertools.chain([first], chunks))
        return DatabaseCommitMessage(None, None, TaskContext.get().partitionId(), written, False)

    def commit(self, messages: list[DatabaseCommitMessage | None]) -> None:
        """atomicity=batch: every task succeeded; their rows appear in one transaction."""
        if self.options.atomicity != "batch":
            return
        attempts = sorted({m.attempt for m in messages if m is not None and m.attempt})
        with db.connect(self.options.url) as database, database.transaction():
            self._publish(database, self.job_id, 0, attempts,
                          sum(m.rows_written for m in messages if m is not None), once=False)

    def abort(self, messages: list[DatabaseCommitMessage | None]) -> None:
        """atomicity=batch: the job failed; its staged rows go, nothing was published."""
        if self.options.atomicity != "batch":
            return
        with db.connect(self.options.url) as database, database.transaction():
            database.execute(f"DELETE FROM {db.quote_identifier(self.options.staging_table)} "
                             f"WHERE onceflow_query_id = {database.dialect.placeholder}",
                             (self.job_id,))
