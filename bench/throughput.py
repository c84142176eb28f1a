"""Produce and consume throughput: onceflow against librdkafka's mock cluster, one run.

    .venv/bin/python bench/throughput.py                  # onceflow in a child process
    .venv/bin/python bench/throughput.py --records 50000 --partitions 4
    .venv/bin/python bench/throughput.py --broker embedded
    .venv/bin/python bench/throughput.py --bootstrap 127.0.0.1:9092   # a running broker

Theory of operation: the same load - N records of B random bytes (no key, no
compression), acks=all, linger.ms=5, P partitions - is driven by confluent-kafka
against two systems in turn:

- onceflow, by default `onceflow broker` in a child process (so client and broker do
  not share a GIL) with fsync on, on a temporary data dir on the local disk;
- librdkafka's built-in mock cluster (the reference the issue sets), created through
  librdkafka's mock API (see _mock_cluster.py) and reached over real sockets.

Each run produces all records (timed from the first produce() to the end of flush(),
so every record is acknowledged), then consumes by assignment from the log start of
every partition (timed from assign() to the last record). The mock keeps only its
newest ~5 MB per partition and drops older batches, so it retains fewer records than
were produced when the load is larger; the mock runs first and onceflow then consumes
exactly as many records as the mock retained, so both consume phases move the same
volume. The output is a markdown table ready for docs/benchmarks.md.

Wall-clock rates move with whatever else runs on the machine; CPU time per record
does much less. Each phase therefore also reports the CPU seconds (user + system)
that the broker process (onceflow as a child process only; the mock lives inside
the client) and this client process spent, per record.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import platform
import resource
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import confluent_kafka
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _mock_cluster import MockCluster  # a sibling file, not a package

RECORDS_DEFAULT = 200_000
RUNS_DEFAULT = 3
RECORD_BYTES_DEFAULT = 1_024
PARTITIONS_DEFAULT = 8
ACKS = "all"
LINGER_MS = 5
TOPIC_PREFIX = "bench"

CONSUME_BATCH_RECORDS = 10_000
POLL_TIMEOUT_S = 1.0
QUEUE_FULL_POLL_S = 0.001
# Bounds: far above a healthy run; a stuck system fails the benchmark instead of hanging.
PHASE_TIMEOUT_S = 600.0
ADMIN_TIMEOUT_S = 30.0
BROKER_START_TIMEOUT_S = 30.0
BROKER_STOP_TIMEOUT_S = 30.0
BROKER_POLL_S = 0.2

BYTES_PER_MB = 1_000_000  # MB/s in decimal megabytes, like most Kafka benchmarks


class BenchError(Exception):
    """A failure to report in one line (exit code 1)."""


@dataclasses.dataclass(frozen=True)
class Load:
    records: int
    record_bytes: int
    partitions: int
    runs: int  # each on a fresh topic; the report shows the median run of each phase


@dataclasses.dataclass(frozen=True)
class Phase:
    records: int
    payload_bytes: int
    seconds: float
    client_cpu_s: float = 0.0  # this process, librdkafka's threads (and the mock) included
    broker_cpu_s: float | None = None  # the onceflow child process; None when not ours

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds

    @property
    def mb_per_s(self) -> float:
        return self.payload_bytes / self.seconds / BYTES_PER_MB


@dataclasses.dataclass(frozen=True)
class Result:
    system: str
    produce: Phase
    consume: Phase  # the first `consume_limit` records when one was given
    consume_all: Phase  # the whole log (the same as `consume` without a limit)


# ------------------------------------------------------------------------ CPU time


def process_cpu_s(pid: int | None) -> float | None:
    """User + system CPU seconds of process `pid` (Linux /proc), None if unknown."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclasses.dataclass
class CpuClock:
    """CPU seconds of the client (this process) and of the broker process, if known."""

    broker_pid: int | None = None

    def read(self) -> tuple[float, float | None]:
        return own_cpu_s(), process_cpu_s(self.broker_pid)

    def since(self, start: tuple[float, float | None]) -> tuple[float, float | None]:
        client, broker = self.read()
        broker_s = None if broker is None or start[1] is None else broker - start[1]
        return client - start[0], broker_s


# ----------------------------------------------------------------------- the load


