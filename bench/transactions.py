"""What transactions cost: produce and consume throughput, each pair in one run.

    .venv/bin/python bench/transactions.py
    .venv/bin/python bench/transactions.py --records 300000 --runs 5
    .venv/bin/python bench/transactions.py --bootstrap 127.0.0.1:9092   # a running broker
    .venv/bin/python bench/transactions.py --mock   # librdkafka's mock cluster instead

Theory of operation: two pairs, measured against the same broker in one run.

- **Produce**: N records of B random bytes (1 KB by default), no key, no compression,
  acks=all, linger.ms=5, P partitions, produced by confluent-kafka either idempotent
  (the baseline: a transactional producer is an idempotent one plus transactions) or
  transactional, committing every `--commit-interval-ms` (100 ms, the interval of
  Kafka's published figure): begin, produce until the interval has passed, commit.
  A run is timed from the first produce() to the end of the last flush()/commit, so
  every record is acknowledged (and committed); the producer id and, for transactions,
  init_transactions() are set up before the timing starts.
- **Consume**: the topic the transactional run wrote (records, plus a COMMIT marker per
  partition per transaction) is read from its start by an assigned consumer with
  isolation.level read_uncommitted, then read_committed (or the other way round), until
  every record has arrived. read_committed is served up to the last stable offset and
  skips the markers like read_uncommitted does, so Kafka's target is no loss at all.

Every run writes a fresh topic (deleted after its round) on `onceflow broker` in a
child process (so client and broker do not share a GIL), fsync on, temporary data dir.
Each round runs the modes of a pair in the opposite order of the previous round, so a
warming page cache or a noisy neighbour does not favour one. The report is the median
run of each mode as markdown, with the ratio of each pair; Kafka's published targets
are at most 3% loss for transactions and none for read_committed.

`--mock` runs the produce pair against librdkafka's own mock cluster (in this process,
no disk): a reference for what the client alone pays for transactions. It has no
consume pair: the mock writes no control markers and keeps only part of a large log.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import dataclasses
import os
import platform
import shlex
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import confluent_kafka
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition

sys.path.insert(0, str(Path(__file__).resolve().parent))
# Sibling files, not a package: importable once this directory is on the path.
from _mock_cluster import MockCluster
from idempotence import (
    BenchError,
    broker_process,
    fresh_topic,
    own_cpu_s,
    process_cpu_s,
    wait_until_serving,
)

RECORDS_DEFAULT = 200_000
RUNS_DEFAULT = 3
RECORD_BYTES_DEFAULT = 1_024
PARTITIONS_DEFAULT = 4
COMMIT_INTERVAL_MS_DEFAULT = 100
LINGER_MS = 5
QUEUE_FULL_POLL_S = 0.001
CONSUME_BATCH_MAX = 10_000
CONSUME_POLL_S = 0.5
# Bounds far above a healthy run: a stuck broker fails the benchmark instead of hanging.
PHASE_TIMEOUT_S = 600.0
ADMIN_TIMEOUT_S = 30.0
BYTES_PER_MB = 1_000_000
PRODUCE_MODES = ("idempotent", "transactional")
CONSUME_MODES = ("read_uncommitted", "read_committed")


@dataclasses.dataclass(frozen=True)
class Run:
    mode: str
    records: int
    payload_bytes: int
    seconds: float
    client_cpu_s: float  # this process, librdkafka's threads included
    broker_cpu_s: float | None  # None when the broker is not ours to measure
    commits: int = 0  # transactional runs: transactions committed
    drain_s: float = 0.0  # transactional runs: waiting for the last records' acks
    end_s: float = 0.0  # transactional runs: waiting for EndTxn (commit_transaction())

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds

    @property
    def mb_per_s(self) -> float:
        return self.payload_bytes / self.seconds / BYTES_PER_MB


class Meter:
    """Wall-clock and CPU time of one run, on the client and the broker side."""

    def __init__(self, broker_pid: int | None) -> None:
        self.broker_pid = broker_pid
        self.start = time.perf_counter()
        self.client_start = own_cpu_s()
        self.broker_start = process_cpu_s(broker_pid)

    def run(self, mode: str, records: int, payload_bytes: int,
            commits: tuple[int, float, float] = (0, 0.0, 0.0)) -> Run:
        seconds = time.perf_counter() - self.start
        broker_end = process_cpu_s(self.broker_pid)
        broker_cpu_s = None if self.broker_start is None or broker_end is None \
            else broker_end - self.broker_start
        return Run(mode, records, payload_bytes, seconds, own_cpu_s() - self.client_start,
                   broker_cpu_s, *commits)


# ---------------------------------------------------------------- produce


def new_producer(bootstrap: str, mode: str, failures: list[object]) -> Producer:
    config = {
        "bootstrap.servers": bootstrap, "acks": "all", "linger.ms": LINGER_MS,
        "enable.idempotence": True,
        # Reports only for failures: no Python callback per record on the hot path.
        "delivery.report.only.error": True,
        "on_delivery": lambda error, _message: failures.append(error),
    }
    if mode == "transactional":
        config["transactional.id"] = f"bench-txn-{uuid.uuid4().hex[:8]}"
    return Producer(config)


def produce_one(producer: Producer, topic: str, payload: bytes) -> None:
    while True:
        try:
            producer.produce(topic, payload)
            return
        except BufferError:  # local queue full: serve acknowledgements
            producer.poll(QUEUE_FULL_POLL_S)


def warm_up(producer: Producer, topic: str, mode: str, payload: bytes) -> None:
    """Connections, metadata and the producer id (and the transactional id) set up
    before the timing, so the figure is the steady-state rate."""
    if mode == "transactional":
        producer.init_transactions(ADMIN_TIMEOUT_S)
        producer.begin_transaction()
    produce_one(producer, topic, payload)
    if mode == "transactional":
        producer.commit_transaction(PHASE_TIMEOUT_S)
    elif producer.flush(PHASE_TIMEOUT_S):
        raise BenchError(f"{mode}: the warm-up record was not acknowledged")


def produce_idempotent(producer: Producer, topic: str, payload: bytes,
                       records: int) -> tuple[int, float, float]:
    for _ in range(records):
        produce_one(producer, topic, payload)
    if producer.flush(PHASE_TIMEOUT_S):
        raise BenchError("idempotent: records unacknowledged after the flush timeout")
    return 0, 0.0, 0.0


def produce_transactional(producer: Producer, topic: str, payload: bytes, records: int,
                          commit_interval_s: float) -> tuple[int, float, float]:
    """Transactions of `commit_interval_s` each, counted from begin to the commit call.

    commit_transaction() first waits for every record to be acknowledged, then sends
    EndTxn; the flush() before it does the first part alone, so the two waits are timed
    apart. Returns (transactions, seconds draining, seconds in EndTxn)."""
    commits, drain_s, end_s, left = 0, 0.0, 0.0, records
    while left:
        producer.begin_transaction()
        deadline = time.perf_counter() + commit_interval_s
        while left and time.perf_counter() < deadline:
            produce_one(producer, topic, payload)
            left -= 1
        draining = time.perf_counter()
        if producer.flush(PHASE_TIMEOUT_S):
            raise BenchError("transactional: records unacknowledged after the flush timeout")
        ending = time.perf_counter()
        producer.commit_transaction(PHASE_TIMEOUT_S)
        drain_s, end_s = drain_s + ending - draining, end_s + time.perf_counter() - ending
        commits += 1
    return commits, drain_s, end_s


def produce(bootstrap: str, topic: str, mode: str, args: argparse.Namespace,
            broker_pid: int | None) -> Run:
    failures: list[object] = []
    producer = new_producer(bootstrap, mode, failures)
    payload = os.urandom(args.record_bytes)
    warm_up(producer, topic, mode, payload)
    meter = Meter(broker_pid)
    if mode == "transactional":
        commits = produce_transactional(producer, topic, payload, args.records,
                                        args.commit_interval_ms / 1000)
    else:
        commits = produce_idempotent(producer, topic, payload, args.records)
    run = meter.run(mode, args.records, args.records * args.record_bytes, commits)
    if failures:
        raise BenchError(f"{mode}: {len(failures)} records failed ({failures[0]})")
    return run


# ---------------------------------------------------------------- consume


def consume(bootstrap: str, topic: str, mode: str, args: argparse.Namespace,
            broker_pid: int | None) -> Run:
    """Read the topic from its start until `args.records` records (+ the warm-up
    record) have arrived."""
    expected = args.records + 1
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4()}",
                         "enable.auto.commit": False, "isolation.level": mode})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(args.partitions)])
    meter: Meter | None = None  # started at the first record: connecting is not reading
    count, payload_bytes = 0, 0
    deadline = time.monotonic() + PHASE_TIMEOUT_S
    while count < expected:
        if time.monotonic() > deadline:
            raise BenchError(f"{mode}: {count} of {expected} records after {PHASE_TIMEOUT_S} s")
        for message in consumer.consume(min(CONSUME_BATCH_MAX, expected - count), CONSUME_POLL_S):
            if message.error() is not None:
                raise BenchError(f"{mode}: {message.error()}")
            meter = meter or Meter(broker_pid)
            count += 1
            payload_bytes += len(message.value())
    assert meter is not None
    run = meter.run(mode, count, payload_bytes)
    consumer.close()
    return run


# ---------------------------------------------------------------- rounds


TopicFactory = Callable[[], contextlib.AbstractContextManager[str]]


def topic_factory(bootstrap: str, partitions: int, mock: MockCluster | None) -> TopicFactory:
    """A new topic per round, deleted after it (disk use stays at one round's)."""
    return functools.partial(fresh_topic, bootstrap, partitions, mock, prefix="bench-txn")


def ordered(modes: tuple[str, str], round_index: int) -> tuple[str, ...]:
    return modes if round_index % 2 == 0 else tuple(reversed(modes))


def run_rounds(bootstrap: str, broker_pid: int | None, args: argparse.Namespace,
               fresh_topic: TopicFactory) -> dict[str, list[Run]]:
    runs: dict[str, list[Run]] = {mode: [] for mode in PRODUCE_MODES + CONSUME_MODES}
    for round_index in range(args.runs):
        with contextlib.ExitStack() as topics:
            written = {}
            for mode in ordered(PRODUCE_MODES, round_index):
                progress(round_index, args, f"produce {mode}")
                written[mode] = topics.enter_context(fresh_topic())
                runs[mode].append(produce(bootstrap, written[mode], mode, args, broker_pid))
            for mode in ordered(CONSUME_MODES, round_index) if not args.mock else ():
                progress(round_index, args, f"consume {mode}")
                runs[mode].append(consume(bootstrap, written["transactional"], mode, args,
                                          broker_pid))
    return runs


def progress(round_index: int, args: argparse.Namespace, what: str) -> None:
    print(f"round {round_index + 1}/{args.runs}: {what}, {args.records:,} records",
          file=sys.stderr, flush=True)


# ---------------------------------------------------------------- report


def median_run(runs: list[Run]) -> Run:
    return sorted(runs, key=lambda run: run.records_per_s)[len(runs) // 2]


def cpu_per_record(runs: list[Run], side: str) -> str:
    """Median over the runs of CPU microseconds per record, broker or client side."""
    values = [getattr(run, f"{side}_cpu_s") for run in runs]
    if any(value is None for value in values):
        return "n/a"
    return f"{statistics.median(v / run.records for v, run in zip(values, runs)) * 1e6:.2f}"


def table(runs: dict[str, list[Run]], modes: tuple[str, str], what: str) -> list[str]:
    medians = {mode: median_run(runs[mode]) for mode in modes}
    header = (f"| {what} | records/s | MB/s | broker CPU us/record | client CPU us/record "
              "| all runs (records/s) |")
    lines = [header, "|---|---:|---:|---:|---:|---|"]
    for mode, median in medians.items():
        every = ", ".join(f"{run.records_per_s:,.0f}" for run in runs[mode])
        lines.append(f"| {mode} | {median.records_per_s:,.0f} | {median.mb_per_s:,.1f} | "
                     f"{cpu_per_record(runs[mode], 'broker')} | "
                     f"{cpu_per_record(runs[mode], 'client')} | {every} |")
    baseline, ours = (medians[m] for m in modes)
    spread = statistics.pstdev(r.records_per_s for r in runs[modes[0]]) / baseline.records_per_s
    lines.append(f"| **{modes[1]} / {modes[0]}** | **{ours.records_per_s / baseline.records_per_s:.2f}x**"
                 f" | | | | {modes[0]} run-to-run spread {spread:.0%} |")
    return lines


def markdown(runs: dict[str, list[Run]], args: argparse.Namespace, command: str,
             system: str) -> str:
    txn = median_run(runs["transactional"])
    lines = [
        f"Command: `{command}`",
        "",
        (f"System: {system}. Load: {args.records:,} records x {args.record_bytes:,} B, "
        f"{args.partitions} partitions, acks=all, linger.ms={LINGER_MS}, no compression; "
        f"transactions committed every {args.commit_interval_ms} ms ({txn.commits} in the "
        f"median run; per commit {txn.drain_s / txn.commits * 1000:.0f} ms waiting for "
        f"the last acks and {txn.end_s / txn.commits * 1000:.1f} ms for EndTxn, "
        f"{txn.end_s / txn.seconds:.1%} of the run); "
        f"median of {args.runs} runs per mode, modes alternating; "
        f"confluent-kafka {confluent_kafka.version()} (librdkafka "
        f"{confluent_kafka.libversion()[0]}), Python {platform.python_version()}, "
         f"{os.cpu_count()} CPUs, {platform.machine()}."),
        "",
        *table(runs, PRODUCE_MODES, "producer"),
    ]
    if not args.mock:
        lines += ["", *table(runs, CONSUME_MODES, "consumer (topic written transactionally)")]
    return "\n".join(lines)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=RECORDS_DEFAULT)
    parser.add_argument("--runs", type=int, default=RUNS_DEFAULT, help="runs per mode")
    parser.add_argument("--record-bytes", type=int, default=RECORD_BYTES_DEFAULT)
    parser.add_argument("--partitions", type=int, default=PARTITIONS_DEFAULT)
    parser.add_argument("--commit-interval-ms", type=int, default=COMMIT_INTERVAL_MS_DEFAULT)
    parser.add_argument("--bootstrap", help="use a running broker instead of starting one")
    parser.add_argument("--data-root", help="where the temporary data dir goes")
    parser.add_argument("--fsync", action=argparse.BooleanOptionalAction, default=True,
                        help="the started broker's --fsync/--no-fsync (default: on)")
    parser.add_argument("--mock", action="store_true",
                        help="run against librdkafka's mock cluster instead of onceflow")
    args = parser.parse_args(argv)
    if min(args.records, args.runs, args.record_bytes, args.partitions,
           args.commit_interval_ms) < 1:
        parser.error("--records, --runs, --record-bytes, --partitions and "
                     "--commit-interval-ms must be positive")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    command = shlex.join([".venv/bin/python", "bench/transactions.py", *argv])
    try:
        with contextlib.ExitStack() as stack:
            if args.mock:
                mock = stack.enter_context(MockCluster(num_brokers=1))
                bootstrap, broker_pid, system = mock.bootstrap_servers, None, \
                    "librdkafka mock cluster (in memory, no markers)"
            elif args.bootstrap:
                mock, broker_pid, system = None, None, f"broker at {args.bootstrap}"
                bootstrap = args.bootstrap
                wait_until_serving(bootstrap, None, None)
            else:
                mock, system = None, f"onceflow broker, fsync {'on' if args.fsync else 'off'}"
                bootstrap, broker_pid = stack.enter_context(
                    broker_process(args.data_root, args.fsync))
            runs = run_rounds(bootstrap, broker_pid, args,
                              topic_factory(bootstrap, args.partitions, mock))
        print(markdown(runs, args, command, system))
        return 0
    except (BenchError, KafkaException) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
