"""The outbox table: created once, written by applications inside their own transactions,
read by the relay in sequence order.

Layout (one table per outbox, default `onceflow_outbox`):

    seq         the position in the outbox; strictly increasing in commit order (see below)
    topic       Kafka topic of the record
    key, value  bytes (NULL allowed: no key / a tombstone)
    headers     JSON list of [name, value-text] pairs, or NULL
    created_at  when the row was written

plus `<table>_meta` holding the outbox's random id, which the relay writes into its
progress records so that a relay pointed at another database with the same name is
refused instead of skipping that database's rows.

Why `seq` follows commit order. The relay publishes `seq >= next` and then advances
`next`; that is only correct if no row can appear later *below* a sequence number it has
already passed. In PostgreSQL a sequence value is taken when the row is inserted but
becomes visible when the transaction commits, so a transaction that took 7 can commit after
one that took 8 - and a relay that published 8 would never look at 7 again. onceflow closes
that gap at the source: a `BEFORE INSERT` trigger takes a transaction-scoped advisory lock
(`pg_advisory_xact_lock`, one per outbox) and only then assigns `seq := nextval(...)`. The
lock is held until the writing transaction ends, so transactions that write outbox rows
take their numbers and commit one after the other: every committed row has a smaller seq
than any row still in flight, and a row that commits later always lands above what the
relay has seen. The trigger does it for every insert, through `publish()` or plain SQL.
The price: writers of one outbox serialize from their first outbox row to their commit, so
write the outbox row last, just before committing. Rolled-back transactions leave gaps in
seq; gaps are harmless (`seq >= next` steps over them).

SQLite needs no trigger: it has one writer at a time (`BEGIN IMMEDIATE` in
`onceflow.db`), and `AUTOINCREMENT` numbers rows under that lock, never reusing a number.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from onceflow import db

DEFAULT_TABLE = "onceflow_outbox"
OUTBOX_ID_KEY = "outbox_id"
# A bound on one read of the relay (rows are held in memory and in one Kafka transaction).
ROWS_PER_READ_MAX = 10_000

Headers = Mapping[str, str | bytes | None] | Iterable[tuple[str, str | bytes | None]]


class OutboxError(Exception):
    """Misuse of the outbox (publishing outside a transaction, a missing table, ...)."""


@dataclasses.dataclass(frozen=True)
class OutboxRow:
    seq: int
    topic: str
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


def _names(table: str) -> dict[str, str]:
    return {"table": db.quote_identifier(table), "meta": db.quote_identifier(f"{table}_meta"),
            "sequence": db.quote_identifier(f"{table}_seq"),
            "function": db.quote_identifier(f"{table}_assign_seq"),
            "trigger": db.quote_identifier(f"{table}_assign_seq")}


def lock_name(table: str) -> str:
    """The name of an outbox's lock (`Database.lock`, and the trigger's advisory lock)."""
    return f"outbox:{table}"


def create_outbox(database: db.Database, table: str = DEFAULT_TABLE) -> str:
    """Create the outbox (idempotent, safe to run concurrently); returns its outbox id."""
    n = _names(table)
    with database.transaction():
        # Serializes concurrent creators: CREATE OR REPLACE FUNCTION races otherwise.
        database.lock(lock_name(table))
        if database.dialect is db.POSTGRESQL:
            for statement in _postgres_ddl(table, n):
                database.execute(statement)
        else:
            database.execute(
                f"CREATE TABLE IF NOT EXISTS {n['table']} (seq INTEGER PRIMARY KEY AUTOINCREMENT, "
                f"topic TEXT NOT NULL, key BLOB, value BLOB, headers TEXT, "
                f"created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')))")
        database.execute(f"CREATE TABLE IF NOT EXISTS {n['meta']} "
                         f"(name TEXT PRIMARY KEY, value TEXT NOT NULL)")
        p = database.dialect.placeholder
        database.execute(f"INSERT INTO {n['meta']} (name, value) VALUES ({p}, {p}) "
                         f"ON CONFLICT DO NOTHING", (OUTBOX_ID_KEY, uuid.uuid4().hex))
    return outbox_id(database, table)


def _postgres_ddl(table: str, n: dict[str, str]) -> list[str]:
    sequence_literal = "'" + n["sequence"].replace("'", "''") + "'"
    return [
        f"CREATE SEQUENCE IF NOT EXISTS {n['sequence']}",
        (f"CREATE TABLE IF NOT EXISTS {n['table']} (seq BIGINT PRIMARY KEY, topic TEXT NOT NULL, "
         f"key BYTEA, value BYTEA, headers TEXT, created_at TIMESTAMPTZ NOT NULL DEFAULT now())"),
        # The lock first, the number second: see the module docstring.
        (f"CREATE OR REPLACE FUNCTION {n['function']}() RETURNS trigger LANGUAGE plpgsql AS $$ "
         f"BEGIN PERFORM pg_advisory_xact_lock({db.advisory_key(lock_name(table))}); "
         f"NEW.seq := nextval({sequence_literal}); RETURN NEW; END $$"),
        f"DROP TRIGGER IF EXISTS {n['trigger']} ON {n['table']}",
        (f"CREATE TRIGGER {n['trigger']} BEFORE INSERT ON {n['table']} "
         f"FOR EACH ROW EXECUTE FUNCTION {n['function']}()"),
    ]


def outbox_id(database: db.Database, table: str = DEFAULT_TABLE) -> str:
    """The outbox's random id; OutboxError if the outbox does not exist."""
    if not database.table_exists(f"{table}_meta") or not database.table_exists(table):
        raise OutboxError(f"no outbox '{table}' in {database.display}: create it with "
                          f"`onceflow outbox init` or onceflow.outbox.create_outbox()")
    rows = database.query(f"SELECT value FROM {_names(table)['meta']} WHERE name = "
                          f"{database.dialect.placeholder}", (OUTBOX_ID_KEY,))
    if not rows:
        raise OutboxError(f"outbox '{table}' in {database.display} has no id row")
    return rows[0][0]


