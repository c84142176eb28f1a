"""How fast the console's overview and a topic page load with many topics and partitions.

    .venv/bin/python bench/console.py                          # 1,000 topics x 10 partitions
    .venv/bin/python bench/console.py --topics 500 --partitions 10
    .venv/bin/python bench/console.py --skip-onceflow          # only the mock cluster

Theory of operation: the issue's goal is the overview and a topic page under 300 ms
with 1,000 topics and 10,000 partitions. Two clusters are measured in one run:

- **onceflow**: `onceflow broker` in a child process (`--no-fsync`: creating the
  partitions is setup, not what is measured), temporary data dir, topics created in
  batches of `CREATE_BATCH_TOPICS` through the AdminClient (the time it takes is
  reported: it is the broker's cost, issue 19);
- **mock**: librdkafka's mock cluster (bench/_mock_cluster.py) holding the same topics
  in memory: the same pages against a cluster whose answers cost next to nothing.

For each, the console (`create_app`, sampler on) is served by uvicorn on a thread and
loaded with httpx over a real socket: `/` and `/topics/<topic>` `--loads` times each,
`LOAD_SPACING_S` apart, after one warm-up load (the first connects the clients). Reported:
median, 90th percentile and slowest load, and, as a reference in the same run, the Kafka calls a topic
page makes timed alone (full metadata; ListOffsets x3 for the topic's partitions) and
one overview sample (which runs in the background, every 2 s, and grows with the
partition count).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
from confluent_kafka import IsolationLevel, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from _mock_cluster import MockCluster

from onceflow.client.cluster import list_offsets
from onceflow.console.app import create_app
from onceflow.console.backend import Backend
from onceflow.console.model.overview import take_sample
from onceflow.console.server import console_server
from onceflow.console.settings import ConsoleSettings
from onceflow.testing import free_port

CREATE_BATCH_TOPICS = 50
# Loads are spread over longer than the console's metadata age (2 s), as a person's are,
# so the measured loads include those that find the metadata stale.
LOAD_SPACING_S = 0.3
CREATE_TIMEOUT_S = 600.0
START_TIMEOUT_S = 120.0
GOAL_MS = 300


@contextlib.contextmanager
def onceflow_broker(data_dir: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    port = free_port()
    with open(data_dir.parent / "broker.log", "w") as log:
        process = subprocess.Popen([sys.executable, "-m", "onceflow", "broker", "--data-dir",
                                    str(data_dir), "--port", str(port), "--no-fsync"],
                                   stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            line = process.stdout.readline()
            if "listening on" in line:
                break
            if not line and process.poll() is not None:
                raise RuntimeError("the broker did not start")
        yield f"127.0.0.1:{port}", process
    finally:
        process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(60)
        if process.poll() is None:
            process.kill()


def create_topics(bootstrap: str, names: list[str], partitions: int) -> float:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    started = time.monotonic()
    for first in range(0, len(names), CREATE_BATCH_TOPICS):
        batch = names[first:first + CREATE_BATCH_TOPICS]
        futures = admin.create_topics([NewTopic(n, partitions, 1) for n in batch],
                                      operation_timeout=CREATE_TIMEOUT_S,
                                      request_timeout=CREATE_TIMEOUT_S)
        for future in futures.values():
            future.result(CREATE_TIMEOUT_S)
        print(f"  created {first + len(batch)} topics", file=sys.stderr, flush=True)
    return time.monotonic() - started


@contextlib.contextmanager
def served_console(bootstrap: str) -> Iterator[str]:
    server = console_server(create_app(ConsoleSettings(bootstrap)), "127.0.0.1", 0)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)


def timed_loads(url: str, path: str, loads: int) -> list[float]:
    times = []
    with httpx.Client(base_url=url, timeout=120) as http:
        answer = http.get(path)                                     # warm-up
        if answer.status_code != 200:
            raise RuntimeError(f"{path}: {answer.status_code} {answer.text[-300:]}")
        for _ in range(loads):
            time.sleep(LOAD_SPACING_S)
            started = time.perf_counter()
            answer = http.get(path)
            times.append((time.perf_counter() - started) * 1000)
            assert answer.status_code == 200, answer.status_code
    return times


def reference_ms(bootstrap: str, topic: str, partitions: int) -> tuple[float, float, float]:
    """(full metadata, ListOffsets x3 for one topic, one overview sample) in ms."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.list_topics(timeout=60)
    started = time.perf_counter()
    admin.list_topics(timeout=60)
    metadata_ms = (time.perf_counter() - started) * 1000
    keys = [(topic, p) for p in range(partitions)]
    started = time.perf_counter()
    for spec, isolation in ((OffsetSpec.earliest(), IsolationLevel.READ_UNCOMMITTED),
                            (OffsetSpec.latest(), IsolationLevel.READ_UNCOMMITTED),
                            (OffsetSpec.latest(), IsolationLevel.READ_COMMITTED)):
        list_offsets(admin, keys, spec, isolation)
    offsets_ms = (time.perf_counter() - started) * 1000
    backend = Backend(bootstrap)
    take_sample(backend, 0)
    started = time.perf_counter()
    take_sample(backend, 0)
    sample_ms = (time.perf_counter() - started) * 1000
    backend.close()
    return metadata_ms, offsets_ms, sample_ms


