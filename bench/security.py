"""Produce and consume throughput over PLAINTEXT, SSL and SASL_SSL listeners, one run.

    .venv/bin/python bench/security.py                      # 100k x 1 KiB, 4 partitions, 3 runs
    .venv/bin/python bench/security.py --records 200000 --runs 5

Theory of operation: one `onceflow broker` child process (fsync on) with three listeners,
PLAINTEXT, SSL and SASL_SSL (SCRAM-SHA-512, a user made with `--add-scram`), and a
throw-away CA and server certificate (trustme). The same load - N records of B random
bytes, acks=all, linger.ms=5, P partitions - is driven by confluent-kafka through each
listener in turn, on a fresh topic each time; the listeners are interleaved run by run so
that changing load on the machine hits all three alike. Produce is timed from the first
produce() to the end of flush(); consume from assign() to the last record, reading every
partition from its start. The broker's CPU seconds per record (from /proc) are reported
beside the wall-clock rates, since they move less with other work on the machine. The
output is a markdown table for docs/benchmarks.md; the median run of each phase is shown.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import shlex
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import confluent_kafka
import trustme
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

RECORDS_DEFAULT = 100_000
RECORD_BYTES_DEFAULT = 1_024
PARTITIONS_DEFAULT = 4
RUNS_DEFAULT = 3
PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_SSL")
PHASE_TIMEOUT_S = 600.0
START_TIMEOUT_S = 30.0
BYTES_PER_MB = 1_000_000
CONSUME_BATCH = 10_000


class BenchError(Exception):
    pass


@dataclasses.dataclass(frozen=True)
class Phase:
    records: int
    seconds: float
    broker_cpu_s: float
    client_cpu_s: float = 0.0   # this process (the client's threads), produce phases only

    def rate(self) -> float:
        return self.records / self.seconds


def broker_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_broker(directory: Path) -> tuple[subprocess.Popen, dict[str, dict]]:
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1")
    ca_file, cert_file, key_file = (directory / n for n in ("ca.pem", "server.pem", "server.key"))
    ca.cert_pem.write_to_path(str(ca_file))
    server.private_key_pem.write_to_path(str(key_file))
    cert_file.write_bytes(b"".join(blob.bytes() for blob in server.cert_chain_pems))
    ports = dict(zip(PROTOCOLS, free_ports(len(PROTOCOLS))))
    listeners = ",".join(f"{p}://127.0.0.1:{port}" for p, port in ports.items())
    command = [sys.executable, "-m", "onceflow", "broker", "--data-dir", str(directory / "data"),
               "--listeners", listeners, "--ssl-certfile", str(cert_file),
               "--ssl-keyfile", str(key_file), "--sasl-mechanisms", "SCRAM-SHA-512",
               "--add-scram", "SCRAM-SHA-512=[name=bench,password=bench-secret]"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               text=True)
    assert process.stdout is not None
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if "listening on" in line:
            return process, {p: client_settings(p, port, ca_file) for p, port in ports.items()}
        if not line and process.poll() is not None:
            break
    process.kill()
    raise BenchError("the broker did not start")


def free_ports(count: int) -> list[int]:
    """Ports that were free a moment ago (the sockets stay open until all are picked)."""
    probes = [socket.socket() for _ in range(count)]
    try:
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [probe.getsockname()[1] for probe in probes]
    finally:
        for probe in probes:
            probe.close()


def client_settings(protocol: str, port: int, ca_file: Path) -> dict:
    settings = {"bootstrap.servers": f"127.0.0.1:{port}", "security.protocol": protocol}
    if protocol != "PLAINTEXT":
        settings["ssl.ca.location"] = str(ca_file)
    if protocol == "SASL_SSL":
        settings.update({"sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "bench",
                         "sasl.password": "bench-secret"})
    return settings


def produce(settings: dict, topic: str, records: int, record_bytes: int, pid: int) -> Phase:
    failures: list = []
    producer = Producer(settings | {"acks": "all", "linger.ms": 5,
                                    "delivery.report.only.error": True,
                                    "on_delivery": lambda e, _m: failures.append(e)})
    payload = os.urandom(record_bytes)
    cpu0, client0, start = broker_cpu_s(pid), time.process_time(), time.perf_counter()
    for _ in range(records):
        while True:
            try:
                producer.produce(topic, payload)
                break
            except BufferError:
                producer.poll(0.001)
    remaining = producer.flush(PHASE_TIMEOUT_S)
    if failures or remaining:
        raise BenchError(f"produce over {settings['security.protocol']}: {failures[:1]} {remaining}")
    return Phase(records, time.perf_counter() - start, broker_cpu_s(pid) - cpu0,
                 time.process_time() - client0)


def consume(settings: dict, topic: str, records: int, partitions: int, pid: int) -> Phase:
    consumer = Consumer(settings | {"group.id": f"bench-{uuid.uuid4().hex[:8]}",
                                    "enable.auto.commit": False})
    count = 0
    cpu0, start = broker_cpu_s(pid), time.perf_counter()
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        deadline = time.monotonic() + PHASE_TIMEOUT_S
        while count < records:
            if time.monotonic() > deadline:
                raise BenchError(f"consume: {count} of {records}")
            for message in consumer.consume(min(CONSUME_BATCH, records - count), 1.0):
                if message.error() is not None:
                    raise BenchError(f"consume: {message.error()}")
                count += 1
    finally:
        seconds = time.perf_counter() - start
        consumer.close()
    return Phase(count, seconds, broker_cpu_s(pid) - cpu0)


def median(phases: list[Phase]) -> Phase:
    return sorted(phases, key=Phase.rate)[len(phases) // 2]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=RECORDS_DEFAULT)
    parser.add_argument("--record-bytes", type=int, default=RECORD_BYTES_DEFAULT)
    parser.add_argument("--partitions", type=int, default=PARTITIONS_DEFAULT)
    parser.add_argument("--runs", type=int, default=RUNS_DEFAULT)
    args = parser.parse_args(argv)
    results: dict[str, dict[str, list[Phase]]] = {p: {"produce": [], "consume": []}
                                                  for p in PROTOCOLS}
    with tempfile.TemporaryDirectory(prefix="onceflow-bench-sec-") as tmp:
        process, settings = start_broker(Path(tmp))
        try:
            admin = AdminClient(settings["PLAINTEXT"])
            for run in range(args.runs):
                for protocol in PROTOCOLS:
                    topic = f"bench-{protocol.lower()}-{run}-{uuid.uuid4().hex[:6]}"
                    admin.create_topics([NewTopic(topic, args.partitions, 1)])[topic].result(30)
                    results[protocol]["produce"].append(produce(
                        settings[protocol], topic, args.records, args.record_bytes, process.pid))
                    results[protocol]["consume"].append(consume(
                        settings[protocol], topic, args.records, args.partitions, process.pid))
        finally:
            process.terminate()
            process.wait(30)
    print(report(results, args, argv))
    return 0


def report(results, args, argv: list[str]) -> str:
    mb = args.record_bytes / BYTES_PER_MB
    base = {phase: median(results["PLAINTEXT"][phase]).rate() for phase in ("produce", "consume")}
    lines = [
        "Command: `" + " ".join([".venv/bin/python bench/security.py", *map(shlex.quote, argv)])
        + "`",
        "",
        (f"Load: {args.records:,} records x {args.record_bytes:,} B, {args.partitions} partitions,"
        f" acks=all, linger.ms=5; median of {args.runs} runs, listeners interleaved;"
        f" confluent-kafka {confluent_kafka.__version__} (librdkafka"
        f" {confluent_kafka.libversion()[0]}), Python {platform.python_version()},"
        f" {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f}."),
        "",
        ("| listener | produce records/s | produce MB/s | vs PLAINTEXT | broker CPU µs/record"
        " | client CPU µs/record | consume records/s | consume MB/s | vs PLAINTEXT"
        " | broker CPU µs/record |"),
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for protocol in PROTOCOLS:
        cells = [protocol]
        for phase in ("produce", "consume"):
            m = median(results[protocol][phase])
            cells += [f"{m.rate():,.0f}", f"{m.rate() * mb:.1f}",
                      f"{m.rate() / base[phase]:.2f}x",
                      f"{m.broker_cpu_s / m.records * 1e6:.2f}"]
            if phase == "produce":
                cells.append(f"{m.client_cpu_s / m.records * 1e6:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
