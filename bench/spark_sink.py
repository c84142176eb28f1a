"""What exactly-once costs the onceflow-kafka Spark sink: the same Kafka -> Kafka query with
the exactly-once sink and with the at-least-once sink, in one run.

    .venv/bin/python bench/spark_sink.py
    .venv/bin/python bench/spark_sink.py --records 1000000 --rounds 3
    .venv/bin/python bench/spark_sink.py --bootstrap 127.0.0.1:9092   # a running broker

Theory of operation. N records of B bytes (a unique id, then padding) are produced once into
a source topic of P partitions. Each run is a streaming query on a local[2] SparkSession:
the onceflow-kafka source reads the source topic from the start (read_committed,
`maxOffsetsPerTrigger` records per micro-batch), passes key and value through, and the
onceflow-kafka sink writes them to a fresh output topic of P partitions with a fresh
checkpoint, under a 1 s processing-time trigger; the run ends when the query has read all
N records. The sink runs exactly once (a transaction per task and batch, plus the
init_transactions and the progress lookup) or at least once (an idempotent producer and a
flush per task); everything else is the same.

Why a limit per trigger: all N records are there before the query starts, so without one
the first micro-batch would take them all - one batch, nothing like a 1 s trigger. The
default limit is about what the at-least-once query moves per second on a 2-core machine,
so batches are ~1 s of work and the per-batch costs of exactly-once (two round trips before
the rows, a commit after them) weigh as they would at a 1 s trigger.

Measured per run: records/s from the start of the first micro-batch to the end of the
last (wall clock: when a batch takes less than the trigger interval, the query idles until
the next trigger, and both sinks are held to maxOffsetsPerTrigger per second); capacity/s,
records per second of batch execution (the sum of `triggerExecution`), which takes those
idle waits out and is the fair comparison of the two sinks' costs; per-batch p50/p95 of
`durationMs.addBatch` (the sink's tasks and its driver-side commit) and
`durationMs.triggerExecution` (the whole batch) from the query's progress. One warm-up
query per mode first starts Spark's Python workers. Each round runs the modes in the
opposite order of the previous one; the report gives medians over the rounds and the
exactly-once / at-least-once ratios (the target: at most 10% lower), with the load average,
since on a shared machine other processes move these figures more than the sink does. The
broker is `onceflow broker` in a child process (fsync on), unless --bootstrap is given.
Every output topic is checked afterwards: read_committed, N distinct ids, and exactly N
records for the exactly-once sink (duplicates are counted for the at-least-once one).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parent))
from idempotence import broker_process  # a sibling file, not a package

RECORDS_DEFAULT = 500_000
RECORD_BYTES_DEFAULT = 100
PARTITIONS_DEFAULT = 4
MAX_OFFSETS_PER_TRIGGER_DEFAULT = 50_000
TRIGGER = "1 second"
ROUNDS_DEFAULT = 3
WARM_UP_RECORDS = 20_000
# exactly-once: atomicity=partition (a transaction per task); exactly-once-batch:
# atomicity=batch (tasks prepare, the driver commits the batch: batch_commit.py)
MODES = ("exactly-once", "exactly-once-batch", "at-least-once")
EXACTLY_ONCE_MODES = ("exactly-once", "exactly-once-batch")
# Bounds far above a healthy run: a stuck query fails the benchmark instead of hanging.
RUN_TIMEOUT_S = 900.0
PROGRESS_POLL_S = 0.5
ADMIN_TIMEOUT_S = 30.0
READ_IDLE_S = 5.0


class BenchError(Exception):
    pass


@dataclasses.dataclass
class Run:
    mode: str
    records: int
    seconds: float
    batches: int
    add_batch_ms: list[int]
    trigger_ms: list[int]
    output: str = ""
    output_records: int = 0
    output_distinct: int = 0

    @property
    def records_per_s(self) -> float:
        """Wall-clock rate, first batch start to last batch end (trigger waits included)."""
        return self.records / self.seconds

    @property
    def capacity_per_s(self) -> float:
        """Records per second of batch execution: the rate with the trigger's idle waits
        taken out, i.e. what the query can do when it is behind."""
        return self.records / (sum(self.trigger_ms) / 1000)


def percentile(values: list[int], fraction: float) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def create_topic(bootstrap: str, topic: str, partitions: int) -> str:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(ADMIN_TIMEOUT_S)
    return topic


def produce_source(bootstrap: str, topic: str, records: int, record_bytes: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20,
                         "enable.idempotence": True, "queue.buffering.max.messages": 1_000_000})
    for i in range(records):
        value = f"{i:012d}".encode().ljust(record_bytes, b".")
        while True:
            try:
                producer.produce(topic, value, str(i).encode())
                break
            except BufferError:
                producer.poll(0.01)
    if producer.flush(ADMIN_TIMEOUT_S * 4):
        raise BenchError("source records still unacknowledged")


def run_query(spark, bootstrap: str, source: str, mode: str, records: int,
              max_offsets: int, partitions: int, checkpoint_root: Path) -> Run:
    output = create_topic(bootstrap, f"bench-sink-out-{uuid.uuid4().hex[:8]}", partitions)
    checkpoint = checkpoint_root / f"{mode}-{uuid.uuid4().hex[:8]}"
    query = (spark.readStream.format("onceflow-kafka")
             .option("kafka.bootstrap.servers", bootstrap).option("subscribe", source)
             .option("startingOffsets", "earliest")
             .option("maxOffsetsPerTrigger", str(max_offsets)).load()
             .select("key", "value")
             .writeStream.format("onceflow-kafka")
             .option("kafka.bootstrap.servers", bootstrap).option("topic", output)
             .option("exactlyOnce", str(mode in EXACTLY_ONCE_MODES).lower())
             .option("atomicity", "batch" if mode == "exactly-once-batch" else "partition")
             .option("checkpointLocation", str(checkpoint))
             .trigger(processingTime=TRIGGER).start())
    progress: dict[int, dict] = {}
    deadline = time.monotonic() + RUN_TIMEOUT_S
    try:
        while sum(p["numInputRows"] for p in progress.values()) < records:
            if query.exception() is not None:
                raise BenchError(f"{mode} query failed: {query.exception()}")
            if time.monotonic() > deadline:
                raise BenchError(f"{mode} query did not read {records} records in time")
            time.sleep(PROGRESS_POLL_S)
            for update in query.recentProgress:
                progress[update["batchId"]] = update
    finally:
        query.stop()
    return summarize(mode, output, progress)


def summarize(mode: str, output: str, progress: dict[int, dict]) -> Run:
    batches = [progress[b] for b in sorted(progress) if progress[b]["numInputRows"] > 0]
    start = parse_time(batches[0]["timestamp"])
    end = max(parse_time(b["timestamp"]) + b["durationMs"]["triggerExecution"] / 1000
              for b in batches)
    run = Run(mode=mode, records=sum(b["numInputRows"] for b in batches), seconds=end - start,
              batches=len(batches),
              add_batch_ms=[b["durationMs"]["addBatch"] for b in batches],
              trigger_ms=[b["durationMs"]["triggerExecution"] for b in batches], output=output)
    return run


def parse_time(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text).timestamp()


def count_output(bootstrap: str, topic: str) -> tuple[int, int]:
    """(records, distinct ids) a read_committed reader sees in `topic`."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex}",
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest"})
    try:
        partitions = consumer.list_topics(topic, timeout=ADMIN_TIMEOUT_S).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        count, ids, idle_since = 0, set(), time.monotonic()
        while time.monotonic() - idle_since < READ_IDLE_S:
            messages = consumer.consume(10_000, 0.5)
            for message in messages:
                if message.error() and message.error().code() != KafkaError._PARTITION_EOF:
                    raise BenchError(str(message.error()))
                if not message.error():
                    count += 1
                    ids.add(message.value()[:12])
            if messages:
                idle_since = time.monotonic()
        return count, len(ids)
    finally:
        consumer.close()


