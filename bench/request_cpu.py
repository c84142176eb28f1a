"""Broker CPU per small request: one-record produce requests at a fixed rate, onceflow only.

    PYTHONPATH=src .venv/bin/python bench/request_cpu.py                 # acks=1, 2,000/s, 6 s
    PYTHONPATH=/path/to/other/tree/src .venv/bin/python bench/request_cpu.py --acks all

Theory of operation: issue 19 asks what each change on the request path buys in broker
CPU. At a rate the broker keeps up with, its CPU time divided by the requests served is
the cost of one request, less sensitive to a shared machine's queue than a latency. One
confluent-kafka producer sends `--rate` records a second, one record per Produce request
(`linger.ms` 0, `batch.num.messages` 1), sleeping between records; the broker is
`python -m onceflow broker` in a child process (fsync on), so `PYTHONPATH` chooses the tree
measured (for A/B runs of two commits, `git archive` each into a directory). With
`--consumer`, one consumer reads along (its Fetch requests count in the broker's CPU, not
in the divisor). Printed: broker CPU as a share of one core and microseconds per produce
request; with `--consumer` also the consumer's Fetch requests in the measured window (from
librdkafka's statistics, every 100 ms) and microseconds per request, produce and fetch
alike (a loaded broker answers fewer, larger fetches: per produce request alone hides that). Repeat and interleave the variants: on a shared machine one run's spread is large.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

sys.path.insert(0, str(Path(__file__).resolve().parent))

from throughput import CpuClock, create_topic_via_admin, onceflow_process, process_cpu_s

TOPIC = "request-cpu"
VALUE = b"x" * 100


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--acks", choices=("0", "1", "all"), default="1")
    parser.add_argument("--rate", type=int, default=2000, help="requests per second")
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--consumer", action="store_true", help="a consumer reads along")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="onceflow-bench-request-cpu-") as tmp:
        cpu = CpuClock()
        with onceflow_process(Path(tmp) / "data", fsync=True, cpu=cpu) as bootstrap:
            create_topic_via_admin(bootstrap, TOPIC, 1)
            producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0,
                                 "batch.num.messages": 1, "acks": args.acks,
                                 "enable.idempotence": args.acks == "all"})
            producer.produce(TOPIC, b"warm-up", partition=0)
            producer.flush(30)
            stop = threading.Event()
            fetches = FetchCount()
            reader = threading.Thread(target=read_along, args=(bootstrap, stop, fetches))
            if args.consumer:
                reader.start()
                time.sleep(1)
            requests = int(args.rate * args.seconds)
            cpu_before, start = process_cpu_s(cpu.broker_pid), time.perf_counter()
            fetches_before = fetches.value
            for i in range(requests):
                due = start + i / args.rate
                while (now := time.perf_counter()) < due:
                    time.sleep(due - now)
                producer.produce(TOPIC, VALUE, partition=0)
                producer.poll(0)
            producer.flush(60)
            cpu_after, seconds = process_cpu_s(cpu.broker_pid), time.perf_counter() - start
            time.sleep(2 * STATISTICS_INTERVAL_MS / 1000)   # the last fetches' statistics
            fetched = fetches.value - fetches_before
            stop.set()
            if args.consumer:
                reader.join()
    if cpu_before is None or cpu_after is None:
        print("broker CPU unknown (no /proc)")
        return 1
    used = cpu_after - cpu_before
    print(f"acks={args.acks} {args.rate:,} requests/s for {args.seconds:.0f} s"
          f"{' with a consumer' if args.consumer else ''}: broker {used / seconds * 100:.0f} % "
          f"of a core, {used / requests * 1e6:.0f} us per produce request")
    if args.consumer:
        print(f"{fetched:,} Fetch requests: {used / (requests + fetched) * 1e6:.0f} us per "
              f"request (produce and fetch)")
    return 0


STATISTICS_INTERVAL_MS = 100


class FetchCount:
    """The consumer's Fetch requests so far, from librdkafka's statistics."""

    def __init__(self) -> None:
        self.value = 0

    def statistics(self, stats_json: str) -> None:
        brokers = json.loads(stats_json).get("brokers", {}).values()
        self.value = sum(broker.get("req", {}).get("Fetch", 0) for broker in brokers)


def read_along(bootstrap: str, stop: threading.Event, fetches: FetchCount) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "request-cpu",
                         "enable.auto.commit": False,
                         "statistics.interval.ms": STATISTICS_INTERVAL_MS,
                         "stats_cb": fetches.statistics})
    consumer.assign([TopicPartition(TOPIC, 0, 1)])
    while not stop.is_set():
        consumer.consume(1000, 0.1)
    consumer.close()


if __name__ == "__main__":
    sys.exit(main())