def create_topic_via_admin(bootstrap_servers: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    future = admin.create_topics([NewTopic(topic, partitions, 1)])[topic]
    future.result(ADMIN_TIMEOUT_S)


def produce_phase(bootstrap_servers: str, topic: str, load: Load, cpu: CpuClock) -> Phase:
    """Produce `load.records` records and wait until all are acknowledged."""
    failures: list[confluent_kafka.KafkaError] = []
    producer = Producer(
        {
            "bootstrap.servers": bootstrap_servers,
            "acks": ACKS,
            "linger.ms": LINGER_MS,
            # Reports only for failures: no Python callback per record on the hot path.
            "delivery.report.only.error": True,
            "on_delivery": lambda error, _message: failures.append(error),
        }
    )
    payload = os.urandom(load.record_bytes)
    start, cpu_start = time.perf_counter(), cpu.read()
    for _ in range(load.records):
        while True:
            try:
                producer.produce(topic, payload)
                break
            except BufferError:  # local queue full: wait for acknowledgements
                producer.poll(QUEUE_FULL_POLL_S)
    remaining = producer.flush(PHASE_TIMEOUT_S)
    seconds, (client_s, broker_s) = time.perf_counter() - start, cpu.since(cpu_start)
    if failures or remaining:
        first = failures[0] if failures else "timeout"
        raise BenchError(f"produce: {len(failures)} failed, {remaining} unacknowledged ({first})")
    return Phase(load.records, load.records * load.record_bytes, seconds, client_s, broker_s)


def consume_phase(
    bootstrap_servers: str, topic: str, load: Load, limit: int | None, cpu: CpuClock
) -> tuple[Phase, Phase]:
    """Read all partitions from their log start to their end.

    Returns the phase up to the `limit`-th record (the whole read without a limit) and
    the whole read: one pass gives both the comparable and the full figure.
    """
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap_servers,
            "group.id": f"{TOPIC_PREFIX}-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
        }
    )
    try:
        partitions = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(load.partitions)]
        expected = available_records(consumer, partitions)
        checkpoint = expected if limit is None else min(expected, limit)
        start = time.perf_counter()
        consumer.assign(partitions)
        first = read_records(consumer, checkpoint, start, cpu)
        rest = read_records(consumer, expected - checkpoint, start, cpu)
    finally:
        consumer.close()
    broker_s = None
    if first.broker_cpu_s is not None and rest.broker_cpu_s is not None:
        broker_s = first.broker_cpu_s + rest.broker_cpu_s
    whole = Phase(
        first.records + rest.records,
        first.payload_bytes + rest.payload_bytes,
        rest.seconds if rest.records else first.seconds,
        first.client_cpu_s + rest.client_cpu_s,
        broker_s,
    )
    return first, whole


def available_records(consumer: Consumer, partitions: list[TopicPartition]) -> int:
    total = 0
    for partition in partitions:
        low, high = consumer.get_watermark_offsets(partition, timeout=ADMIN_TIMEOUT_S)
        total += high - low  # [low, high): high is exclusive
    return total


def read_records(consumer: Consumer, expected: int, start: float, cpu: CpuClock) -> Phase:
    """Read `expected` more records; `seconds` counts from `start` to the last of them.

    CPU time counts from this call: the caller's first read starts at `start`."""
    cpu_start = cpu.read()
    count = payload_bytes = 0
    deadline = time.monotonic() + PHASE_TIMEOUT_S
    while count < expected:
        if time.monotonic() > deadline:
            raise BenchError(f"consume: only {count} of {expected} after {PHASE_TIMEOUT_S} s")
        # Never ask for more than remains: consume() waits for the full count or the
        # timeout, and an over-sized last call would time the wait, not the system.
        wanted = min(CONSUME_BATCH_RECORDS, expected - count)
        for message in consumer.consume(wanted, POLL_TIMEOUT_S):
            if message.error() is not None:
                raise BenchError(f"consume: {message.error()}")
            count += 1
            payload_bytes += len(message.value())
    seconds, (client_s, broker_s) = time.perf_counter() - start, cpu.since(cpu_start)
    return Phase(count, payload_bytes, seconds, client_s, broker_s)


# ----------------------------------------------------------------- the systems


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until_serving(
    bootstrap_servers: str, process: subprocess.Popen | None, log_path: Path | None
) -> None:
    """Return once a metadata request succeeds; BenchError if the broker dies or hangs."""
    admin = AdminClient({"bootstrap.servers": bootstrap_servers, "log_level": 0})
    deadline = time.monotonic() + BROKER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            tail = log_path.read_text()[-2000:] if log_path else ""
            raise BenchError(f"onceflow broker exited with {process.returncode}:\n{tail}")
        with contextlib.suppress(KafkaException):
            admin.list_topics(timeout=BROKER_POLL_S)
            return
    raise BenchError(
        f"no broker answered at {bootstrap_servers} within {BROKER_START_TIMEOUT_S:.0f} s"
    )


