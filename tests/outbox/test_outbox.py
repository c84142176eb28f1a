"""The outbox: business rows and outbox rows commit together; the relay publishes every
committed outbox row exactly once and in seq order, across SIGKILLs, zombies and
transactions that commit in a different order than they started - on SQLite and on
PostgreSQL, with the real broker and a read_committed reader.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition
from typer.testing import CliRunner

from onceflow import db, outbox
from onceflow.cli.app import app
from onceflow.outbox import progress
from tests.helpers import create_topic, unique, wait_for
from tests.postgres_fixture import postgres_url  # noqa: F401
from tests.spark.support import DriverProcess, read_committed

KILLS = 3
ORDERS_MIN, ORDERS_MAX = 200, 5_000
PRODUCE_DELAY_MS = 300
RELAY_FINISH_S = 120


class Rollback(Exception):
    """Raised inside a transaction to roll it back."""


@pytest.fixture
def bootstrap(onceflow_broker) -> str:
    return onceflow_broker.bootstrap_servers


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'app.db'}"
    return request.getfixturevalue("postgres_url")


@pytest.fixture
def table(database_url) -> str:
    """A fresh outbox (unique name: the PostgreSQL database is shared) and its orders table."""
    name = unique("outbox").replace("-", "_")
    with db.connect(database_url) as database:
        outbox.create_outbox(database, name)
        database.execute(f'CREATE TABLE "{name}_orders" (id INTEGER PRIMARY KEY, amount INTEGER)')
    return name


def place_order(database: db.Database, table: str, topic: str, order: int,
                rows: int = 1, roll_back: bool = False) -> None:
    """One application transaction: an order and `rows` outbox records about it."""
    with contextlib.suppress(Rollback), database.transaction():
        database.execute(f'INSERT INTO "{table}_orders" (id, amount) VALUES '
                         f'({database.dialect.placeholders(2)})', (order, order * 10))
        for part in range(rows):
            outbox.publish(database, topic, key=f"k{order % 5}",
                           value=json.dumps({"order": order, "part": part}), table=table)
        if roll_back:
            raise Rollback


def outbox_rows(url: str, table: str) -> list[tuple[bytes | None, bytes | None]]:
    with db.connect(url) as database:
        return [(row.key, row.value) for row in outbox.pending(database, 0, 10_000, table)]


def published(bootstrap: str, topic: str) -> list[tuple[bytes | None, bytes | None]]:
    return [(m.key(), m.value()) for m in read_committed(bootstrap, topic)]


def records_written(bootstrap: str, topic: str) -> int:
    """Every record in the single-partition `topic`, aborted ones included."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("all"),
                         "isolation.level": "read_uncommitted", "enable.partition.eof": True})
    count, deadline = 0, time.monotonic() + 30
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error() is not None:
                assert message.error().code() == KafkaError._PARTITION_EOF, message.error()
                return count
            count += 1
        raise AssertionError(f"reading {topic} did not reach its end")
    finally:
        consumer.close()


def wait_open_transaction(bootstrap: str, topic: str, timeout_s: float = 30.0) -> None:
    """Wait until records of an open transaction are in `topic` (high watermark > LSO)."""
    clients = [Consumer({"bootstrap.servers": bootstrap, "group.id": unique("marks"),
                         "isolation.level": level})
               for level in ("read_uncommitted", "read_committed")]
    partition = TopicPartition(topic, 0)

    def is_open() -> bool:
        # The high watermark first: an LSO below a watermark read before it means records
        # that were not stable at the later instant.
        high, stable = (c.get_watermark_offsets(partition, timeout=5, cached=False)[1]
                        for c in clients)
        return high > stable

    try:
        wait_for(is_open, f"an open relay transaction in {topic}", timeout_s, poll_s=0.005)
    finally:
        for client in clients:
            client.close()


def committed_next(bootstrap: str, table: str) -> int:
    found = progress.read(bootstrap, progress.DEFAULT_PROGRESS_TOPIC, table)
    return found.next_seq if found else 0


def relay_command(url: str, bootstrap: str, table: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "onceflow", "outbox", "relay", "--db", url,
            "--bootstrap-servers", bootstrap, "--table", table, *extra]


