"""`make run`, part 2: the pizza pipeline on Spark, exactly once through a driver crash.

An in-process onceflow broker on ./data/pizza/broker. The demo writes a few thousand JSON
orders (Pizza, Burger, Sushi...) to the `orders` topic and knows from them the expected
result: how many pizza orders, how much income. Then it runs the pipeline of
`onceflow.examples.pizza_pipeline` as a child process - `onceflow pipeline run`, three
streaming queries: income events to the `pizza-income` topic, the same events to the
SQLite table `pizza_orders`, a running total to `pizza_totals` - and SIGKILLs the whole
driver (Python, JVM, Python workers) while a micro-batch is planned in the checkpoint but
not committed. The restarted driver replays that batch from the checkpoint and goes on
until the backlog is processed (`--available-now`). Finally the demo reads the topic as a
read_committed consumer and the database, and compares both with the expected result:
same count, same income, no order twice. Exit code 1 if anything differs.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from onceflow.broker.embedded import Broker
from onceflow.demo.processes import kill_tree
from onceflow.spark import checkpoint

DATA_DIR = Path("data/pizza")
# The pipeline file the driver runs, and the names it uses. Not imported here: importing it
# imports pyspark and settles its paths from the environment at import time.
PIPELINE_FILE = Path(__file__).parent.parent / "examples" / "pizza_pipeline.py"
ORDERS_TOPIC, INCOME_TOPIC = "orders", "pizza-income"
TABLE_ORDERS, TABLE_TOTALS = "pizza_orders", "pizza_totals"
ORDERS = 6_000
RECORDS_PER_TRIGGER = 1_000  # per query and micro-batch: ~6 batches each
PARTITIONS = 2
KILLS = 1
MEALS = ("Pizza", "Burger", "Sushi", "Salad", "Tacos")
PRICE_CENTS_RANGE = (500, 4_000)
SEED = 20_240_601  # the same orders every run, so two runs print the same totals
MASTER = "local[2]"
# A driver run (JVM start, first batch, the backlog) must end within this long.
DRIVER_TIMEOUT_S = 240.0
# The first kill waits for a batch after this one: one batch is committed first, so the
# restart visibly resumes instead of starting over. Later kills wait for a batch that was
# not planned yet when their driver started (one left in flight is planned already).
KILL_AFTER_BATCH = 0
# A batch caught in flight is killed this long after we saw it planned: long enough for
# its tasks to be writing (an open transaction, an uncommitted database write), short
# enough that it is rarely done already. A batch that finished anyway is not counted.
KILL_DELAY_S = 0.3
READ_TIMEOUT_S = 60.0
# librdkafka's informational lines ("Purging 1 unserved events...") are not for this audience.
LIBRDKAFKA_LOG_LEVEL = 3


@dataclasses.dataclass(frozen=True)
class Totals:
    """Pizza orders as one of the places sees them."""

    orders: int
    income_cents: int
    duplicates: int  # order ids seen more than once
    missing: int  # expected order ids not seen (None-like -1 when not applicable)


def make_orders(count: int, seed: int = SEED) -> list[dict]:
    rng = random.Random(seed)
    return [{"order_id": f"order-{i:06d}", "meal": rng.choice(MEALS),
             "value": rng.randrange(*PRICE_CENTS_RANGE) / 100} for i in range(count)]


def expected_pizza(orders: list[dict]) -> dict[str, int]:
    """order id -> income in cents, computed here in Python from the input."""
    return {o["order_id"]: round(o["value"] * 100) for o in orders if o["meal"] == "Pizza"}


def totals_of(order_ids: list[str], income_cents: int, expected: dict[str, int]) -> Totals:
    counts = collections.Counter(order_ids)
    return Totals(len(order_ids), income_cents, sum(1 for n in counts.values() if n > 1),
                  len(expected.keys() - counts.keys()))


# ------------------------------------------------------------------------ Kafka


def create_topics(bootstrap: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": LIBRDKAFKA_LOG_LEVEL})
    topics = [NewTopic(name, PARTITIONS, 1) for name in (ORDERS_TOPIC, INCOME_TOPIC)]
    for future in admin.create_topics(topics).values():
        future.result(15)


def produce_orders(bootstrap: str, orders: list[dict]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5,
                         "log_level": LIBRDKAFKA_LOG_LEVEL})
    for order in orders:
        producer.produce(ORDERS_TOPIC, key=order["order_id"].encode(),
                         value=json.dumps(order).encode())
        producer.poll(0)
    if producer.flush(30) != 0:
        raise RuntimeError("orders still undelivered after 30 s")


def read_income_events(bootstrap: str) -> list[dict]:
    """Every committed event of the income topic: a read_committed consumer reads each
    partition up to its end (the last stable offset: open transactions hold it back)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "pizza-demo-check",
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "enable.partition.eof": True, "auto.offset.reset": "earliest",
                         "log_level": LIBRDKAFKA_LOG_LEVEL})
    consumer.assign([TopicPartition(INCOME_TOPIC, p, 0) for p in range(PARTITIONS)])
    events, at_end = [], set()
    deadline = time.monotonic() + READ_TIMEOUT_S
    try:
        while len(at_end) < PARTITIONS:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{INCOME_TOPIC} not read to its end in {READ_TIMEOUT_S:.0f} s")
            for message in consumer.consume(500, 0.5):
                if message.error() is None:
                    events.append(json.loads(message.value()))
                    at_end.discard(message.partition())
                elif message.error().code() == KafkaError._PARTITION_EOF:
                    at_end.add(message.partition())
                else:
                    raise RuntimeError(str(message.error()))
    finally:
        consumer.close()
    return events


