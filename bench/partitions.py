"""Partition scale: create TOPICS x PARTITIONS in one CreateTopics against `onceflow broker`
(a child process, fsync on), print the time, the broker's open descriptors and RSS, then
time a Metadata request for all topics.

    nice -n 10 python bench/partitions.py [--topics 1000] [--partitions 10]
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

from confluent_kafka.admin import AdminClient, NewTopic

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


def time_restart(broker: BrokerProcess, total: int) -> None:
    """kill -9, restart on the same data dir; time until listening and until Metadata lists
    every partition with a leader."""
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
    assert broker.process is not None
    fds, rss_kib = broker_figures(broker.process.pid)
    print(f"after kill -9: listening in {listening_s:.2f} s, Metadata with {led} led "
          f"partitions in {time.monotonic() - start:.2f} s; broker fds {fds}, "
          f"RSS {rss_kib / 1024:.0f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--topics", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=10)
    parser.add_argument("--restart", action="store_true",
                        help="then kill -9 the broker, restart it and time Metadata")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="onceflow-bench-partitions-") as base:
        broker = BrokerProcess(Path(base) / "data").start()
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
            if args.restart:
                time_restart(broker, total)
        finally:
            if broker.process is not None and broker.process.poll() is None:
                broker.process.send_signal(signal.SIGTERM)
                try:
                    broker.process.wait(60)
                except subprocess.TimeoutExpired:
                    broker.process.kill()


if __name__ == "__main__":
    sys.exit(main())