@pytest.mark.slow
def test_each_row_published_exactly_once_in_order_across_relay_kills(
        onceflow_fresh_broker, database_url, table, tmp_path):
    broker, bootstrap = onceflow_fresh_broker, onceflow_fresh_broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("outbox-out"))
    relay = DriverProcess(relay_command(database_url, bootstrap, table, "--batch", "15",
                                        "--poll-ms", "20"), tmp_path / "relay.log")
    kills_done, orders = threading.Event(), []

    def application() -> None:
        # Writes until the kills are over, so each restarted relay finds a backlog and is
        # busy publishing it (in a transaction, mostly) when the next SIGKILL comes.
        with db.connect(database_url) as database:
            order = 0
            while order < ORDERS_MIN or not kills_done.is_set() and order < ORDERS_MAX:
                # Some orders have two records, some roll back (PostgreSQL: a seq gap).
                place_order(database, table, topic, order, rows=1 + (order % 3 == 0),
                            roll_back=order % 7 == 3)
                order += 1
                time.sleep(0.01)
            orders.append(order)

    writer = threading.Thread(target=application)
    writer.start()
    # Produce answers come late, so each relay transaction stays open - its records in the
    # log, its commit not yet asked for - long enough for the kill to land inside it.
    broker.faults.delay_responses("produce", ms=PRODUCE_DELAY_MS, count=None)
    try:
        seen = 0
        for _ in range(KILLS):
            relay.start()
            wait_for(lambda seen=seen: committed_next(bootstrap, table) > seen,
                     "the relay to commit another batch", 60, poll_s=0.05)
            wait_open_transaction(bootstrap, topic)
            relay.kill()
            seen = committed_next(bootstrap, table)
    finally:
        relay.kill()  # after a failure, too: no relay left running behind the test
        kills_done.set()
        writer.join()
        broker.faults.clear()
    relay.command = [*relay.command, "--once"]
    relay.start()
    assert relay.wait(RELAY_FINISH_S) == 0, relay.tail()

    expected = outbox_rows(database_url, table)
    assert len(expected) == sum(1 + (o % 3 == 0) for o in range(orders[0]) if o % 7 != 3)
    assert published(bootstrap, topic) == expected
    # The kills did interrupt transactions: their records are in the log, aborted.
    assert records_written(bootstrap, topic) >= len(expected) + KILLS
    with db.connect(database_url) as database:
        ((last,),) = database.query(f'SELECT max(seq) FROM "{table}"')
        ((order_count,),) = database.query(f'SELECT count(*) FROM "{table}_orders"')
    assert committed_next(bootstrap, table) == last + 1
    assert order_count == len({json.loads(value)["order"] for _, value in expected})


def test_late_committing_transaction_is_not_skipped(bootstrap, database_url, table):
    # T1 takes the next seq and stays open; T2 (plain SQL, not publish()) starts later and
    # would take a higher seq and commit first - the case where a relay reading
    # `seq >= next` skips T1's row for good. The outbox makes T2 wait for T1 instead.
    topic = create_topic(bootstrap, unique("outbox-late"))
    config = outbox.RelayConfig(database_url, bootstrap, table=table)
    relay = outbox.Relay(config)
    with db.connect(database_url) as database:
        for order in range(3):
            place_order(database, table, topic, order)
    relay.open()
    assert relay.publish_batch().rows == 3

    t1 = db.connect(database_url)
    transaction = t1.transaction()
    transaction.__enter__()
    outbox.publish(t1, topic, key="late", value="t1", table=table)
    t2_done = threading.Event()

    def t2() -> None:
        with db.connect(database_url) as database, database.transaction():
            p = database.dialect.placeholder
            database.execute(f'INSERT INTO "{table}" (topic, key, value) VALUES ({p}, {p}, {p})',
                             (topic, b"early", b"t2"))
        t2_done.set()

    writer = threading.Thread(target=t2)
    writer.start()
    try:
        assert not t2_done.wait(1.0), "T2 committed while T1 held a lower seq"
        assert relay.publish_batch().rows == 0  # T1 open, T2 waiting: nothing committed yet
    finally:
        transaction.__exit__(None, None, None)  # T1 commits; T2 goes on
        t1.close()
        writer.join()
    relay.run(once=True)
    relay.close()
    values = [value for _, value in published(bootstrap, topic)]
    assert values[3:] == [b"t1", b"t2"]
    assert outbox_rows(database_url, table) == published(bootstrap, topic)


