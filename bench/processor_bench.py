"""Benchmark of onceflow.processor.

    python bench/processor_bench.py                      # against librdkafka's mock cluster
    python bench/processor_bench.py --bootstrap HOST:PORT

(a) I/O-bound: every task sleeps 10 ms; C tasks run at once (C = concurrency per
    partition x partitions). Little's law bounds the throughput by C / W, with W the
    mean task latency measured in the same run; we report the steady-state throughput
    (between 10 % and 90 % of the records completed, while every lane has a backlog)
    and its ratio to the bound. Target: >= 0.9.
(b) No-op tasks: the processor's throughput next to a plain confluent-kafka consume
    loop over the same records (median of three passes), in the same run. Target:
    >= 100k records/s.

Records are produced before each measurement; group join time is not measured (the
clock starts at the first record handled).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import threading
import time
import uuid
from dataclasses import dataclass

from confluent_kafka import Consumer, Producer, TopicPartition

from onceflow.processor import Processor, ProcessorConfig, Record

PARTITIONS = 4  # the mock cluster auto-creates topics with 4 partitions
KEYS = 10_000
RUN_TIMEOUT_S = 120.0


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def create_topic(bootstrap: str, topic: str, mock: bool) -> None:
    if mock:
        Producer({"bootstrap.servers": bootstrap}).list_topics(topic=topic, timeout=10)
        return
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, PARTITIONS, 1)]).values():
        future.result(timeout=30)


def produce(bootstrap: str, topic: str, count: int) -> None:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 10_000}
    )
    rng = random.Random(7)
    keys = [f"key-{i}".encode() for i in range(KEYS)]
    for _ in range(count):
        while True:
            try:
                producer.produce(topic, key=rng.choice(keys), value=b"0123456789abcdef")
                break
            except BufferError:
                producer.poll(0.01)
    assert producer.flush(60) == 0


class Clocked:
    """Completion times and task latencies recorded by the handlers."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.done_at: list[float] = []
        self.latency_sum_s = 0.0
        self.first_at: float | None = None
        self.finished = threading.Event()
        self.lock = threading.Lock()

    def started(self) -> float:
        now = time.perf_counter()
        if self.first_at is None:
            self.first_at = now
        return now

    def record(self, started: float) -> None:
        now = time.perf_counter()
        with self.lock:
            self.done_at.append(now)
            self.latency_sum_s += now - started
            if len(self.done_at) >= self.expected:
                self.finished.set()


def run_processor(
    bootstrap: str, topic: str, handler, config: ProcessorConfig, clocked: Clocked
) -> None:
    processor = Processor(
        bootstrap_servers=bootstrap,
        group_id=unique("bench"),
        topics=[topic],
        handler=handler,
        config=config,
    )
    processor.start()
    try:
        if not clocked.finished.wait(RUN_TIMEOUT_S):
            raise SystemExit(f"processor did not finish: {len(clocked.done_at)}/{clocked.expected}")
    finally:
        processor.stop()


@dataclass
class IoResult:
    engine: str
    concurrency: int
    throughput: float
    mean_latency_ms: float
    bound: float

    @property
    def ratio(self) -> float:
        return self.throughput / self.bound


