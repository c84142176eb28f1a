"""Databases for pipelines and the outbox: one small layer over DB-API for SQLite and
PostgreSQL.

Theory of operation. Everything onceflow does with a database is "a few statements in
one transaction", so this module keeps the two dialects' differences in one place and
nothing else:

* URLs: `sqlite:///relative/path.db`, `sqlite:////absolute/path.db`, `sqlite:///:memory:`
  and `postgresql://user:password@host:port/dbname` (also `postgres://`, psycopg 3).
* Transactions: `Database.transaction()` is the only way to write. Outside it each
  statement commits on its own. SQLite's transaction starts with `BEGIN IMMEDIATE`, which
  takes the database's write lock up front: concurrent writers (Spark tasks, the outbox
  application) queue on the busy timeout instead of failing with "database is locked"
  when a reader upgrades to a writer, and the order in which writers commit is the order
  in which they took the lock. PostgreSQL transactions are psycopg's.
* SQL text: placeholders (`?` or `%s`), quoted identifiers, `INSERT ... ON CONFLICT`
  upserts (both dialects share that syntax), the bulk insert (PostgreSQL's `COPY`,
  SQLite's `executemany`), and the mapping from Spark's types to column types plus the
  adaptation of values that a dialect cannot store as they are (SQLite has no decimal,
  date, timestamp or JSON type: they are stored as exact text).

Spark's types are read by duck typing (`typeName()`), so importing this module needs
neither pyspark nor psycopg.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import datetime
import decimal
import hashlib
import json
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Self
from urllib.parse import urlsplit, urlunsplit

# How long an SQLite writer waits for another writer's transaction before giving up. A
# Spark task holds the lock while it streams its rows in, so this is generous.
SQLITE_BUSY_TIMEOUT_MS = 120_000
# How long connecting to a PostgreSQL server may take before we call it unreachable.
POSTGRES_CONNECT_TIMEOUT_S = 10
# Rows per `executemany` call: bounds the parameter lists held at once.
EXECUTEMANY_ROWS_MAX = 5_000

Adapter = Callable[[Any], Any]


class DatabaseError(Exception):
    """A database problem worth one clear sentence: a bad URL, an unreachable server, a
    table that cannot hold the rows."""


@dataclasses.dataclass(frozen=True)
class Dialect:
    """What differs between the SQL onceflow sends to SQLite and to PostgreSQL."""

    name: str
    placeholder: str
    types: dict[str, str]        # Spark typeName() -> column type
    json_type: str               # arrays, maps and structs are stored as JSON
    decimal_exact: bool          # False: decimals are stored as text to stay exact

    def placeholders(self, count: int) -> str:
        return ", ".join([self.placeholder] * count)

    def insert_sql(self, table: str, columns: Sequence[str]) -> str:
        names = ", ".join(quote_identifier(c) for c in columns)
        return (f"INSERT INTO {quote_identifier(table)} ({names}) "
                f"VALUES ({self.placeholders(len(columns))})")

    def upsert_sql(self, table: str, columns: Sequence[str], key_columns: Sequence[str]) -> str:
        """Insert, or update the non-key columns of the row with the same key."""
        return f"{self.insert_sql(table, columns)} {self._on_conflict(columns, key_columns)}"

    def insert_select_sql(self, table: str, columns: Sequence[str], select: str,
                          key_columns: Sequence[str] = ()) -> str:
        """INSERT INTO table (columns) <select>; with `key_columns` an upsert (`select` must
        end in a WHERE clause: SQLite needs one before ON CONFLICT)."""
        names = ", ".join(quote_identifier(c) for c in columns)
        sql = f"INSERT INTO {quote_identifier(table)} ({names}) {select}"
        return f"{sql} {self._on_conflict(columns, key_columns)}" if key_columns else sql

    @staticmethod
    def _on_conflict(columns: Sequence[str], key_columns: Sequence[str]) -> str:
        keys = ", ".join(quote_identifier(c) for c in key_columns)
        updates = [f"{quote_identifier(c)} = excluded.{quote_identifier(c)}"
                   for c in columns if c not in key_columns]
        action = f"DO UPDATE SET {', '.join(updates)}" if updates else "DO NOTHING"
        return f"ON CONFLICT ({keys}) {action}"

    def column_type(self, data_type: Any) -> str:
        """The column type for a Spark DataType (duck-typed: `typeName()`)."""
        name = data_type.typeName()
        if name == "decimal" and self.decimal_exact:
            return f"NUMERIC({data_type.precision}, {data_type.scale})"
        if name in ("array", "map", "struct"):
            return self.json_type
        if name not in self.types:
            raise DatabaseError(f"Spark type {data_type.simpleString()} has no {self.name} "
                                f"column type; cast the column (e.g. to string) first")
        return self.types[name]


_COMMON_TYPES = {"string": "TEXT", "char": "TEXT", "varchar": "TEXT", "void": "TEXT"}

SQLITE = Dialect(
    name="sqlite", placeholder="?", json_type="TEXT", decimal_exact=False,
    types={**_COMMON_TYPES, "binary": "BLOB", "boolean": "INTEGER", "byte": "INTEGER",
           "short": "INTEGER", "integer": "INTEGER", "long": "INTEGER", "float": "REAL",
           "double": "REAL", "decimal": "TEXT", "date": "TEXT", "timestamp": "TEXT",
           "timestamp_ntz": "TEXT"})

POSTGRESQL = Dialect(
    name="postgresql", placeholder="%s", json_type="JSONB", decimal_exact=True,
    types={**_COMMON_TYPES, "binary": "BYTEA", "boolean": "BOOLEAN", "byte": "SMALLINT",
           "short": "SMALLINT", "integer": "INTEGER", "long": "BIGINT", "float": "REAL",
           "double": "DOUBLE PRECISION", "date": "DATE", "timestamp": "TIMESTAMPTZ",
           "timestamp_ntz": "TIMESTAMP"})


def quote_identifier(name: str) -> str:
    """`name` as a quoted SQL identifier (both dialects use double quotes)."""
    if not name or "\x00" in name:
        raise DatabaseError(f"invalid SQL identifier {name!r}")
    return '"' + name.replace('"', '""') + '"'


# ---------------------------------------------------------------- URLs


@dataclasses.dataclass(frozen=True)
class Target:
    """A parsed database URL: the dialect and what to hand its driver."""

    dialect: Dialect
    location: str       # SQLite: a file path (or ":memory:"); PostgreSQL: the URL
    display: str        # the URL without its password, for messages


def parse_url(url: str) -> Target:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "sqlite":
        if parts.netloc or not parts.path.startswith("/") or parts.path == "/":
            raise DatabaseError(f"bad SQLite URL '{url}': use sqlite:///relative/path.db or "
                                f"sqlite:////absolute/path.db")
        return Target(SQLITE, parts.path[1:], url)
    if scheme in ("postgresql", "postgres"):
        return Target(POSTGRESQL, url, redact(url))
    raise DatabaseError(f"unsupported database URL '{redact(url)}': use sqlite:///path.db "
                        f"or postgresql://user:password@host:port/dbname")


def redact(url: str) -> str:
    """`url` with its password replaced by ***."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


