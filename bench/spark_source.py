"""Read throughput of the onceflow-kafka Spark source against a plain confluent-kafka loop.

    .venv/bin/python bench/spark_source.py                       # 1,000,000 x 100 B, 4 partitions
    .venv/bin/python bench/spark_source.py --records 200000 --partitions 2
    .venv/bin/python bench/spark_source.py --broker embedded     # broker inside this process
    .venv/bin/python bench/spark_source.py --bootstrap 127.0.0.1:9092

Theory of operation: one topic is filled once (N records of B random bytes, round robin
over P partitions, acks=all) and then read to its end three ways:

(a) plain: one confluent-kafka consumer in this process, assigned to every partition,
    `consume(10000, ...)` in a loop with an error check per message - the floor any Python
    Kafka reader pays;
(a2) loop: the source's own read loop (`read_range`: consume, trim, build Arrow batches)
    in this process, one partition after another, without Spark - what the source adds to
    (a) per record, before Spark's share;
(b) batch: `spark.read.format("onceflow-kafka").load().write.format("noop")` - the noop
    sink consumes every column, so no column pruning lets the source skip work (a bare
    count() could);
(c) stream: the same as a streaming query with Trigger.AvailableNow into the noop sink; the
    rows it read are summed from its progress reports and must equal N.

The Spark session (`--master`, default local[2]) is started and warmed up (one small read,
which starts the Python workers) before any timing. By default the broker is `onceflow
broker` in a child process, so neither reader shares a GIL with it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

RECORDS_DEFAULT = 1_000_000
RECORD_BYTES_DEFAULT = 100
PARTITIONS_DEFAULT = 4
MASTER_DEFAULT = "local[2]"
CONSUME_BATCH = 10_000
CONSUME_WAIT_S = 1.0
WARMUP_RECORDS = 1_000
# Bounds: far above a healthy run, so a stuck system fails instead of hanging.
PHASE_TIMEOUT_S = 900.0
ADMIN_TIMEOUT_S = 30.0


def cpu_s() -> float:
    """User + system CPU seconds of this process (librdkafka's threads included)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class BenchError(Exception):
    """A failure reported in one line (exit code 1)."""


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(ADMIN_TIMEOUT_S)


def fill(bootstrap: str, topic: str, records: int, record_bytes: int, partitions: int) -> float:
    """Produce the load; returns the seconds it took (every record acknowledged)."""
    failures: list = []
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 20,
                         "batch.size": 1_000_000, "delivery.report.only.error": True,
                         "on_delivery": lambda error, _message: failures.append(error)})
    payload = os.urandom(record_bytes)
    began = time.perf_counter()
    for index in range(records):
        while True:
            try:
                producer.produce(topic, payload, partition=index % partitions)
                break
            except BufferError:   # local queue full: let acknowledgements drain it
                producer.poll(0.005)
    remaining = producer.flush(PHASE_TIMEOUT_S)
    if failures or remaining:
        raise BenchError(f"produce: {len(failures)} failed, {remaining} unacknowledged")
    return time.perf_counter() - began


def plain_read(bootstrap: str, topic: str, records: int, partitions: int) -> float:
    """(a) The plain confluent-kafka loop; returns seconds from assign() to the last record."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False, "isolation.level": "read_committed"})
    try:
        began = time.perf_counter()
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        seen, deadline = 0, began + PHASE_TIMEOUT_S
        while seen < records:
            if time.perf_counter() > deadline:
                raise BenchError(f"plain read: {seen} of {records} records in {PHASE_TIMEOUT_S:.0f} s")
            for message in consumer.consume(CONSUME_BATCH, CONSUME_WAIT_S):
                if message.error() is None:
                    seen += 1
                elif message.error().fatal():
                    raise BenchError(f"plain read: {message.error()}")
        return time.perf_counter() - began
    finally:
        consumer.close()


def loop_read(bootstrap: str, topic: str, records: int, partitions: int) -> float:
    """(a2) The source's read loop without Spark; returns its seconds."""
    from onceflow.spark.offsets import OffsetReader
    from onceflow.spark.source import KafkaRange, parse_options, read_range

    options = parse_options({"kafka.bootstrap.servers": bootstrap, "subscribe": topic})
    offsets = OffsetReader(options.admin_config(), [topic], read_committed=True)
    ends = offsets.latest([(topic, p) for p in range(partitions)])
    began, rows = time.perf_counter(), 0
    for (name, partition), end in sorted(ends.items()):
        for batch in read_range(options, KafkaRange(name, partition, 0, end)):
            rows += batch.num_rows
    seconds = time.perf_counter() - began
    if rows != records:
        raise BenchError(f"loop read: {rows} rows, expected {records}")
    return seconds


def source_frame(spark, bootstrap: str, topic: str, streaming: bool):
    reader = spark.readStream if streaming else spark.read
    return (reader.format("onceflow-kafka").option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic).option("startingOffsets", "earliest").load())