def measure(name: str, bootstrap: str, topic: str, partitions: int, loads: int) -> dict:
    with served_console(bootstrap) as url:
        time.sleep(3)   # one overview sample taken, as a visitor would find it
        overview = timed_loads(url, "/", loads)
        page = timed_loads(url, f"/topics/{topic}", loads)
    metadata_ms, offsets_ms, sample_ms = reference_ms(bootstrap, topic, partitions)
    return {"name": name, "overview": overview, "topic": page, "metadata_ms": metadata_ms,
            "offsets_ms": offsets_ms, "sample_ms": sample_ms}


def spread(times: list[float]) -> str:
    """median / 90th percentile / slowest, in ms."""
    p90 = statistics.quantiles(times, n=10)[-1] if len(times) > 1 else times[0]
    return f"{statistics.median(times):.0f} / {p90:.0f} / {max(times):.0f}"


def row(result: dict) -> str:
    return (f"| {result['name']} | {spread(result['overview'])} | {spread(result['topic'])} | "
            f"{result['metadata_ms']:.0f} | {result['offsets_ms']:.0f} | "
            f"{result['sample_ms']:.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--topics", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=10)
    parser.add_argument("--loads", type=int, default=20)
    parser.add_argument("--skip-onceflow", action="store_true")
    args = parser.parse_args()
    names = [f"bench-{i:05d}" for i in range(args.topics)]
    topic = names[len(names) // 2]
    total = args.topics * args.partitions
    results, notes = [], []
    if not args.skip_onceflow:
        with tempfile.TemporaryDirectory(prefix="onceflow-bench-console-") as tmp, \
                onceflow_broker(Path(tmp) / "data") as (bootstrap, process):
            try:
                seconds = create_topics(bootstrap, names, args.partitions)
                notes.append(f"onceflow: creating {total:,} partitions took {seconds:.0f} s "
                             f"({seconds / total * 1000:.1f} ms per partition)")
                results.append(measure("onceflow", bootstrap, topic, args.partitions,
                                       args.loads))
            except (KafkaException, RuntimeError) as exc:
                log = (Path(tmp) / "broker.log").read_text()[-600:]
                notes.append(f"onceflow: setup failed ({exc}); broker alive: "
                             f"{process.poll() is None}; its log ends: {log!r}")
    with MockCluster(1) as mock:
        for name in names:
            mock.create_topic(name, args.partitions)
        results.append(measure("librdkafka mock cluster", mock.bootstrap_servers, topic,
                               args.partitions, args.loads))
    print(f"\nCommand: {shlex.join([Path(sys.executable).name, *sys.argv])}")
    print(f"{args.topics:,} topics x {args.partitions} partitions = {total:,} partitions; "
          f"{args.loads} loads per page; Python {platform.python_version()}, "
          f"{os.cpu_count()} CPUs; goal: under {GOAL_MS} ms\n")
    print("| cluster | overview ms (median / p90 / max) | topic page ms (median / p90 / max) | "
          "reference: metadata ms | reference: ListOffsets x3 ms | overview sample ms |")
    print("|---|---:|---:|---:|---:|---:|")
    for result in results:
        print(row(result))
    for note in notes:
        print(f"\n{note}")


if __name__ == "__main__":
    main()