# ---------------------------------------------------------------- connections


def connect(url: str, *, busy_timeout_ms: int = SQLITE_BUSY_TIMEOUT_MS) -> Database:
    """Open the database at `url`; DatabaseError with the reason when that fails."""
    target = parse_url(url)
    if target.dialect is SQLITE:
        return Database(_connect_sqlite(target, busy_timeout_ms), SQLITE, target.display)
    return Database(_connect_postgres(target), POSTGRESQL, target.display)


def _connect_sqlite(target: Target, busy_timeout_ms: int) -> sqlite3.Connection:
    path = target.location
    if path != ":memory:" and not Path(path).parent.is_dir():
        raise DatabaseError(f"cannot open {target.display}: directory "
                            f"'{Path(path).parent}' does not exist")
    try:
        # isolation_level=None: no implicit transactions; `transaction()` says BEGIN.
        raw = sqlite3.connect(path, timeout=busy_timeout_ms / 1000, isolation_level=None,
                              check_same_thread=False)
        # WAL: readers (the relay, `status`, tests) never block the writer, nor it them.
        raw.execute("PRAGMA journal_mode=WAL")
    except sqlite3.Error as exc:
        raise DatabaseError(f"cannot open {target.display}: {exc}") from None
    return raw


def _connect_postgres(target: Target) -> Any:
    try:
        import psycopg
    except ImportError:
        raise DatabaseError("PostgreSQL needs psycopg 3: pip install 'psycopg[binary]' "
                            "(part of onceflow's spark extra)") from None
    try:
        return psycopg.connect(target.location, autocommit=True,
                               connect_timeout=POSTGRES_CONNECT_TIMEOUT_S)
    except psycopg.Error as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DatabaseError(f"cannot connect to {target.display}: {reason}") from None


