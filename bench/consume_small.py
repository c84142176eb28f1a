"""Small-record consume: a default-settings consumer of 100-byte records, three systems, one run.

    .venv/bin/python bench/consume_small.py                    # 500,000 records, 1 partition
    .venv/bin/python bench/consume_small.py --records 1000000 --partitions 4

Theory of operation: issue 19 found that a confluent-kafka consumer with default settings
reads 100-byte records from onceflow at a fraction of what the same client reads from a
peer, with neither side's CPU busy: the consumer's prefetch round trips decide the rate,
so how much each Fetch answer carries and how fast it comes back matter. For each system
(tansu with in-memory storage, onceflow as a child process with fsync on; librdkafka's
mock cluster with `--systems mock,...`: it answers one batch per partition per Fetch, so it
reads batches of a few records at round-trip speed - 156 records/s in one run) this bench produces `--records` records of 100 bytes (acks=all,
linger.ms 5, as bench/throughput.py), then reads them all from the beginning with a
consumer that changes nothing but `group.id`, `enable.auto.commit` and
`statistics.interval.ms`. Reported per system: records/s of the read (from assign to the
last record), the broker's CPU (onceflow and tansu), and from librdkafka's own statistics
of the consumer's connection to the broker: the Fetch requests sent, the mean answer size
(bytes received / answers received, all APIs, so a little under the Fetch answers'), and
the round-trip time (librdkafka's `rtt`, request sent to answer read, all requests: mean
over the read and the worst interval's p99, in ms). Then the same Fetch request, sent to
each system with a plain-socket client (tests/kafka_raw.py): the record bytes its answer
carries per partition, against the request's limits. A round trip near `fetch.wait.max.ms` (500 ms by default)
means the broker held a fetch that could have been answered.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import shlex
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import _tansu
from _mock_cluster import MockCluster
from throughput import CpuClock, create_topic_via_admin, onceflow_process, process_cpu_s

TOPIC = "consume-small"
VALUE_BYTES = 100
STATS_INTERVAL_MS = 100
TIMEOUT_S = 300.0
FETCH_MAX_BYTES = 52_428_800       # librdkafka's fetch.max.bytes default
PARTITION_MAX_BYTES = 1_048_576    # librdkafka's max.partition.fetch.bytes default


def produce(bootstrap: str, records: int, partitions: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    value = os.urandom(VALUE_BYTES)
    for i in range(records):
        while True:
            try:
                producer.produce(TOPIC, value, partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.001)
    if producer.flush(TIMEOUT_S):
        raise RuntimeError("produce: records left unacknowledged")


def consume(bootstrap: str, records: int, partitions: int, broker_pid: int | None) -> dict:
    stats: list[dict] = []
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{TOPIC}-{time.time_ns()}",
                         "enable.auto.commit": False,
                         "statistics.interval.ms": STATS_INTERVAL_MS,
                         "stats_cb": lambda text: stats.append(json.loads(text))})
    consumer.get_watermark_offsets(TopicPartition(TOPIC, 0), timeout=30)   # connected
    cpu_before = process_cpu_s(broker_pid)
    start = time.perf_counter()
    consumer.assign([TopicPartition(TOPIC, p, OFFSET_BEGINNING) for p in range(partitions)])
    count, deadline = 0, time.monotonic() + TIMEOUT_S
    while count < records and time.monotonic() < deadline:
        count += sum(1 for m in consumer.consume(min(10_000, records - count), 1.0)
                     if m.error() is None)
    seconds = time.perf_counter() - start
    cpu_after = process_cpu_s(broker_pid)
    time.sleep(2 * STATS_INTERVAL_MS / 1000)
    consumer.poll(0)   # the last statistics
    consumer.close()
    broker = _fetching_broker(stats[-1]) if stats else {}
    answers = broker.get("rx", 0)
    # rtt is a histogram per statistics interval: weigh the intervals' means by their counts
    windows = [w for w in (_fetching_broker(s).get("rtt", {}) for s in stats) if w.get("cnt")]
    rtt_count = sum(w["cnt"] for w in windows)
    rtt = {"avg": sum(w["avg"] * w["cnt"] for w in windows) / rtt_count if rtt_count else 0,
           "p99": max((w["p99"] for w in windows), default=0)}
    return {"records": count, "seconds": seconds, "records_per_s": count / seconds,
            "broker_cpu": None if cpu_before is None or cpu_after is None
            else (cpu_after - cpu_before) / seconds,
            "fetches": broker.get("req", {}).get("Fetch", 0),
            "answer_bytes": broker.get("rxbytes", 0) / answers if answers else 0.0,
            "rtt_ms": (rtt.get("avg", 0) / 1000, rtt.get("p99", 0) / 1000)}


def _fetching_broker(stats: dict) -> dict:
    """The statistics of the broker connection that sent the Fetch requests."""
    brokers = [b for b in stats.get("brokers", {}).values() if b.get("nodeid", -1) >= 0]
    return max(brokers, key=lambda b: b.get("req", {}).get("Fetch", 0), default={})


def run(name: str, bootstrap: str, args: argparse.Namespace, broker_pid: int | None,
        create: bool = True) -> dict:
    if create:
        create_topic_via_admin(bootstrap, TOPIC, args.partitions)
    produce(bootstrap, args.records, args.partitions)
    # The consumer runs in its own process: its GIL is not the mock cluster's.
    context = multiprocessing.get_context("spawn")
    with context.Pool(1) as pool:
        result = pool.apply(consume, (bootstrap, args.records, args.partitions, broker_pid))
    return {"name": name, "expected": args.records, **result,
            "same_fetch": same_fetch(bootstrap, args.partitions)}


def same_fetch(bootstrap: str, partitions: int) -> dict:
    """One Fetch v12 as librdkafka's defaults send it (fetch.max.bytes 52,428,800,
    max.partition.fetch.bytes 1,048,576, every partition from offset 0): the record bytes
    the answer carries per partition and the time it took."""
    from kafka_raw import RawClient  # tests/kafka_raw.py: a plain-socket client

    body = {"max_wait": 500, "min_bytes": 1, "max_bytes": FETCH_MAX_BYTES,
            "topics": [{"topic": TOPIC, "partitions": [
                {"partition": p, "fetch_offset": 0, "partition_max_bytes": PARTITION_MAX_BYTES}
                for p in range(partitions)]}],
            "forgotten_topics_data": []}
    with RawClient(bootstrap) as client:
        start = time.perf_counter()
        answer = client.request(1, 12, body)
        seconds = time.perf_counter() - start
    sizes = [len(p.records or b"") for t in answer.responses for p in t.partitions]
    return {"partition_bytes": sizes, "ms": seconds * 1000}


def row(result: dict) -> str:
    cpu = "-" if result["broker_cpu"] is None else f"{result['broker_cpu'] * 100:.0f} %"
    lost = "" if result["records"] >= result["expected"] else \
        f" (only {result['records']:,} of {result['expected']:,} read)"
    return (f"| {result['name']} | {result['records_per_s']:,.0f} | {result['seconds']:.2f} | "
            f"{cpu} | {result['fetches']:,} | {result['answer_bytes']:,.0f} | "
            f"{result['rtt_ms'][0]:.2f} | {result['rtt_ms'][1]:.2f} |{lost}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=500_000)
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--systems", default="tansu,onceflow",
                        help="comma-separated subset of mock,tansu,onceflow (the mock answers "
                             "one batch per partition per Fetch: very slow here)")
    args = parser.parse_args()
    systems = set(args.systems.split(","))
    results, notes = [], []
    if "mock" in systems:
        with MockCluster(num_brokers=1) as mock:
            mock.create_topic(TOPIC, args.partitions)
            results.append(run("librdkafka mock cluster", mock.bootstrap_servers, args, None,
                               create=False))
    if "tansu" in systems:
        if _tansu.available() is None:
            with _tansu.tansu_broker() as (bootstrap, pid):
                results.append(run("tansu (memory)", bootstrap, args, pid))
        else:
            notes.append(f"tansu left out: {_tansu.available()}")
    if "onceflow" in systems:
        with tempfile.TemporaryDirectory(prefix="onceflow-bench-consume-") as tmp:
            cpu = CpuClock()
            with onceflow_process(Path(tmp) / "data", fsync=True, cpu=cpu) as bootstrap:
                results.append(run("onceflow (fsync on)", bootstrap, args, cpu.broker_pid))
    print(f"Command: python {shlex.join(['bench/consume_small.py', *sys.argv[1:]])}")
    print(f"{args.records:,} records of {VALUE_BYTES} B in {args.partitions} partition(s), "
          f"consumer with default settings; Python {platform.python_version()}, "
          f"{multiprocessing.cpu_count()} CPUs\n")
    print("| cluster | records/s | seconds | broker CPU | Fetch requests | mean answer B "
          "| rtt mean ms | rtt p99 ms |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for result in results:
        print(row(result))
    print(f"\nThe same Fetch v12 (max_bytes {FETCH_MAX_BYTES:,}, partition_max_bytes "
          f"{PARTITION_MAX_BYTES:,}, every partition from offset 0), record bytes per "
          "partition in the answer:\n")
    for result in results:
        fetched = result["same_fetch"]
        print(f"- {result['name']}: {', '.join(f'{b:,}' for b in fetched['partition_bytes'])}"
              f" ({fetched['ms']:.1f} ms)")
    for note in notes:
        print(f"\n{note}")
    print(json.dumps(results), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