def publish(database: db.Database | Any, topic: str, key: bytes | str | None = None,
            value: bytes | str | None = None, headers: Headers | None = None,
            table: str = DEFAULT_TABLE) -> None:
    """Add a record for `topic` to the outbox, inside the caller's open transaction.

    `database` is an `onceflow.db.Database` (inside `with database.transaction():`) or an
    application's own sqlite3 / psycopg 3 connection with a transaction open. The record
    is published by the relay if and only if that transaction commits.
    """
    if not isinstance(database, db.Database):
        database = db.Database.wrap(database)
    if not _in_transaction(database):
        raise OutboxError("outbox.publish() must run inside the transaction of the business "
                          "write (with database.transaction(): ...), or the two could "
                          "commit separately")
    if not topic:
        raise OutboxError("outbox.publish() needs a topic")
    p = database.dialect.placeholder
    database.execute(f"INSERT INTO {_names(table)['table']} (topic, key, value, headers) "
                     f"VALUES ({p}, {p}, {p}, {p})",
                     (topic, _bytes(key), _bytes(value), _headers_json(headers)))


def _in_transaction(database: db.Database) -> bool:
    """Will this insert commit with the caller's other writes? True inside
    `Database.transaction()`, in an open transaction, or on a connection that opens one
    implicitly (sqlite3's default isolation level, psycopg without autocommit)."""
    if database.in_transaction:
        return True
    raw = database.raw
    if database.dialect is db.SQLITE:
        return bool(raw.in_transaction) or raw.isolation_level is not None
    from psycopg.pq import TransactionStatus

    return not raw.autocommit or raw.info.transaction_status != TransactionStatus.IDLE


def _bytes(data: bytes | str | None) -> bytes | None:
    return data.encode() if isinstance(data, str) else data


def _headers_json(headers: Headers | None) -> str | None:
    if headers is None:
        return None
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    encoded = []
    for name, header_value in pairs:
        if isinstance(header_value, bytes):
            try:
                header_value = header_value.decode()
            except UnicodeDecodeError:
                raise OutboxError(f"header '{name}': outbox header values are text "
                                  f"(UTF-8)") from None
        encoded.append([str(name), header_value])
    return json.dumps(encoded)


def pending(database: db.Database, next_seq: int, rows_max: int,
            table: str = DEFAULT_TABLE) -> list[OutboxRow]:
    """Committed rows with seq >= next_seq, in seq order, at most `rows_max`."""
    rows_max = max(1, min(rows_max, ROWS_PER_READ_MAX))
    p = database.dialect.placeholder
    rows = database.query(f"SELECT seq, topic, key, value, headers FROM {_names(table)['table']} "
                          f"WHERE seq >= {p} ORDER BY seq LIMIT {p}", (next_seq, rows_max))
    return [OutboxRow(int(seq), topic, _as_bytes(key), _as_bytes(value), _parse_headers(headers))
            for seq, topic, key, value, headers in rows]


def _as_bytes(data: Any) -> bytes | None:
    return None if data is None else bytes(data)  # psycopg returns BYTEA as memoryview


def _parse_headers(text: str | None) -> list[tuple[str, bytes | None]]:
    if not text:
        return []
    return [(name, None if value is None else value.encode()) for name, value in json.loads(text)]


@dataclasses.dataclass(frozen=True)
class Backlog:
    rows: int                 # committed rows with seq >= next_seq
    last_seq: int | None      # the highest committed seq, None for an empty outbox
    oldest_pending: str | None


def backlog(database: db.Database, next_seq: int, table: str = DEFAULT_TABLE) -> Backlog:
    name, p = _names(table)["table"], database.dialect.placeholder
    ((rows, oldest),) = database.query(
        f"SELECT count(*), min(created_at) FROM {name} WHERE seq >= {p}", (next_seq,))
    ((last,),) = database.query(f"SELECT max(seq) FROM {name}")
    return Backlog(int(rows), None if last is None else int(last),
                   None if oldest is None else str(oldest))


def prune(database: db.Database, next_seq: int, table: str = DEFAULT_TABLE) -> int:
    """Delete the rows below `next_seq` (published); returns how many."""
    with database.transaction():
        cursor = database.execute(f"DELETE FROM {_names(table)['table']} WHERE seq < "
                                  f"{database.dialect.placeholder}", (next_seq,))
        return max(cursor.rowcount, 0)