class Database:
    """One connection and its dialect. Writes go through `transaction()`."""

    def __init__(self, raw: Any, dialect: Dialect, display: str) -> None:
        self.raw = raw
        self.dialect = dialect
        self.display = display
        self.in_transaction = False

    @classmethod
    def wrap(cls, raw: Any) -> Database:
        """Use an application's own DB-API connection (sqlite3 or psycopg 3). An sqlite3
        connection must be in autocommit mode (isolation_level=None) for `transaction()`."""
        if isinstance(raw, sqlite3.Connection):
            return cls(raw, SQLITE, "sqlite (application connection)")
        if type(raw).__module__.startswith("psycopg"):
            return cls(raw, POSTGRESQL, "postgresql (application connection)")
        raise DatabaseError(f"cannot use a {type(raw).__name__}: onceflow works with "
                            f"sqlite3 and psycopg 3 connections")

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.raw.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Self]:
        """One transaction: committed when the block ends, rolled back on an exception."""
        if self.in_transaction:
            raise DatabaseError("transactions do not nest")
        self.in_transaction = True
        try:
            if self.dialect is SQLITE:
                with self._sqlite_transaction():
                    yield self
            else:
                with self.raw.transaction():
                    yield self
        finally:
            self.in_transaction = False

    @contextlib.contextmanager
    def _sqlite_transaction(self) -> Iterator[None]:
        self.raw.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.raw.execute("ROLLBACK")
            raise
        self.raw.execute("COMMIT")

    def lock(self, name: str) -> None:
        """Inside a transaction, hold the lock called `name` until it ends, so that writers
        taking it (schema creators, for instance) go one at a time. PostgreSQL: an advisory
        transaction lock. SQLite: nothing to do, `transaction()` already holds the write lock."""
        if not self.in_transaction:
            raise DatabaseError("lock() is held until the transaction ends: call it inside one")
        if self.dialect is POSTGRESQL:
            self.execute(f"SELECT pg_advisory_xact_lock({advisory_key(name)})")

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """Run one statement; returns the cursor (rowcount, fetchall)."""
        cursor = self.raw.cursor()
        if params:
            cursor.execute(sql, tuple(params))
        else:  # no parameters: psycopg then leaves a literal % in the SQL alone
            cursor.execute(sql)
        return cursor

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        return [tuple(row) for row in self.execute(sql, params).fetchall()]

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        cursor = self.raw.cursor()
        chunk: list[Sequence[Any]] = []
        for row in rows:
            chunk.append(row)
            if len(chunk) >= EXECUTEMANY_ROWS_MAX:
                cursor.executemany(sql, chunk)
                chunk = []
        if chunk:
            cursor.executemany(sql, chunk)

    def insert_rows(self, table: str, columns: Sequence[str],
                    rows: Iterable[Sequence[Any]]) -> None:
        """Append rows; PostgreSQL streams them with COPY (several times faster)."""
        if self.dialect is SQLITE:
            self.executemany(self.dialect.insert_sql(table, columns), rows)
            return
        names = ", ".join(quote_identifier(c) for c in columns)
        with self.raw.cursor().copy(f"COPY {quote_identifier(table)} ({names}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)

    def upsert_rows(self, table: str, columns: Sequence[str], key_columns: Sequence[str],
                    rows: Iterable[Sequence[Any]]) -> None:
        self.executemany(self.dialect.upsert_sql(table, columns, key_columns), rows)

    def table_exists(self, table: str) -> bool:
        if self.dialect is SQLITE:
            sql = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"
        else:
            sql = "SELECT 1 FROM pg_catalog.pg_tables WHERE tablename = %s " \
                  "AND schemaname = ANY(current_schemas(false))"
        return bool(self.query(sql, (table,)))

    def table_columns(self, table: str) -> list[str]:
        """The table's column names, in order; [] when there is no such table."""
        if self.dialect is SQLITE:
            return [row[1] for row in self.query(f"PRAGMA table_info({quote_identifier(table)})")]
        return [row[0] for row in self.query(
            "SELECT column_name FROM information_schema.columns WHERE table_name = %s "
            "AND table_schema = current_schema() ORDER BY ordinal_position", (table,))]


# ---------------------------------------------------------------- Spark rows


def advisory_key(name: str) -> int:
    """A PostgreSQL advisory lock key: a stable signed 64-bit number from a name."""
    digest = hashlib.sha256(f"onceflow:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def create_table_sql(dialect: Dialect, table: str, fields: Sequence[Any],
                     key_columns: Sequence[str] = (), extra_columns: Sequence[str] = ()) -> str:
    """CREATE TABLE IF NOT EXISTS for Spark StructFields (name, dataType, nullable), plus
    `extra_columns` given as SQL column definitions."""
    columns = []
    for field in fields:
        null = "" if field.nullable and field.name not in key_columns else " NOT NULL"
        column_type = dialect.column_type(field.dataType)
        columns.append(f"{quote_identifier(field.name)} {column_type}{null}")
    columns.extend(extra_columns)
    if key_columns:
        columns.append(f"PRIMARY KEY ({', '.join(quote_identifier(c) for c in key_columns)})")
    return f"CREATE TABLE IF NOT EXISTS {quote_identifier(table)} ({', '.join(columns)})"


def value_adapter(dialect: Dialect, data_type: Any) -> Adapter | None:
    """How to turn a Python value of `data_type` (as Arrow's `to_pylist` gives it) into one
    the driver stores; None when it stores the value as it is."""
    name = data_type.typeName()
    if name in ("array", "map", "struct"):
        to_json = _map_to_json if name == "map" else _to_json
        if dialect is POSTGRESQL:
            from psycopg.types.json import Jsonb

            return lambda v: None if v is None else Jsonb(to_json(v), dumps=_json_text_identity)
        return to_json
    if dialect is POSTGRESQL:
        return None
    if name == "decimal":
        return lambda v: None if v is None else str(v)
    if name in ("date", "timestamp", "timestamp_ntz"):
        return lambda v: None if v is None else v.isoformat()
    return None


def _json_text_identity(text: str) -> str:
    return text


def _to_json(value: Any) -> str | None:
    if value is None:
        return None
    return json.dumps(value, default=_json_default, separators=(",", ":"))


def _map_to_json(value: Any) -> str | None:
    # Arrow gives a map as a list of (key, value) pairs; JSON objects need string keys.
    if value is None:
        return None
    return _to_json({str(k): v for k, v in value})


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime.date | datetime.datetime):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode("ascii")
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