def topic_totals(bootstrap: str, expected: dict[str, int]) -> Totals:
    events = read_income_events(bootstrap)
    return totals_of([e["order_id"] for e in events], sum(e["income_cents"] for e in events), expected)


# --------------------------------------------------------------------- database


def database_totals(path: Path, expected: dict[str, int]) -> tuple[Totals, Totals]:
    """(the pizza_orders rows, the pizza_totals running total) as Totals."""
    if not path.exists():
        return Totals(0, 0, 0, len(expected)), Totals(0, 0, 0, -1)
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        rows = _rows(db, f"SELECT order_id, income_cents FROM {TABLE_ORDERS}")
        total = _rows(db, f"SELECT orders, income_cents FROM {TABLE_TOTALS} WHERE meal = 'Pizza'")
    orders = totals_of([r[0] for r in rows], sum(r[1] for r in rows), expected)
    running = Totals(total[0][0], total[0][1], 0, -1) if total else Totals(0, 0, 0, -1)
    return orders, running


def _rows(db: sqlite3.Connection, sql: str) -> list[tuple]:
    try:
        return db.execute(sql).fetchall()
    except sqlite3.OperationalError:  # the table is created by the first batch with rows
        return []


# ----------------------------------------------------------------------- driver


class Driver:
    """`onceflow pipeline run` in its own process group; its progress lines are echoed.

    It is in a session of its own so that the demo's kills reach exactly it. Ctrl-C then
    does not reach it, so `run_supervised` kills the drivers still running
    (`Driver.running`) when the demo ends for any reason."""

    running: ClassVar[set[Driver]] = set()

    def __init__(self, args: list[str], env: dict[str, str], log_path: Path, console: Console) -> None:
        self.command = [sys.executable, "-m", "onceflow", "pipeline", "run", *args]
        self.env = {**os.environ, **env}
        self.log_path = log_path
        self.console = console
        self.process: subprocess.Popen | None = None
        self._echo: threading.Thread | None = None

    def start(self) -> Driver:
        with open(self.log_path, "a") as log:
            log.write(f"\n=== {' '.join(self.command)}\n")
            log.flush()
            self.process = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=log,
                                            env=self.env, text=True, start_new_session=True)
        self._echo = threading.Thread(target=self._echo_lines, daemon=True)
        self._echo.start()
        Driver.running.add(self)
        return self

    def _echo_lines(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            self.console.print(f"   [dim]spark |[/] {escape(line.rstrip())}", highlight=False)

    def kill(self) -> None:
        """SIGKILL the tree: the Python driver, its JVM and the JVM's Python workers."""
        assert self.process is not None
        if self.process.poll() is None:
            kill_tree(self.process.pid)
        self.process.wait()
        Driver.running.discard(self)
        if self._echo is not None:
            self._echo.join(5)

    def wait(self, timeout_s: float) -> int:
        assert self.process is not None
        try:
            code = self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError(f"the driver did not finish in {timeout_s:.0f} s "
                               f"(log: {self.log_path})") from None
        Driver.running.discard(self)
        if self._echo is not None:
            self._echo.join(5)
        return code

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


def kill_mid_batch(driver: Driver, checkpoints: Path, after_batch: int) -> tuple[str, int] | None:
    """SIGKILL the driver while a batch later than `after_batch` is planned and not
    committed; (query, batch) it hit, or None when the driver ended first."""
    deadline = time.monotonic() + DRIVER_TIMEOUT_S
    while driver.alive() and time.monotonic() < deadline:
        queries = checkpoint.query_checkpoints(checkpoints) if checkpoints.is_dir() else []
        try:
            path, batch = checkpoint.wait_mid_batch(queries, after_batch, timeout_s=1.0)
        except TimeoutError:
            continue
        time.sleep(KILL_DELAY_S)
        if batch in checkpoint.batches_committed(path):
            continue  # finished in the meantime: wait for the next one
        driver.kill()
        if batch not in checkpoint.batches_committed(path):
            return path.name, batch
    return None


# ------------------------------------------------------------------------- demo


@dataclasses.dataclass(frozen=True)
class Setup:
    data_dir: Path
    bootstrap: str
    records_per_trigger: int

    @property
    def checkpoints(self) -> Path:
        return self.data_dir / "checkpoints"

    @property
    def database(self) -> Path:
        return self.data_dir / "pizza.db"

    def driver(self, console: Console, *mode: str) -> Driver:
        args = [str(PIPELINE_FILE), "--master", MASTER, "--bootstrap-servers", self.bootstrap,
                "--checkpoint", str(self.checkpoints), "--log", *mode]
        env = {"PIZZA_DATA_DIR": str(self.data_dir),
               "PIZZA_RECORDS_PER_TRIGGER": str(self.records_per_trigger)}
        return Driver(args, env, self.data_dir / "driver.log", console)


def crash_once(setup: Setup, console: Console, expected: dict[str, int], step: int) -> bool:
    """Start the pipeline, SIGKILL it mid-batch, show what survived. False if the driver
    ended before a batch could be caught in flight."""
    planned = [checkpoint.read_state(path).last_planned
               for path in (checkpoint.query_checkpoints(setup.checkpoints) if setup.checkpoints.is_dir() else [])]
    after_batch = max([KILL_AFTER_BATCH, *(b for b in planned if b is not None)])
    what = "start" if not planned else "restart from the checkpoints, to be killed again:"
    console.print(f"\n[bold]{step}. {what} the pipeline[/] (3 streaming queries, one per sink)")
    driver = setup.driver(console, "--until-idle", "30").start()
    hit = kill_mid_batch(driver, setup.checkpoints, after_batch)
    if hit is None:
        code = driver.wait(DRIVER_TIMEOUT_S)
        console.print("   the driver finished before a batch could be caught in flight" if code == 0
                      else f"   [red]the driver failed (exit code {code}); see {driver.log_path}[/]")
        return False
    query, batch = hit
    console.print(f"\n[bold red]   SIGKILL[/] of the whole driver (Python, JVM, workers) while batch "
                  f"{batch} of {query} was planned but not committed")
    for state in map(checkpoint.read_state, checkpoint.query_checkpoints(setup.checkpoints)):
        console.print(f"   checkpoint {state.path.name}: last committed batch "
                      f"{_batch(state.last_committed)}, in flight {list(state.in_flight) or '-'}")
    topic = topic_totals(setup.bootstrap, expected)
    rows, _ = database_totals(setup.database, expected)
    console.print(f"   committed so far: {topic.orders:,} income events in {INCOME_TOPIC}, "
                  f"{rows.orders:,} rows in {TABLE_ORDERS} (of {len(expected):,})")
    return True


def _batch(batch_id: int | None) -> str:
    return "-" if batch_id is None else str(batch_id)


def finish(setup: Setup, console: Console, step: int) -> int:
    console.print(f"\n[bold]{step}. restart from the checkpoint[/] with --available-now: batches "
                  "in flight are replayed with the same offsets, then the backlog is processed")
    return setup.driver(console, "--available-now").start().wait(DRIVER_TIMEOUT_S)


def verification_table(expected: dict[str, int], places: dict[str, Totals]) -> tuple[Table, bool]:
    table = Table(title="pizza orders: expected vs each output", title_justify="left")
    for column in ("", "orders", "income", "ids twice", "ids missing", "ok"):
        table.add_column(column, justify="left" if not column else "right")
    want = Totals(len(expected), sum(expected.values()), 0, 0)
    table.add_row("expected", f"{want.orders:,}", _money(want.income_cents), "0", "0", "")
    all_ok = True
    for place, got in places.items():
        ok = (got.orders, got.income_cents, got.duplicates) == (want.orders, want.income_cents, 0) \
            and got.missing <= 0
        all_ok &= ok
        table.add_row(place, f"{got.orders:,}", _money(got.income_cents), f"{got.duplicates:,}",
                      "-" if got.missing < 0 else f"{got.missing:,}",
                      "[green]yes[/]" if ok else "[red]NO[/]")
    return table, all_ok


def _money(cents: int) -> str:
    return f"${cents / 100:,.2f}"


def verify(setup: Setup, console: Console, expected: dict[str, int], step: int) -> bool:
    console.print(f"\n[bold]{step}. verify[/]: expected = computed from the input orders; "
                  f"{INCOME_TOPIC} = the topic as a read_committed consumer sees it; "
                  f"{TABLE_ORDERS} = the rows in SQLite; {TABLE_TOTALS} = the running total")
    rows, running = database_totals(setup.database, expected)
    places = {INCOME_TOPIC: topic_totals(setup.bootstrap, expected), TABLE_ORDERS: rows,
              TABLE_TOTALS: running}
    table, ok = verification_table(expected, places)
    console.print(table)
    return ok


def run(data_dir: Path = DATA_DIR, orders: int = ORDERS, kills: int = KILLS,
        records_per_trigger: int = RECORDS_PER_TRIGGER, console: Console | None = None) -> int:
    """The whole demo; returns the exit code (0: every output matches the input)."""
    console = console or Console()
    data_dir = data_dir.resolve()
    shutil.rmtree(data_dir, ignore_errors=True)  # the demo's own directory: a fresh start
    data_dir.mkdir(parents=True)
    started = time.monotonic()
    with Broker(data_dir / "broker", port=0, group_initial_rebalance_delay_ms=0) as broker:
        setup = Setup(data_dir, broker.bootstrap_servers, records_per_trigger)
        console.print(f"[bold]Pizza income on Spark, exactly once through driver crashes[/]\n"
                      f"onceflow broker on {setup.bootstrap}; checkpoints, database and driver "
                      f"log in {data_dir}")
        create_topics(setup.bootstrap)
        input_orders = make_orders(orders)
        produce_orders(setup.bootstrap, input_orders)
        expected = expected_pizza(input_orders)
        console.print(f"\n[bold]1. input[/]: {orders:,} orders in topic {ORDERS_TOPIC} "
                      f"({PARTITIONS} partitions), {len(expected):,} of them pizza worth "
                      f"{_money(sum(expected.values()))}")
        step, crashes = 2, 0
        while crashes < kills:
            hit = crash_once(setup, console, expected, step)
            step += 1
            if not hit:
                break  # the backlog was done before a batch could be caught in flight
            crashes += 1
        code = finish(setup, console, step)
        if code != 0:
            console.print(f"[red]the driver failed (exit code {code}); see {setup.data_dir / 'driver.log'}[/]")
            return 1
        ok = verify(setup, console, expected, step + 1)
    elapsed = time.monotonic() - started
    if ok and crashes >= kills:
        console.print(f"\n[green]every pizza order is in the topic and in the database exactly "
                      f"once, after {crashes} driver crash(es)[/] ({elapsed:.0f} s)")
        return 0
    console.print(f"\n[red]the outputs do not match the input[/] ({crashes} crash(es))" if not ok
                  else f"\n[red]only {crashes} of {kills} crashes could be staged mid-batch[/]")
    return 1


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)
    parser.add_argument("--orders", type=int, default=ORDERS)
    parser.add_argument("--kills", type=int, default=KILLS)
    parser.add_argument("--records-per-trigger", type=int, default=RECORDS_PER_TRIGGER)
    args = parser.parse_args(argv)
    raise SystemExit(run_supervised(args.data_dir, args.orders, args.kills, args.records_per_trigger))


def run_supervised(*args: Any, **kwargs: Any) -> int:
    """`run`, leaving no Spark driver behind when it ends by Ctrl-C, SIGTERM or an error."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        return run(*args, **kwargs)
    finally:
        for driver in list(Driver.running):
            driver.kill()


if __name__ == "__main__":
    main()
