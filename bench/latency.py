"""End-to-end latency at a fixed rate: onceflow against librdkafka's mock cluster, one run.

    .venv/bin/python bench/latency.py                       # 5,000 records/s, 10 s, acks=1 and all
    .venv/bin/python bench/latency.py --rate 2000 --seconds 20 --acks all

Theory of operation: issue 19 sets end-to-end latency goals at 5,000 records/s with
`linger.ms=0` (p99 <= 3 ms with acks=1, <= 5 ms with acks=all and fsync on) and broker CPU
below 30 % of a core at that load. For each system and acks setting one producer process
sends 100-byte records at the fixed rate, one record per produce() call paced by the
clock, each carrying its send time (`time.time_ns()`); one consumer process, assigned to
the partition from its end before the producer starts, records `time.time_ns()` on receipt
(default client settings apart from `fetch.wait.max.ms`, which only bounds an empty wait).
Both are separate processes so neither waits for the other's GIL; the clock is the same
machine's. The first second is warm-up and not counted. Reported: the latency's p50 / p99
/ p99.9 / max, and for onceflow (a child process, fsync on) the broker's CPU over the
counted seconds as a share of one core, next to the producer's and the consumer's (on two
shared cores, a row whose three add up to near 200 % measures the machine's queue).
References in the same run: tansu (a Rust Kafka-compatible broker, in-memory storage, from the `bench` extra; its CPU too) and
librdkafka's mock cluster (in this process, on librdkafka's C threads). The mock holds a
fetch that found nothing for the whole `fetch.wait.max.ms` (a produce does not wake it), so
its consumer uses 1 ms instead of 100 ms: its rows are then the floor the clients and this
benchmark set (sub-millisecond at p50), a sanity check rather than a broker.

The producer sleeps until each record is due and never spins: the first version busy-waited
with poll(0) between records, took a whole core of the two, and every acks=1 row (the
mock's too) measured seconds of client-side backlog instead of a broker.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import _tansu
from _mock_cluster import MockCluster
from throughput import CpuClock, create_topic_via_admin, onceflow_process, process_cpu_s

TOPIC = "latency"
VALUE_BYTES = 100
WARMUP_S = 1.0
DRAIN_S = 5.0
MOCK_FETCH_WAIT_MS = 1   # the mock does not wake a waiting fetch on produce: see above


def produce(bootstrap: str, acks: str, rate: int, seconds: float, start_at: float) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": acks,
                         "enable.idempotence": acks == "all"})
    padding = b"x" * VALUE_BYTES
    while time.time() < start_at:
        time.sleep(0.001)
    total, began = int(rate * seconds), time.perf_counter()
    for i in range(total):
        # Sleep, never spin, until the record is due: a busy-waiting producer takes a whole
        # core of the two, and the consumer and broker then queue behind it (seconds of
        # backlog on the client side in the first version of this benchmark). The due
        # times are absolute, so a late wake-up is caught up by the next records.
        due = began + i / rate
        while (now := time.perf_counter()) < due:
            time.sleep(due - now)
        producer.produce(TOPIC, (str(time.time_ns()) + " ").encode() + padding, partition=0)
        producer.poll(0)   # serves the delivery reports so the producer's queue stays short
    producer.flush(30)


def consume(bootstrap: str, expected: int, out: multiprocessing.Queue, ready,
            fetch_wait_ms: int) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "latency-bench",
                         "enable.auto.commit": False, "fetch.wait.max.ms": fetch_wait_ms})
    _low, high = consumer.get_watermark_offsets(TopicPartition(TOPIC, 0), timeout=30)
    consumer.assign([TopicPartition(TOPIC, 0, high)])
    ready.set()
    latencies: list[tuple[int, int]] = []   # (sent ns, latency ns)
    deadline = None
    while len(latencies) < expected:
        # poll() returns as soon as one record is there; consume(n, timeout) would wait
        # for n records or the timeout (up to 100 ms more latency at this rate)
        message = consumer.poll(0.1)
        if message is not None and message.error() is None:
            now = time.time_ns()
            sent = int(message.value().split(b" ", 1)[0])
            latencies.append((sent, now - sent))
        if len(latencies) >= expected * 0.999 and deadline is None:
            deadline = time.monotonic() + DRAIN_S
        if deadline is not None and time.monotonic() > deadline:
            break
    consumer.close()
    out.put(latencies)


def measure(name: str, bootstrap: str, acks: str, rate: int, seconds: float,
            broker_pid: int | None, fetch_wait_ms: int = 100) -> dict:
    context = multiprocessing.get_context("spawn")
    out, ready = context.Queue(), context.Event()
    expected = int(rate * seconds)
    reader = context.Process(target=consume,
                             args=(bootstrap, expected, out, ready, fetch_wait_ms))
    reader.start()
    ready.wait(60)
    start_at = time.time() + 1.0
    writer = context.Process(target=produce, args=(bootstrap, acks, rate, seconds, start_at))
    writer.start()
    time.sleep(max(start_at - time.time(), 0) + WARMUP_S)
    clients = (writer.pid, reader.pid)
    cpu_before, counted_from = process_cpu_s(broker_pid), time.monotonic()
    clients_before = [process_cpu_s(pid) for pid in clients]
    time.sleep(max(seconds - WARMUP_S - 0.5, 0.5))
    cpu_after, counted_s = process_cpu_s(broker_pid), time.monotonic() - counted_from
    clients_cpu = [(after or 0.0) - (before or 0.0) for before, after
                   in zip(clients_before, [process_cpu_s(pid) for pid in clients], strict=True)]
    writer.join(seconds + 60)
    latencies = out.get(timeout=seconds + 60)
    reader.join(30)
    first_counted = (start_at + WARMUP_S) * 1e9
    counted = sorted(lat for sent, lat in latencies if sent >= first_counted)
    cpu = None if cpu_before is None or cpu_after is None else (cpu_after - cpu_before) / counted_s
    return {"name": name, "acks": acks, "received": len(latencies), "expected": expected,
            "ms": [q / 1e6 for q in quantiles(counted)], "cpu": cpu,
            "producer_cpu": clients_cpu[0] / counted_s, "consumer_cpu": clients_cpu[1] / counted_s}


def quantiles(values: list[int]) -> list[float]:
    if not values:
        return [float("nan")] * 4
    cuts = statistics.quantiles(values, n=1000, method="inclusive")
    return [statistics.median(values), cuts[989], cuts[998], values[-1]]


def row(result: dict) -> str:
    p50, p99, p999, top = result["ms"]
    cpu = "-" if result["cpu"] is None else f"{result['cpu'] * 100:.0f} %"
    lost = "" if result["received"] >= result["expected"] else \
        f" ({result['expected'] - result['received']} not received)"
    return (f"| {result['name']} | {result['acks']} | {p50:.2f} | {p99:.2f} | {p999:.2f} | "
            f"{top:.1f} | {cpu} | {result['producer_cpu'] * 100:.0f} % | "
            f"{result['consumer_cpu'] * 100:.0f} % |{lost}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=int, default=5000, help="records per second")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--acks", choices=("1", "all", "both"), default="both")
    parser.add_argument("--systems", default="mock,tansu,onceflow",
                        help="comma-separated subset of mock,tansu,onceflow")
    args = parser.parse_args()
    systems = set(args.systems.split(","))
    acks_list = ["1", "all"] if args.acks == "both" else [args.acks]
    results = []
    with MockCluster(num_brokers=1) as mock:
        mock.create_topic(TOPIC, 1)
        for acks in acks_list if "mock" in systems else []:
            results.append(measure("librdkafka mock cluster", mock.bootstrap_servers, acks,
                                   args.rate, args.seconds, None, MOCK_FETCH_WAIT_MS))
    notes = []
    if "tansu" not in systems:
        pass
    elif _tansu.available() is None:
        with _tansu.tansu_broker() as (bootstrap, pid):
            create_topic_via_admin(bootstrap, TOPIC, 1)
            for acks in acks_list:
                results.append(measure("tansu (memory)", bootstrap, acks, args.rate,
                                       args.seconds, pid))
    else:
        notes.append(f"tansu left out: {_tansu.available()}")
    with tempfile.TemporaryDirectory(prefix="onceflow-bench-latency-") as tmp:
        cpu = CpuClock()
        with onceflow_process(Path(tmp) / "data", fsync=True, cpu=cpu) as bootstrap:
            create_topic_via_admin(bootstrap, TOPIC, 1)
            for acks in acks_list if "onceflow" in systems else []:
                results.append(measure("onceflow (fsync on)", bootstrap, acks, args.rate,
                                       args.seconds, cpu.broker_pid))
    print(f"Command: python {shlex.join(['bench/latency.py', *sys.argv[1:]])}")
    print(f"{args.rate:,} records/s of {VALUE_BYTES} B for {args.seconds:.0f} s, linger.ms=0, "
          f"first {WARMUP_S:.0f} s not counted; Python {platform.python_version()}, "
          f"{multiprocessing.cpu_count()} CPUs\n")
    print("| cluster | acks | p50 ms | p99 ms | p99.9 ms | max ms | broker CPU | producer CPU "
          "| consumer CPU |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for result in results:
        print(row(result))
    for note in notes:
        print(f"\n{note}")
    print(json.dumps(results), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
