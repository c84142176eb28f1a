"""`make run`: the broker on the embedded default, driven by a real Kafka client.

Starts an in-process broker on ./data (kept between runs), creates a topic,
produces records with confluent-kafka (acks=all, so each acknowledged record is
fsync'd), reads them back, and shows that every record arrived once, in order.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from rich.console import Console
from rich.table import Table

from onceflow import Broker

DATA_DIR = Path("data")
RECORDS = 20_000
PARTITIONS = 4
CONSUME_TIMEOUT_S = 60.0


def produce(bootstrap: str, topic: str) -> float:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                         "compression.type": "lz4"})
    started = time.perf_counter()
    for i in range(RECORDS):
        producer.produce(topic, key=f"key-{i % 100}", value=f"record-{i}".encode(),
                         headers={"seq": str(i).encode()})
        if i % 1000 == 0:
            producer.poll(0)
    remaining = producer.flush(30)
    assert remaining == 0, f"{remaining} records not acknowledged"
    return time.perf_counter() - started


def consume(bootstrap: str, topic: str) -> tuple[dict[int, list[int]], float]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"demo-{uuid.uuid4()}",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    seen: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
    started = time.perf_counter()
    count = 0
    while count < RECORDS and time.perf_counter() - started < CONSUME_TIMEOUT_S:
        for message in consumer.consume(1000, timeout=1.0):
            if message.error():
                raise RuntimeError(message.error())
            seen[message.partition()].append(int(dict(message.headers())["seq"]))
            count += 1
    consumer.close()
    return seen, time.perf_counter() - started


def main() -> None:
    console = Console()
    with Broker(DATA_DIR, port=0) as broker:
        bootstrap = broker.bootstrap_servers
        console.print(f"[bold]onceflow broker[/] on {bootstrap}, data in {DATA_DIR.resolve()}")
        topic = f"demo-{int(time.time())}"
        admin = AdminClient({"bootstrap.servers": bootstrap})   # keep it alive until done
        admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(10)
        produce_s = produce(bootstrap, topic)
        seen, consume_s = consume(bootstrap, topic)
    table = Table(title=f"{topic}: {RECORDS:,} records, acks=all, lz4", title_justify="left")
    for column in ("partition", "records", "in order"):
        table.add_column(column)
    for partition, sequence in seen.items():
        table.add_row(str(partition), str(len(sequence)), str(sequence == sorted(sequence)))
    console.print(table)
    all_seen = sorted(s for seq in seen.values() for s in seq)
    ok = all_seen == list(range(RECORDS))
    console.print(f"produce {RECORDS / produce_s:,.0f} records/s, consume {RECORDS / consume_s:,.0f} records/s")
    console.print("[green]every record exactly once, in order per partition[/]" if ok
                  else "[red]records missing or duplicated[/]")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