def batch_read(spark, bootstrap: str, topic: str) -> float:
    """(b) A batch query into the noop sink; returns its seconds."""
    began = time.perf_counter()
    source_frame(spark, bootstrap, topic, streaming=False).write.format("noop").mode("overwrite").save()
    return time.perf_counter() - began


def stream_read(spark, bootstrap: str, topic: str, records: int, checkpoint: Path) -> float:
    """(c) An availableNow streaming query into the noop sink; returns its seconds."""
    began = time.perf_counter()
    query = (source_frame(spark, bootstrap, topic, streaming=True).writeStream.format("noop")
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    if not query.awaitTermination(PHASE_TIMEOUT_S):
        query.stop()
        raise BenchError(f"stream read did not finish in {PHASE_TIMEOUT_S:.0f} s")
    seconds = time.perf_counter() - began
    rows = sum(progress["numInputRows"] for progress in query.recentProgress)
    if rows != records:
        raise BenchError(f"stream read: {rows} rows, expected {records}")
    return seconds


@contextlib.contextmanager
def broker(args: argparse.Namespace, work: Path) -> Iterator[str]:
    if args.bootstrap:
        yield args.bootstrap
    elif args.broker == "embedded":
        from onceflow import Broker

        with Broker(work / "broker") as embedded:
            yield embedded.bootstrap_servers
    else:
        from onceflow.testing import BrokerProcess

        process = BrokerProcess(work / "broker").start()
        try:
            yield process.bootstrap_servers
        finally:
            process.stop()


def run(args: argparse.Namespace) -> int:
    from onceflow.spark import session

    with tempfile.TemporaryDirectory(prefix="onceflow-bench-") as temp, broker(args, Path(temp)) as bootstrap:
        topic, warmup = f"bench-src-{uuid.uuid4().hex[:8]}", f"bench-warm-{uuid.uuid4().hex[:8]}"
        create_topic(bootstrap, topic, args.partitions)
        create_topic(bootstrap, warmup, args.partitions)
        produce_s = fill(bootstrap, topic, args.records, args.record_bytes, args.partitions)
        fill(bootstrap, warmup, WARMUP_RECORDS, args.record_bytes, args.partitions)
        spark = session(args.master, app_name="onceflow-bench-source")
        try:
            batch_read(spark, bootstrap, warmup)   # starts the Python workers, loads the source
            cpu_before = cpu_s()
            plain_s = plain_read(bootstrap, topic, args.records, args.partitions)
            cpu_plain = cpu_s() - cpu_before
            loop_s = loop_read(bootstrap, topic, args.records, args.partitions)
            cpu_loop = cpu_s() - cpu_before - cpu_plain
            batch_s = batch_read(spark, bootstrap, topic)
            stream_s = stream_read(spark, bootstrap, topic, args.records, Path(temp) / "checkpoint")
        finally:
            spark.stop()
    report(args, produce_s, (plain_s, cpu_plain), (loop_s, cpu_loop), batch_s, stream_s)
    return 0


def report(args: argparse.Namespace, produce_s: float, plain: tuple[float, float],
           loop: tuple[float, float], batch_s: float, stream_s: float) -> None:
    """Wall-clock rates, ratios to (a), and this process's CPU per record for (a) and (a2)."""
    n, plain_s = args.records, plain[0]
    print(f"load: {n:,} records x {args.record_bytes} B over {args.partitions} partitions, "
          f"Spark {args.master}, load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"produce (setup)                    {n / produce_s:>12,.0f} records/s")
    rows = (("(a) plain confluent-kafka loop    ", plain_s, plain[1]),
            ("(a2) source read loop, no Spark   ", loop[0], loop[1]),
            ("(b) onceflow-kafka batch -> noop  ", batch_s, None),
            ("(c) onceflow-kafka stream -> noop ", stream_s, None))
    for name, seconds, cpu in rows:
        line = f"{name} {n / seconds:>12,.0f} records/s  ({seconds:6.2f} s)  = {plain_s / seconds:.2f} x (a)"
        if cpu is not None:
            line += f"  client CPU {cpu * 1e6 / n:.2f} us/record"
        print(line)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=RECORDS_DEFAULT)
    parser.add_argument("--record-bytes", type=int, default=RECORD_BYTES_DEFAULT)
    parser.add_argument("--partitions", type=int, default=PARTITIONS_DEFAULT)
    parser.add_argument("--master", default=MASTER_DEFAULT)
    parser.add_argument("--broker", choices=("process", "embedded"), default="process")
    parser.add_argument("--bootstrap", help="use this running broker instead of starting one")
    args = parser.parse_args(argv)
    if args.records <= 0 or args.partitions <= 0 or args.record_bytes <= 0:
        parser.error("--records, --partitions and --record-bytes must be positive")
    return args


def main(argv: list[str]) -> int:
    try:
        return run(parse_args(argv))
    except BenchError as error:
        print(f"benchmark failed: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