def run_rounds(spark, bootstrap: str, args: argparse.Namespace) -> dict[str, list[Run]]:
    source = create_topic(bootstrap, f"bench-sink-in-{uuid.uuid4().hex[:8]}", args.partitions)
    warm_up = create_topic(bootstrap, f"bench-sink-warm-{uuid.uuid4().hex[:8]}", args.partitions)
    say(f"producing {args.records} records of {args.record_bytes} B to {source}")
    produce_source(bootstrap, source, args.records, args.record_bytes)
    produce_source(bootstrap, warm_up, WARM_UP_RECORDS, args.record_bytes)
    runs: dict[str, list[Run]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory(prefix="onceflow-bench-ckpt-") as root:
        for mode in MODES:
            say(f"warm-up: {mode}")
            run_query(spark, bootstrap, warm_up, mode, WARM_UP_RECORDS, WARM_UP_RECORDS // 4,
                      args.partitions, Path(root))
        for index in range(args.rounds):
            for mode in MODES[index % len(MODES):] + MODES[:index % len(MODES)]:
                say(f"round {index + 1}/{args.rounds}: {mode}")
                run = run_query(spark, bootstrap, source, mode, args.records,
                                args.max_offsets_per_trigger, args.partitions, Path(root))
                run.output_records, run.output_distinct = count_output(bootstrap, run.output)
                check(run, args.records)
                say(f"  {run.records_per_s:,.0f} records/s, capacity "
                    f"{run.capacity_per_s:,.0f}/s, {run.batches} batches, "
                    f"addBatch p50 {percentile(run.add_batch_ms, 0.5)} ms, load {load()}")
                runs[mode].append(run)
    return runs


def check(run: Run, records: int) -> None:
    if run.output_distinct != records:
        raise BenchError(f"{run.mode}: output has {run.output_distinct} distinct ids, "
                         f"expected {records}")
    if run.mode in EXACTLY_ONCE_MODES and run.output_records != records:
        raise BenchError(f"{run.mode} output has {run.output_records} records for {records}")


def median(runs: list[Run], rate) -> float:
    return statistics.median(rate(run) for run in runs)


def median_run(runs: list[Run]) -> Run:
    return sorted(runs, key=lambda r: r.capacity_per_s)[len(runs) // 2]


def load() -> str:
    return " ".join(f"{value:.1f}" for value in os.getloadavg())


def markdown(runs: dict[str, list[Run]], args: argparse.Namespace, command: str,
             loads: tuple[str, str]) -> str:
    title = (f"`{command}` - {args.records} records of {args.record_bytes} B, "
             f"{args.partitions} partitions, maxOffsetsPerTrigger {args.max_offsets_per_trigger}, "
             f"trigger {TRIGGER}, local[2], {args.rounds} round(s); {platform.platform()}, "
             f"{os.cpu_count()} CPUs, load average {loads[0]} at start, {loads[1]} at end")
    header = ("| sink | records/s (median) | capacity/s (median) | batches | "
              "addBatch p50 / p95 ms | triggerExecution p50 / p95 ms | duplicates |")
    lines = [title, "", header, "|---|---:|---:|---:|---:|---:|---:|"]
    for mode in MODES:
        run = median_run(runs[mode])  # its latencies; the rates are medians over all runs
        lines.append(
            f"| {mode} | {median(runs[mode], Run.records_per_s.fget):,.0f} | "
            f"{median(runs[mode], Run.capacity_per_s.fget):,.0f} | {run.batches} | "
            f"{percentile(run.add_batch_ms, 0.5)} / {percentile(run.add_batch_ms, 0.95)} | "
            f"{percentile(run.trigger_ms, 0.5)} / {percentile(run.trigger_ms, 0.95)} | "
            f"{sum(r.output_records - r.output_distinct for r in runs[mode])} |")
    lines.append("")
    pairs = (("exactly-once", "at-least-once"), ("exactly-once-batch", "at-least-once"),
             ("exactly-once-batch", "exactly-once"))
    for name, rate in (("records/s", Run.records_per_s.fget),
                       ("capacity/s", Run.capacity_per_s.fget)):
        ratios = "; ".join(
            f"{a} / {b} = {median(runs[a], rate) / median(runs[b], rate):.3f} "
            f"({(1 - median(runs[a], rate) / median(runs[b], rate)) * 100:+.1f}% cost)"
            for a, b in pairs)
        all_runs = "; ".join(f"{mode} " + ", ".join(f"{rate(r):,.0f}" for r in runs[mode])
                             for mode in MODES)
        lines.append(f"- {name}: {ratios}; all runs: {all_runs}")
    return "\n".join(lines)


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=RECORDS_DEFAULT)
    parser.add_argument("--record-bytes", type=int, default=RECORD_BYTES_DEFAULT)
    parser.add_argument("--partitions", type=int, default=PARTITIONS_DEFAULT)
    parser.add_argument("--max-offsets-per-trigger", type=int,
                        default=MAX_OFFSETS_PER_TRIGGER_DEFAULT)
    parser.add_argument("--rounds", type=int, default=ROUNDS_DEFAULT)
    parser.add_argument("--bootstrap", help="a running broker (default: start one)")
    parser.add_argument("--data-root", help="where the started broker keeps its data")
    args = parser.parse_args(argv)
    if args.record_bytes < 12:
        parser.error("--record-bytes must be at least 12 (the record id)")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    command = "python bench/spark_sink.py " + shlex.join(argv)
    from onceflow.spark import session

    with contextlib.ExitStack() as stack:
        bootstrap = args.bootstrap
        if bootstrap is None:
            bootstrap, _pid = stack.enter_context(broker_process(args.data_root, fsync=True))
        spark = session("local[2]", "onceflow-bench-spark-sink",
                        {"spark.sql.streaming.numRecentProgressUpdates": "1000"})
        stack.callback(spark.stop)
        started_load = load()
        runs = run_rounds(spark, bootstrap, args)
    print(markdown(runs, args, command, (started_load, load())))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except BenchError as error:
        print(f"benchmark failed: {error}", file=sys.stderr)
        sys.exit(1)