def io_bound(
    bootstrap: str, mock: bool, engine: str, per_partition: int, latency_s: float, seconds: float
) -> IoResult:
    concurrency = per_partition * PARTITIONS
    count = int(concurrency / latency_s * seconds)
    topic = unique("bench-io")
    create_topic(bootstrap, topic, mock)
    produce(bootstrap, topic, count)
    clocked = Clocked(count)

    if engine == "asyncio":

        async def handler(record: Record) -> None:
            started = clocked.started()
            await asyncio.sleep(latency_s)
            clocked.record(started)
    else:

        def handler(record: Record) -> None:
            started = clocked.started()
            time.sleep(latency_s)
            clocked.record(started)

    config = ProcessorConfig(concurrency=per_partition, max_pending_records=count)
    run_processor(bootstrap, topic, handler, config, clocked)
    done = sorted(clocked.done_at)
    low, high = done[len(done) // 10], done[len(done) * 9 // 10]
    throughput = (len(done) * 8 // 10) / (high - low)
    mean_latency = clocked.latency_sum_s / len(done)
    return IoResult(
        engine, concurrency, throughput, mean_latency * 1000, concurrency / mean_latency
    )


def plain_loop(bootstrap: str, topic: str, count: int) -> float:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": unique("plain"), "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    seen, first = 0, None
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while seen < count and time.monotonic() < deadline:
        for message in consumer.consume(500, 1.0):
            if message.error() is None:
                if first is None:
                    first = time.perf_counter()
                message.value()
                seen += 1
    elapsed = time.perf_counter() - first
    consumer.close()
    return seen / elapsed


def no_op(
    bootstrap: str, mock: bool, count: int, engine: str, per_partition: int
) -> tuple[float, float]:
    topic = unique("bench-noop")
    create_topic(bootstrap, topic, mock)
    produce(bootstrap, topic, count)
    # Median of three: when one fetch happens to bring the whole topic, a single run
    # measures only Python's iteration over messages already in memory.
    plain = statistics.median(plain_loop(bootstrap, topic, count) for _ in range(3))
    counter = [0]
    first: list[float] = []
    finished = threading.Event()

    def handler(record: Record) -> None:
        # No per-record lock: a list append and an int add are atomic enough for a count
        # that only needs to reach `count` (lanes never run the same record twice).
        if not first:
            first.append(time.perf_counter())
        counter[0] += 1
        if counter[0] >= count:
            finished.set()

    async def async_handler(record: Record) -> None:
        handler(record)

    config = ProcessorConfig(concurrency=per_partition)
    processor = Processor(
        bootstrap_servers=bootstrap,
        group_id=unique("bench"),
        topics=[topic],
        handler=async_handler if engine == "asyncio" else handler,
        config=config,
    )
    processor.start()
    try:
        if not finished.wait(RUN_TIMEOUT_S):
            raise SystemExit(f"no-op run did not finish: {counter[0]}/{count}")
        elapsed = time.perf_counter() - first[0]
    finally:
        processor.stop()
    return plain, count / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bootstrap", help="a Kafka cluster to use instead of the mock cluster")
    parser.add_argument(
        "--io-seconds", type=float, default=4.0, help="length of each I/O-bound run"
    )
    parser.add_argument("--latency-ms", type=float, default=10.0)
    parser.add_argument("--noop-records", type=int, default=200_000)
    args = parser.parse_args()

    owner = None
    bootstrap = args.bootstrap
    if bootstrap is None:
        owner = Producer({"test.mock.num.brokers": 3, "log_level": 4})
        brokers = owner.list_topics(timeout=10).brokers.values()
        bootstrap = ",".join(f"{b.host}:{b.port}" for b in brokers)
    mock = args.bootstrap is None
    print(f"cluster: {'librdkafka mock (in-process, 3 brokers)' if mock else bootstrap}")

    print(
        f"\n(a) I/O-bound tasks, {args.latency_ms:g} ms sleep; Little's-law bound = C / mean latency"
    )
    print(f"{'engine':8} {'C':>5} {'records/s':>11} {'latency ms':>11} {'bound/s':>9} {'ratio':>6}")
    for engine, per_partition in (
        ("thread", 16),
        ("thread", 64),
        ("asyncio", 64),
        ("asyncio", 256),
    ):
        result = io_bound(
            bootstrap, mock, engine, per_partition, args.latency_ms / 1000, args.io_seconds
        )
        print(
            f"{result.engine:8} {result.concurrency:>5} {result.throughput:>11,.0f} "
            f"{result.mean_latency_ms:>11.2f} {result.bound:>9,.0f} {result.ratio:>6.3f}"
        )

    print(f"\n(b) no-op tasks, {args.noop_records:,} records")
    print(
        f"{'engine':8} {'lanes/partition':>15} {'plain loop/s':>13} {'processor/s':>12} {'share':>6}"
    )
    for engine, per_partition in (("thread", 1), ("thread", 8), ("asyncio", 8)):
        plain, processed = no_op(bootstrap, mock, args.noop_records, engine, per_partition)
        print(
            f"{engine:8} {per_partition:>15} {plain:>13,.0f} {processed:>12,.0f} {processed / plain:>6.2f}"
        )
    del owner


if __name__ == "__main__":
    main()
