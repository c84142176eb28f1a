"""Produce throughput with and without idempotence, against one onceflow broker, one run.

    .venv/bin/python bench/idempotence.py
    .venv/bin/python bench/idempotence.py --records 100000 --runs 5
    .venv/bin/python bench/idempotence.py --bootstrap 127.0.0.1:9092   # a running broker
    .venv/bin/python bench/idempotence.py --mock-rtt-ms 20   # librdkafka's mock instead

Theory of operation: the same load - N records of B random bytes, no key, no
compression, acks=all, linger.ms=5, P partitions - is produced by confluent-kafka in
three modes: plain, idempotent (`enable.idempotence`), and as a control a plain
producer held to idempotence's cap of 5 requests in flight per connection. Every run
goes to a fresh topic (deleted afterwards) of the same broker: `onceflow broker` in a
child process (so client and broker do not share a GIL), fsync on, on a temporary data
dir. Each round runs the modes in the opposite order of the previous one, so a warming
page cache or a noisy neighbour does not favour one mode. A run is timed from the
first produce() to the end of flush(), so every record is acknowledged, after one
warm-up record that sets up metadata, connections and the producer id: steady-state
throughput is compared. The report is the median run of each mode as a markdown
table, with the idempotent/plain ratio; Kafka's published target is "no measurable
loss".

What idempotence costs the broker: per batch, a lookup of the producer's entry, a
comparison with its last 5 batches and an entry rebuilt at commit - about 15 us, next
to the ~1 ms a 1 MB batch takes to append. What it costs the client: librdkafka caps
requests in flight at 5 per connection (and sends one partition per request), so
fewer requests share each group-commit fsync; the control row measures that cap alone.

`--mock-rtt-ms MS` runs the same modes against librdkafka's own mock cluster with every
answer delayed by MS (`rd_kafka_mock_broker_set_rtt`): a reference for how the client
alone behaves when answers take as long as fsync'd acks=all answers do. The mock runs
inside this process, so its CPU counts as client CPU there.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import confluent_kafka
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _mock_cluster import MockCluster  # noqa: E402  (a sibling file, not a package)
from throughput import (  # noqa: E402  (sibling)
    BenchError,
    free_port,
    own_cpu_s,
    process_cpu_s,
    wait_until_serving,
)

RECORDS_DEFAULT = 200_000
RUNS_DEFAULT = 3
RECORD_BYTES_DEFAULT = 1_024
PARTITIONS_DEFAULT = 4
LINGER_MS = 5
QUEUE_FULL_POLL_S = 0.001
# Bounds far above a healthy run: a stuck broker fails the benchmark instead of hanging.
PHASE_TIMEOUT_S = 600.0
ADMIN_TIMEOUT_S = 30.0
BROKER_START_TIMEOUT_S = 30.0
BROKER_STOP_TIMEOUT_S = 30.0
BROKER_POLL_S = 0.2
BYTES_PER_MB = 1_000_000
# The two modes compared, plus a control: a plain producer held to idempotence's cap of
# 5 requests in flight per connection, which separates the cost of that cap (fewer
# requests share each group-commit fsync) from the cost of idempotence itself.
MODES = ("plain", "idempotent", "plain, 5 in flight")
MODE_CONFIGS = {
    "plain": {"enable.idempotence": False},
    "idempotent": {"enable.idempotence": True},  # caps max.in.flight at 5 itself
    "plain, 5 in flight": {"enable.idempotence": False, "max.in.flight.requests.per.connection": 5},
}


@dataclasses.dataclass(frozen=True)
class Run:
    mode: str
    records: int
    payload_bytes: int
    seconds: float
    client_cpu_s: float  # this process, librdkafka's threads included
    broker_cpu_s: float | None  # the broker process; None when it is not ours to measure

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds

    @property
    def mb_per_s(self) -> float:
        return self.payload_bytes / self.seconds / BYTES_PER_MB


def produce(
    bootstrap: str, topic: str, mode: str, records: int, record_bytes: int, broker_pid: int | None
) -> Run:
    failures: list[object] = []
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": LINGER_MS,
            **MODE_CONFIGS[mode],
            # Reports only for failures: no Python callback per record on the hot path.
            "delivery.report.only.error": True,
            "on_delivery": lambda error, _message: failures.append(error),
        }
    )
    payload = os.urandom(record_bytes)
    # Warm up outside the timing: metadata, connections and (idempotent) the producer id
    # are set up once per producer, so the figure is the steady-state rate.
    producer.produce(topic, payload)
    if producer.flush(PHASE_TIMEOUT_S) or failures:
        raise BenchError(f"{mode}: the warm-up record was not acknowledged")
    start, client_start, broker_start = time.perf_counter(), own_cpu_s(), process_cpu_s(broker_pid)
    for _ in range(records):
        while True:
            try:
                producer.produce(topic, payload)
                break
            except BufferError:  # local queue full: serve acknowledgements
                producer.poll(QUEUE_FULL_POLL_S)
    remaining = producer.flush(PHASE_TIMEOUT_S)
    seconds = time.perf_counter() - start
    client_cpu_s, broker_end = own_cpu_s() - client_start, process_cpu_s(broker_pid)
    if failures or remaining:
        raise BenchError(
            f"{mode}: {len(failures)} failed, {remaining} unacknowledged "
            f"({failures[0] if failures else 'timeout'})"
        )
    broker_cpu_s = None if broker_start is None or broker_end is None else broker_end - broker_start
    return Run(mode, records, records * record_bytes, seconds, client_cpu_s, broker_cpu_s)


@contextlib.contextmanager
def fresh_topic(bootstrap: str, partitions: int, mock: MockCluster | None,
                prefix: str = "bench-idem") -> Iterator[str]:
    """A new topic for one run, deleted after it (disk use stays at one run's data)."""
    topic = f"{prefix}-{uuid.uuid4().hex[:8]}"
    if mock is not None:  # the mock answers no CreateTopics; it keeps little data anyway
        mock.create_topic(topic, partitions)
        yield topic
        return
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(ADMIN_TIMEOUT_S)
    try:
        yield topic
    finally:
        admin.delete_topics([topic])[topic].result(ADMIN_TIMEOUT_S)


@contextlib.contextmanager
def broker_process(data_root: str | None, fsync: bool) -> Iterator[tuple[str, int]]:
    """`onceflow broker` in a child process, (bootstrap, pid); SIGTERM at the end."""
    with tempfile.TemporaryDirectory(prefix="onceflow-bench-", dir=data_root) as base:
        port, log = free_port(), Path(base) / "broker.log"
        command = [
            sys.executable,
            "-m",
            "onceflow",
            "broker",
            "--data-dir",
            str(Path(base) / "data"),
            "--port",
            str(port),
            "--fsync" if fsync else "--no-fsync",
        ]
        with open(log, "w") as out:
            process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        try:
            bootstrap = f"127.0.0.1:{port}"
            wait_until_serving(bootstrap, process, log)
            yield bootstrap, process.pid
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
            try:
                process.wait(BROKER_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def run_rounds(
    bootstrap: str,
    broker_pid: int | None,
    args: argparse.Namespace,
    mock: MockCluster | None = None,
) -> dict[str, list[Run]]:
    runs: dict[str, list[Run]] = {mode: [] for mode in MODES}
    for round_index in range(args.runs):
        order = MODES if round_index % 2 == 0 else tuple(reversed(MODES))
        for mode in order:
            print(
                f"round {round_index + 1}/{args.runs}: {mode}, {args.records:,} records",
                file=sys.stderr,
                flush=True,
            )
            with fresh_topic(bootstrap, args.partitions, mock) as topic:
                runs[mode].append(
                    produce(bootstrap, topic, mode, args.records, args.record_bytes, broker_pid)
                )
    return runs


def median_run(runs: list[Run]) -> Run:
    return sorted(runs, key=lambda run: run.records_per_s)[len(runs) // 2]


def markdown(
    runs: dict[str, list[Run]], args: argparse.Namespace, command: str, system: str
) -> str:
    medians = {mode: median_run(runs[mode]) for mode in MODES}
    plain, idempotent = medians["plain"], medians["idempotent"]
    lines = [
        f"Command: `{command}`",
        "",
        f"System: {system}. Load: {args.records:,} records x {args.record_bytes:,} B, "
        f"{args.partitions} partitions, acks=all, linger.ms={LINGER_MS}, no compression, "
        f"{'fsync ' + ('on' if args.fsync else 'off') if args.mock_rtt_ms is None else 'in memory'}"
        f"; median of "
        f"{args.runs} runs per mode, modes alternating; confluent-kafka "
        f"{confluent_kafka.version()} (librdkafka {confluent_kafka.libversion()[0]}), Python "
        f"{platform.python_version()}, {os.cpu_count()} CPUs, {platform.machine()}.",
        "",
        "| producer | records/s | MB/s | broker CPU us/record | client CPU us/record "
        "| all runs (records/s) |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for mode, median in medians.items():
        every = ", ".join(f"{run.records_per_s:,.0f}" for run in runs[mode])
        lines.append(
            f"| {mode} | {median.records_per_s:,.0f} | {median.mb_per_s:,.1f} | "
            f"{cpu_per_record(runs[mode], 'broker')} | "
            f"{cpu_per_record(runs[mode], 'client')} | {every} |"
        )
    control = medians["plain, 5 in flight"]
    spread = statistics.pstdev(r.records_per_s for r in runs["plain"]) / plain.records_per_s
    lines.append(
        f"| **idempotent / plain** | **{ratio(idempotent, plain)}** | | | | plain "
        f"run-to-run spread {spread:.0%} |"
    )
    lines.append(f"| idempotent / plain with 5 in flight | {ratio(idempotent, control)} | | | | |")
    return "\n".join(lines)


def cpu_per_record(runs: list[Run], side: str) -> str:
    """Median over the runs of CPU microseconds per record, on the broker or client side."""
    values = [getattr(run, f"{side}_cpu_s") for run in runs]
    if any(value is None for value in values):
        return "n/a"
    return f"{statistics.median(v / run.records for v, run in zip(values, runs)) * 1e6:.2f}"


def ratio(ours: Run, reference: Run) -> str:
    return f"{ours.records_per_s / reference.records_per_s:.2f}x"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=RECORDS_DEFAULT)
    parser.add_argument("--runs", type=int, default=RUNS_DEFAULT, help="runs per mode")
    parser.add_argument("--record-bytes", type=int, default=RECORD_BYTES_DEFAULT)
    parser.add_argument("--partitions", type=int, default=PARTITIONS_DEFAULT)
    parser.add_argument("--bootstrap", help="use a running broker instead of starting one")
    parser.add_argument("--data-root", help="where the temporary data dir goes")
    parser.add_argument(
        "--fsync",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the started broker's --fsync/--no-fsync (default: on)",
    )
    parser.add_argument(
        "--mock-rtt-ms",
        type=int,
        help="run against librdkafka's mock cluster with this answer delay instead of onceflow",
    )
    args = parser.parse_args(argv)
    if args.records < 1 or args.runs < 1 or args.record_bytes < 1 or args.partitions < 1:
        parser.error("--records, --runs, --record-bytes and --partitions must be positive")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    command = shlex.join([".venv/bin/python", "bench/idempotence.py", *argv])
    try:
        with contextlib.ExitStack() as stack:
            if args.mock_rtt_ms is not None:
                mock = stack.enter_context(MockCluster(num_brokers=1))
                set_mock_rtt(mock, args.mock_rtt_ms)
                return report(
                    run_rounds(mock.bootstrap_servers, None, args, mock),
                    args,
                    command,
                    f"librdkafka mock cluster, {args.mock_rtt_ms} ms RTT",
                )
            if args.bootstrap:
                bootstrap, broker_pid = args.bootstrap, None
                wait_until_serving(bootstrap, None, None)
            else:
                bootstrap, broker_pid = stack.enter_context(
                    broker_process(args.data_root, args.fsync)
                )
            return report(run_rounds(bootstrap, broker_pid, args), args, command, "onceflow broker")
    except (BenchError, KafkaException) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def report(runs: dict[str, list[Run]], args: argparse.Namespace, command: str, system: str) -> int:
    print(markdown(runs, args, command, system))
    return 0


def set_mock_rtt(mock: MockCluster, rtt_ms: int) -> None:
    """Delay every answer of every mock broker (MockCluster has no setter for it, so its
    library and cluster handles are used directly)."""
    lib = mock._lib  # noqa: SLF001
    lib.rd_kafka_mock_broker_set_rtt.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_int]
    lib.rd_kafka_mock_broker_set_rtt.restype = ctypes.c_int
    if lib.rd_kafka_mock_broker_set_rtt(mock._cluster, -1, rtt_ms) != 0:  # noqa: SLF001
        raise BenchError("rd_kafka_mock_broker_set_rtt failed")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