def test_zombie_relay_is_fenced(bootstrap, tmp_path):
    url = f"sqlite:///{tmp_path / 'app.db'}"
    topic, table = create_topic(bootstrap, unique("outbox-zombie")), "zombie_outbox"
    with db.connect(url) as database:
        outbox.create_outbox(database, table)
        database.execute(f'CREATE TABLE "{table}_orders" (id INTEGER PRIMARY KEY, amount INTEGER)')
        for order in range(10):
            place_order(database, table, topic, order)
    config = outbox.RelayConfig(url, bootstrap, name=unique("zombie"), table=table)
    zombie, successor = outbox.Relay(config), outbox.Relay(config)
    zombie.open()
    assert zombie.stage(zombie.pending())  # produced, not committed: then it "pauses"
    successor.open()                       # fences the zombie and aborts its transaction
    assert successor.next_seq == 0
    successor.run(once=True)
    with pytest.raises(outbox.RelayFenced, match="fenced"):
        zombie.commit()
    with pytest.raises(outbox.RelayFenced):
        zombie.publish_batch()
    zombie.close()
    successor.close()
    assert published(bootstrap, topic) == outbox_rows(url, table)
    assert len(published(bootstrap, topic)) == 10


def test_progress_of_another_outbox_is_refused(bootstrap, tmp_path):
    topic, name = create_topic(bootstrap, unique("outbox-two")), unique("shared-name")
    for index in range(2):
        url = f"sqlite:///{tmp_path / f'db{index}.db'}"
        with db.connect(url) as database:
            outbox.create_outbox(database)
            with database.transaction():
                outbox.publish(database, topic, value=f"from {index}")
        relay = outbox.Relay(outbox.RelayConfig(url, bootstrap, name=name))
        if index == 0:
            relay.open()
            relay.run(once=True)
        else:
            with pytest.raises(outbox.RelayError, match="its own relay name"):
                relay.open()
        relay.close()
    assert [value for _, value in published(bootstrap, topic)] == [b"from 0"]


def test_prune_deletes_published_rows(bootstrap, tmp_path):
    url, topic = f"sqlite:///{tmp_path / 'app.db'}", create_topic(bootstrap, unique("outbox-prune"))
    with db.connect(url) as database:
        outbox.create_outbox(database)
        for batch in range(3):
            with database.transaction():
                for i in range(4):
                    outbox.publish(database, topic, value=f"{batch}-{i}",
                                   headers={"batch": str(batch)})
    relay = outbox.Relay(outbox.RelayConfig(url, bootstrap, name=unique("prune"),
                                            batch_rows=5, prune=True))
    relay.open()
    relay.run(once=True)
    relay.close()
    assert outbox_rows(url, outbox.DEFAULT_TABLE) == []
    messages = read_committed(bootstrap, topic)
    expected = [f"{b}-{i}".encode() for b in range(3) for i in range(4)]
    assert [m.value() for m in messages] == expected
    assert messages[-1].headers() == [("batch", b"2")]


def test_publish_outside_a_transaction_is_refused(tmp_path):
    with db.connect(f"sqlite:///{tmp_path / 'app.db'}") as database:
        outbox.create_outbox(database)
        with pytest.raises(outbox.OutboxError, match="inside the transaction"):
            outbox.publish(database, "t", value="v")


def test_cli_init_relay_status(bootstrap, tmp_path):
    runner, url = CliRunner(), f"sqlite:///{tmp_path / 'app.db'}"
    topic, name = create_topic(bootstrap, unique("outbox-cli")), unique("cli")
    common = ["--db", url, "--bootstrap-servers", bootstrap, "--name", name]
    created = runner.invoke(app, ["outbox", "init", "--db", url])
    assert created.exit_code == 0, created.output
    with db.connect(url) as database:
        for i in range(7):
            with database.transaction():
                outbox.publish(database, topic, value=str(i))
    before = runner.invoke(app, ["outbox", "status", *common])
    assert before.exit_code == 0, before.output
    assert "backlog rows" in before.output and "│ 7" in before.output
    relayed = runner.invoke(app, ["outbox", "relay", *common, "--once", "--batch", "3"])
    assert relayed.exit_code == 0, relayed.output
    assert "published 7 rows in 3 transactions; next seq 8" in relayed.output
    after = runner.invoke(app, ["outbox", "status", *common])
    assert "│ next seq" in after.output and "│ 8" in after.output
    values = [m.value() for m in read_committed(bootstrap, topic)]
    assert values == [str(i).encode() for i in range(7)]


def test_cli_reports_errors_in_one_line(tmp_path):
    runner = CliRunner()
    missing = runner.invoke(app, ["outbox", "status", "--db", f"sqlite:///{tmp_path / 'x.db'}"])
    assert missing.exit_code == 1 and "no outbox 'onceflow_outbox'" in missing.output
    bad = runner.invoke(app, ["outbox", "relay", "--db", "mysql://h/db"])
    assert bad.exit_code == 1 and "unsupported database URL" in bad.output