@contextlib.contextmanager
def onceflow_process(data_dir: Path, fsync: bool, cpu: CpuClock | None = None) -> Iterator[str]:
    """`onceflow broker` in a child process; SIGTERM (clean shutdown) at the end.
    `cpu`, when given, is pointed at the child so phases can read its CPU time."""
    port = free_port()
    log_path = data_dir.parent / "broker.log"
    command = [
        sys.executable,
        "-m",
        "onceflow",
        "broker",
        "--data-dir",
        str(data_dir),
        "--port",
        str(port),
        "--fsync" if fsync else "--no-fsync",
    ]
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    if cpu is not None:
        cpu.broker_pid = process.pid
    try:
        bootstrap_servers = f"127.0.0.1:{port}"
        wait_until_serving(bootstrap_servers, process, log_path)
        yield bootstrap_servers
    finally:
        stop_process(process)


def stop_process(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(BROKER_STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextlib.contextmanager
def onceflow_embedded(data_dir: Path, fsync: bool, cpu: CpuClock | None = None) -> Iterator[str]:
    from onceflow import Broker

    with Broker(data_dir, fsync=fsync) as broker:
        yield broker.bootstrap_servers


def run_onceflow(args: argparse.Namespace, load: Load, consume_limit: int | None) -> Result:
    fsync_label = "fsync on" if args.fsync else "fsync off"
    cpu = CpuClock()  # the embedded broker's CPU time is the client's: no broker figure
    with contextlib.ExitStack() as stack:
        if args.bootstrap:
            bootstrap, label = args.bootstrap, f"onceflow at {args.bootstrap}"
            wait_until_serving(bootstrap, None, None)
        else:
            base = Path(
                stack.enter_context(
                    tempfile.TemporaryDirectory(prefix="onceflow-bench-", dir=args.data_root)
                )
            )
            start = onceflow_process if args.broker == "process" else onceflow_embedded
            bootstrap = stack.enter_context(start(base / "data", args.fsync, cpu))
            label = f"onceflow ({args.broker}, {fsync_label})"

        def create_topic(topic: str, partitions: int) -> None:
            create_topic_via_admin(bootstrap, topic, partitions)

        return run_load(label, bootstrap, create_topic, load, consume_limit, cpu)


def run_mock(load: Load) -> Result:
    with MockCluster(num_brokers=1) as mock:
        return run_load(
            "librdkafka mock cluster",
            mock.bootstrap_servers,
            mock.create_topic,
            load,
            None,
            CpuClock(),
        )


def run_load(
    system: str,
    bootstrap_servers: str,
    create_topic: Callable[[str, int], None],
    load: Load,
    consume_limit: int | None,
    cpu: CpuClock,
) -> Result:
    """`load.runs` runs, each on a new topic; the median of each phase."""
    runs = []
    for run in range(1, load.runs + 1):
        topic = f"{TOPIC_PREFIX}-{uuid.uuid4().hex[:8]}"
        create_topic(topic, load.partitions)
        print(
            f"{system}, run {run}/{load.runs}: producing {load.records:,} records, then consuming",
            file=sys.stderr,
            flush=True,
        )
        produce = produce_phase(bootstrap_servers, topic, load, cpu)
        consume, consume_all = consume_phase(bootstrap_servers, topic, load, consume_limit, cpu)
        runs.append(Result(system, produce, consume, consume_all))
    return Result(
        system,
        median_phase([r.produce for r in runs]),
        median_phase([r.consume for r in runs]),
        median_phase([r.consume_all for r in runs]),
    )


def median_phase(phases: list[Phase]) -> Phase:
    """The run with the median rate (the upper one of the middle two for an even count)."""
    return sorted(phases, key=lambda phase: phase.records_per_s)[len(phases) // 2]


# -------------------------------------------------------------------- the report


def markdown(results: list[Result], load: Load, command: str) -> str:
    """The report: setup, one row per system, the onceflow/mock ratio."""
    lines = [
        f"Command: `{command}`",
        "",
        (
            f"Load: {load.records:,} records x {load.record_bytes:,} B, "
            f"{load.partitions} partitions, acks={ACKS}, linger.ms={LINGER_MS}, no compression; "
            f"median of {load.runs} runs; confluent-kafka {confluent_kafka.version()} "
            f"(librdkafka {confluent_kafka.libversion()[0]}), Python {platform.python_version()}, "
            f"{os.cpu_count()} CPUs, {platform.machine()}."
        ),
        "",
        (
            "| system | produce records/s | produce MB/s | consume records/s | consume MB/s "
            "| records consumed |"
        ),
        "|---|---:|---:|---:|---:|---:|",
    ]
    for result in results:
        lines.append(
            f"| {result.system} | {result.produce.records_per_s:,.0f} | "
            f"{result.produce.mb_per_s:,.1f} | {result.consume.records_per_s:,.0f} | "
            f"{result.consume.mb_per_s:,.1f} | {result.consume.records:,} |"
        )
    for result in results:
        if result.consume_all.records != result.consume.records:
            lines.append(
                f"| {result.system}, whole log | | | "
                f"{result.consume_all.records_per_s:,.0f} | "
                f"{result.consume_all.mb_per_s:,.1f} | "
                f"{result.consume_all.records:,} |"
            )
    if len(results) == 2:
        ours, mock = results
        lines.append(
            f"| **onceflow / mock** | **{ratio(ours.produce, mock.produce)}** | | "
            f"**{ratio(ours.consume, mock.consume)}** | | |"
        )
    return "\n".join(lines + ["", *cpu_table(results)])


def cpu_table(results: list[Result]) -> list[str]:
    """CPU microseconds per record of each median phase (see the module docstring)."""
    lines = [
        "| system | phase | broker CPU us/record | client CPU us/record |",
        "|---|---|---:|---:|",
    ]
    for result in results:
        for name, phase in (("produce", result.produce), ("consume", result.consume_all)):
            broker = "-" if phase.broker_cpu_s is None else per_record_us(phase.broker_cpu_s, phase)
            client = per_record_us(phase.client_cpu_s, phase)
            lines.append(f"| {result.system} | {name} | {broker} | {client} |")
    return lines


def per_record_us(cpu_s: float, phase: Phase) -> str:
    return f"{cpu_s / phase.records * 1e6:.2f}"


def loads(averages: tuple[float, float, float] | None = None) -> str:
    return " ".join(f"{value:.2f}" for value in averages or os.getloadavg())


def ratio(ours: Phase, mock: Phase) -> str:
    return f"{ours.records_per_s / mock.records_per_s:.2f}x"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=RECORDS_DEFAULT)
    parser.add_argument("--record-bytes", type=int, default=RECORD_BYTES_DEFAULT)
    parser.add_argument("--partitions", type=int, default=PARTITIONS_DEFAULT)
    parser.add_argument(
        "--runs",
        type=int,
        default=RUNS_DEFAULT,
        help="runs per system, each on a new topic; the median is reported",
    )
    parser.add_argument(
        "--broker",
        choices=("process", "embedded"),
        default="process",
        help="run onceflow in a child process (default) or in this process",
    )
    parser.add_argument("--bootstrap", help="use a running broker instead of starting one")
    parser.add_argument(
        "--fsync",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="fsync before acknowledging acks=all (default: on)",
    )
    parser.add_argument(
        "--data-root",
        help="directory for the temporary data dir "
        "(default: the system temp dir; pick a real disk for fsync)",
    )
    parser.add_argument("--skip-mock", action="store_true", help="only measure onceflow")
    parser.add_argument("--skip-onceflow", action="store_true", help="only measure the mock")
    args = parser.parse_args(argv)
    if min(args.records, args.record_bytes, args.partitions, args.runs) < 1:
        parser.error("--records, --record-bytes, --partitions and --runs must be positive")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    load = Load(args.records, args.record_bytes, args.partitions, args.runs)
    load_before = os.getloadavg()
    results = []
    try:
        mock = None if args.skip_mock else run_mock(load)
        if not args.skip_onceflow:
            limit = mock.consume.records if mock else None
            results.append(run_onceflow(args, load, limit))
        if mock is not None:
            results.append(mock)
    except (BenchError, KafkaException) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    command = shlex.join(["python", "bench/throughput.py", *argv])
    print(markdown(results, load, command))
    print(f"\nLoad average (1, 5, 15 min) at start: {loads(load_before)}, at end: {loads()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
