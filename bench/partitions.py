"""Partition scale: create TOPICS x PARTITIONS in one CreateTopics against `onceflow broker`
(a child process, fsync on), print the time, the broker's open descriptors and RSS, then
time a Metadata request for all topics. `--records N` then writes N records to every
partition (acks=all). `--restart` then kills the broker (SIGKILL; with `--clean` stops it
with SIGTERM, a clean shutdown), restarts it on the same data dir and prints the time until
it listens, until Metadata lists every partition with a leader, and until one Fetch per
node (every partition it leads, offset 0) answers every partition without error, with the
RSS then.

    nice -n 10 python bench/partitions.py [--topics 1000] [--partitions 10] [--records 0]
        [--nodes 1] [--restart [--clean]]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from onceflow.client.wire import Connection
from onceflow.protocol.apis import ApiKey
from onceflow.testing import BrokerProcess

TIMEOUT_S = 600


def broker_figures(pid: int) -> tuple[int, int]:
    """(open descriptors, RSS in KiB) of the broker process."""
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    rss_kib = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss_kib = int(line.split()[1])
    return fds, rss_kib


def produce_records(bootstrap: str, topics: int, partitions: int, records: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 20})
    for t in range(topics):
        for p in range(partitions):
            for r in range(records):
                while True:
                    try:
                        producer.produce(f"p-{t}", b"x" * 100, partition=p)
                        break
                    except BufferError:
                        producer.poll(0.1)
        producer.poll(0)
    assert producer.flush(TIMEOUT_S) == 0


def fetch_errors(host: str, port: int, partitions: dict[str, list[int]]) -> int:
    """One Fetch (v12, offset 0, 1 KiB per partition) of `partitions` from one node; returns
    how many partitions answered with an error."""
    with Connection(host, port, timeout_s=TIMEOUT_S) as conn:
        answer = conn.call(
            ApiKey.FETCH, (12, 12), replica_id=-1, max_wait=0, min_bytes=0,
            max_bytes=64 << 20, isolation_level=0, session_id=0, session_epoch=-1,
            topics=[{"topic": topic, "partitions": [
                {"partition": p, "current_leader_epoch": -1, "fetch_offset": 0,
                 "log_start_offset": -1, "partition_max_bytes": 1024} for p in indexes]}
                for topic, indexes in partitions.items()],
            forgotten_topics_data=[], rack_id="")
    answered = sum(1 for t in answer.responses for p in t.partitions if p.error_code == 0)
    return sum(len(v) for v in partitions.values()) - answered


def time_restart(broker: BrokerProcess, total: int, clean: bool = False) -> None:
    """kill -9 (`clean`: SIGTERM), restart on the same data dir; time until listening, until
    Metadata lists every partition with a leader and until a Fetch answers every partition."""
    if clean:
        stop_start = time.monotonic()
        broker.stop()
        print(f"clean shutdown: {time.monotonic() - stop_start:.2f} s")
    else:
        broker.kill()
    start = time.monotonic()
    broker.start()  # returns once the broker prints that it listens
    listening_s = time.monotonic() - start
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    while True:
        metadata = admin.list_topics(timeout=TIMEOUT_S)
        led = sum(1 for t in metadata.topics.values() for p in t.partitions.values()
                  if p.leader >= 0 and not t.topic.startswith("__"))
        if led >= total or time.monotonic() - start > TIMEOUT_S:
            break
    metadata_s = time.monotonic() - start
    by_leader: dict[int, dict[str, list[int]]] = {}
    for t in metadata.topics.values():
        if not t.topic.startswith("__"):
            for p in t.partitions.values():
                by_leader.setdefault(p.leader, {}).setdefault(t.topic, []).append(p.id)
    fetches, backoff_s = 0, 0.1  # retry as clients do: retry.backoff.ms 100 doubling to 1 s
    while True:
        failed = 0
        for node, partitions in by_leader.items():
            broker_info = metadata.brokers[node]
            failed += fetch_errors(broker_info.host, broker_info.port, partitions)
            fetches += 1
        if not failed or time.monotonic() - start > TIMEOUT_S:
            break
        time.sleep(backoff_s)
        backoff_s = min(backoff_s * 2, 1.0)
    fetch_s = time.monotonic() - start
    assert broker.process is not None
    fds, rss_kib = broker_figures(broker.process.pid)
    recovered = [line for line in broker.log_path.read_text().splitlines()
                 if "recovered" in line and "partitions in" in line]
    print(f"broker log: {recovered[-1].split(': ', 1)[-1] if recovered else 'recovery not done'}")
    print(f"after {'a clean shutdown' if clean else 'kill -9'}: listening in {listening_s:.2f} s, Metadata with {led} led "
          f"partitions in {metadata_s:.2f} s, Fetch answered every partition in "
          f"{fetch_s:.2f} s ({fetches} Fetch requests, {failed} partitions still failing); "
          f"broker fds {fds}, RSS {rss_kib / 1024:.0f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--topics", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=10)
    parser.add_argument("--records", type=int, default=0,
                        help="records of 100 bytes written to every partition")
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--restart", action="store_true",
                        help="then kill -9 the broker, restart it and time Metadata and Fetch")
    parser.add_argument("--clean", action="store_true",
                        help="with --restart: stop the broker cleanly (SIGTERM) instead")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="onceflow-bench-partitions-") as base:
        broker = BrokerProcess(Path(base) / "data", nodes=args.nodes).start()
        try:
            assert broker.process is not None
            admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
            topics = [NewTopic(f"p-{i}", args.partitions, 1) for i in range(args.topics)]
            start = time.monotonic()
            futures = admin.create_topics(topics, request_timeout=TIMEOUT_S,
                                          operation_timeout=TIMEOUT_S)
            for future in futures.values():
                future.result(TIMEOUT_S)
            created_s = time.monotonic() - start
            total = args.topics * args.partitions
            fds, rss_kib = broker_figures(broker.process.pid)
            print(f"create {args.topics} topics x {args.partitions} partitions = {total}: "
                  f"{created_s:.2f} s ({created_s / total * 1000:.2f} ms/partition); "
                  f"broker fds {fds}, RSS {rss_kib / 1024:.0f} MiB")
            start = time.monotonic()
            metadata = admin.list_topics(timeout=TIMEOUT_S)
            listed = sum(len(t.partitions) for t in metadata.topics.values())
            print(f"metadata for all topics ({listed} partitions): "
                  f"{time.monotonic() - start:.2f} s")
            if args.records:
                start = time.monotonic()
                produce_records(broker.bootstrap_servers, args.topics, args.partitions,
                                args.records)
                print(f"wrote {args.records} records to each partition: "
                      f"{time.monotonic() - start:.2f} s")
            if args.restart:
                time_restart(broker, total, args.clean)
        finally:
            if broker.process is not None and broker.process.poll() is None:
                broker.process.send_signal(signal.SIGTERM)
                try:
                    broker.process.wait(60)
                except subprocess.TimeoutExpired:
                    broker.process.kill()


if __name__ == "__main__":
    sys.exit(main())
