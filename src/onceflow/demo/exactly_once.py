"""`make run`: exactly-once through crashes, shown live.

An in-process onceflow broker on ./data. Input records arrive in `<run>-input` over
several seconds; two transactional copiers (`onceflow.examples.copier`, child processes
in one consumer group) copy them to `<run>-output`; every second and a half one copier
is killed with SIGKILL - often in the middle of a transaction - and started again. A
read_committed checker reads the output the whole time and shows how many input
records it has seen once, more than once, or not yet. At the end every input record
must be there exactly once.
"""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from rich.console import Console
from rich.live import Live
from rich.table import Table

from onceflow.broker.embedded import Broker

DATA_DIR = Path("data/exactly-once")
RECORDS = 20_000
PARTITIONS = 4
COPIERS = 2
FEED_S = 10.0  # the input arrives over this long, so copiers die mid-stream
KILL_EVERY_S = 1.5
KILLS = 6
FINISH_TIMEOUT_S = 120.0
CHECK_POLL_S = 0.25


def start_copier(bootstrap: str, run: str, instance: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "onceflow.examples.copier", "--bootstrap", bootstrap,
         "--input", f"{run}-input", "--output", f"{run}-output", "--group", f"{run}-copier",
         "--instance", str(instance)],
        stderr=subprocess.DEVNULL)


class Feeder(threading.Thread):
    """Produces `record-0` .. `record-N` to the input, spread over FEED_S seconds."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
        self.topic = topic
        self.produced = 0

    def run(self) -> None:
        started = time.monotonic()
        for i in range(RECORDS):
            self.producer.produce(self.topic, key=str(i).encode(), value=f"record-{i}".encode())
            self.produced = i + 1
            if i % 500 == 0:
                self.producer.poll(0)
                time.sleep(max(0.0, started + FEED_S * i / RECORDS - time.monotonic()))
        self.producer.flush(FINISH_TIMEOUT_S)


def status_table(produced: int, seen: Counter, kills: int) -> Table:
    table = Table(title=f"read_committed view of the output; {kills} copier SIGKILLs so far",
                  title_justify="left")
    for column in ("input produced", "seen once", "seen twice or more", "not yet seen"):
        table.add_column(column, justify="right")
    once = sum(1 for n in seen.values() if n == 1)
    table.add_row(f"{produced:,}", f"{once:,}", f"{len(seen) - once:,}",
                  f"{produced - len(seen):,}")
    return table


def create_topics(bootstrap: str, run: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until created
    topics = [NewTopic(f"{run}-{name}", PARTITIONS, 1) for name in ("input", "output")]
    for future in admin.create_topics(topics).values():
        future.result(15)


def checker(bootstrap: str, topic: str) -> Consumer:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-checker",
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    return consumer


def watch(bootstrap: str, run: str, console: Console) -> Counter:
    """Feed, copy and kill copiers until every record is seen; returns what was seen."""
    feeder = Feeder(bootstrap, f"{run}-input")
    copiers = [start_copier(bootstrap, run, i) for i in range(COPIERS)]
    output = checker(bootstrap, f"{run}-output")
    feeder.start()
    seen: Counter = Counter()
    kills, next_kill = 0, time.monotonic() + KILL_EVERY_S
    deadline = time.monotonic() + FINISH_TIMEOUT_S
    with Live(status_table(0, seen, kills), console=console, refresh_per_second=4) as live:
        while time.monotonic() < deadline and (len(seen) < RECORDS or kills < KILLS):
            for message in output.consume(1000, CHECK_POLL_S):
                if message.error() is None:
                    seen[message.value().decode().lower()] += 1  # the copier upper-cases
            if kills < KILLS and time.monotonic() >= next_kill:
                victim = random.randrange(COPIERS)
                copiers[victim].kill()
                copiers[victim].wait()
                copiers[victim] = start_copier(bootstrap, run, victim)
                kills, next_kill = kills + 1, time.monotonic() + KILL_EVERY_S
            live.update(status_table(feeder.produced, seen, kills))
    for copier in copiers:
        copier.kill()
    output.close()
    return seen


def main() -> None:
    console = Console()
    with Broker(DATA_DIR, port=0, group_initial_rebalance_delay_ms=0) as broker:
        bootstrap, run = broker.bootstrap_servers, f"demo-{uuid.uuid4().hex[:6]}"
        console.print(f"[bold]onceflow broker[/] on {bootstrap}, data in {DATA_DIR.resolve()}: "
                      f"{RECORDS:,} records -> {COPIERS} transactional copiers, one killed "
                      f"every {KILL_EVERY_S} s")
        create_topics(bootstrap, run)
        seen = watch(bootstrap, run, console)
    exact = len(seen) == RECORDS and all(n == 1 for n in seen.values())
    console.print("\n[green]every input record is in the output exactly once[/]" if exact
                  else "\n[red]missing or duplicated records in the output[/]")
    raise SystemExit(0 if exact else 1)


if __name__ == "__main__":
    main()
