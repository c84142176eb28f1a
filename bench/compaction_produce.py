"""Produce throughput on a compacted topic with the log cleaner running vs without it.

    .venv/bin/python bench/compaction_produce.py                      # 300k records, 3 runs
    .venv/bin/python bench/compaction_produce.py --records 100000 --runs 5 --keys 1000

Theory of operation: each run starts an embedded onceflow broker (fsync on) on a fresh
data dir, creates one topic with cleanup.policy=compact, small segments (1 MiB, so the
cleaner has closed segments to clean during the run) and min.cleanable.dirty.ratio
(`--dirty-ratio`, Kafka's 0.5 by default; 0.01 cleans all the time), and produces `--records` keyed records (keys drawn from `--keys`, `--value-bytes` each)
with confluent-kafka, acks=all. The two modes differ only in log.cleaner.enable, and
alternate run by run (cleaner first on even runs). Throughput is records acknowledged per
second of wall time from the first produce() to the last delivery report, and the
process's CPU time per record (client and broker share the process; CPU time is
steadier than throughput on a shared machine), and apart from it the CPU time of the
cleaner's child process, which does the reading and writing of a cleaning. With the
cleaner on, the measured window opens once that child is up (it starts when the broker
first sees a compacted partition, once per broker lifetime; its start-up CPU, mostly
imports, is reported apart). With the
cleaner on, the script also reports how many cleanings ran during the run, the bytes they
read and the partition's size at the end. Prints one markdown table.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from onceflow.broker.embedded import Broker  # noqa: E402

TOPIC = "bench-compacted"
SEGMENT_BYTES = 1024 * 1024
CLEANER_BACKOFF_MS = 200
TIMEOUT_S = 120


def _log_bytes(directory: Path) -> int:
    total = 0
    for path in directory.glob("*.log"):
        try:
            total += path.stat().st_size
        except FileNotFoundError:  # the cleaner deleted it since the listing
            pass
    return total


def _cpu_s() -> float:
    """CPU seconds of this process so far: broker, cleaner and client threads together."""
    times = os.times()
    return times.user + times.system


def _children_cpu_s(cleaner) -> float:
    """CPU seconds of the cleaner's child process so far (it starts at the first cleaning,
    inside the measured window), from /proc."""
    pool = getattr(cleaner, "_pool", None)
    total = 0.0
    for pid in list(getattr(pool, "_processes", None) or ()):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def run_once(records: int, keys: int, value_bytes: int, cleaner: bool, fsync: bool,
             io_bytes_per_second: float, dirty_ratio: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="onceflow-bench-") as data_dir:
        with Broker(Path(data_dir), log_cleaner_enable=cleaner, fsync=fsync,
                    log_cleaner_io_max_bytes_per_second=io_bytes_per_second,
                    log_cleaner_backoff_ms=CLEANER_BACKOFF_MS,
                    offsets_topic_num_partitions=1,
                    transaction_state_num_partitions=1) as broker:
            bootstrap = broker.bootstrap_servers
            admin = AdminClient({"bootstrap.servers": bootstrap})
            config = {"cleanup.policy": "compact", "segment.bytes": str(SEGMENT_BYTES),
                      "min.cleanable.dirty.ratio": str(dirty_ratio)}
            admin.create_topics([NewTopic(TOPIC, 1, 1, config=config)])[TOPIC].result(TIMEOUT_S)
            producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                                 "linger.ms": 5, "queue.buffering.max.messages": 200_000})
            producer.produce(TOPIC, b"warm-up", key=b"warm-up")
            producer.flush(TIMEOUT_S)
            rng = random.Random(14)
            value = b"v" * value_bytes
            failed = 0

            def report(error, _message) -> None:
                nonlocal failed
                failed += error is not None

            cleaner_state = broker._server.cleaner if broker._server else None
            if cleaner_state is not None:  # its child process starts once per broker
                deadline = time.monotonic() + TIMEOUT_S
                while cleaner_state.child_ready is None and time.monotonic() < deadline:
                    time.sleep(0.05)
                cleaner_state.child_ready.result(TIMEOUT_S)
                startup_cpu = _children_cpu_s(cleaner_state)
            cleanings_before = len(cleaner_state.history) if cleaner_state else 0
            start, cpu_start = time.perf_counter(), _cpu_s()
            for _ in range(records):
                while True:
                    try:
                        producer.produce(TOPIC, value, key=b"key-%d" % rng.randrange(keys),
                                         on_delivery=report)
                        break
                    except BufferError:
                        producer.poll(0.01)
                producer.poll(0)
            producer.flush(TIMEOUT_S)
            elapsed, cpu = time.perf_counter() - start, _cpu_s() - cpu_start
            child_cpu = _children_cpu_s(cleaner_state) - (startup_cpu if cleaner_state else 0)
            done = list(cleaner_state.history)[cleanings_before:] if cleaner_state else []
            size = _log_bytes(Path(data_dir) / f"{TOPIC}-0")
            return {"records_s": (records - failed) / elapsed, "failed": failed,
                    "cpu_us": cpu / records * 1e6, "child_cpu_us": child_cpu / records * 1e6,
                    "child_startup_cpu_s": startup_cpu if cleaner_state else 0.0,
                    "cleanings": len(done), "cleaned_bytes": sum(c.bytes_before for c in done),
                    "size_bytes": size}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--value-bytes", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-fsync", dest="fsync", action="store_false",
                        help="answer acks=all before fsync (the cleaner still fsyncs)")
    parser.add_argument("--dirty-ratio", type=float, default=0.5,
                        help="min.cleanable.dirty.ratio of the topic (Kafka's default 0.5)")
    parser.add_argument("--cleaner-io-bytes-per-second", type=float, default=float("inf"),
                        help="log.cleaner.io.max.bytes.per.second (default: no limit)")
    args = parser.parse_args()
    results: dict[bool, list[dict]] = {True: [], False: []}
    for run in range(args.runs):
        for cleaner in ((True, False) if run % 2 == 0 else (False, True)):
            result = run_once(args.records, args.keys, args.value_bytes, cleaner, args.fsync,
                              args.cleaner_io_bytes_per_second, args.dirty_ratio)
            results[cleaner].append(result)
            print(f"run {run} cleaner={'on' if cleaner else 'off'}: {result}", file=sys.stderr)
    print(f"Load: {args.records:,} records x {args.value_bytes:,} B over {args.keys:,} keys, "
          f"1 partition, cleanup.policy=compact, segment.bytes={SEGMENT_BYTES}, "
          f"min.cleanable.dirty.ratio={args.dirty_ratio}, acks=all, linger.ms=5, "
          f"fsync {'on' if args.fsync else 'off'}, "
          f"log.cleaner.io.max.bytes.per.second={args.cleaner_io_bytes_per_second:g}; "
          f"median of {args.runs} runs per mode, modes alternating.\n")
    print("| cleaner | records/s (median) | all runs (records/s) | CPU us/record (median) "
          "| cleaner process CPU us/record | cleanings during the run | bytes cleaned "
          "| log size at the end |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    medians = {}
    for cleaner in (False, True):
        runs = results[cleaner]
        medians[cleaner] = statistics.median(r["records_s"] for r in runs)
        each = ", ".join(f"{r['records_s']:,.0f}" for r in runs)
        print(f"| {'on' if cleaner else 'off'} | {medians[cleaner]:,.0f} | "
              f"{each} | "
              f"{statistics.median(r['cpu_us'] for r in runs):.1f} | "
              f"{statistics.median(r['child_cpu_us'] for r in runs):.1f} | "
              f"{statistics.median(r['cleanings'] for r in runs):.0f} | "
              f"{statistics.median(r['cleaned_bytes'] for r in runs):,.0f} | "
              f"{statistics.median(r['size_bytes'] for r in runs):,.0f} |")
    print(f"| **on / off** | **{medians[True] / medians[False]:.2f}x** | | | | | | |")
    startup = statistics.median(r["child_startup_cpu_s"] for r in results[True])
    print(f"\nThe cleaner's child process start-up (once per broker, before the window): "
          f"{startup:.2f} s CPU (median).")


if __name__ == "__main__":
    main()
