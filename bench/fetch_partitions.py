"""Broker CPU of one Fetch (and one Metadata) of every partition of a many-partition broker
(issue 19): `onceflow broker` (a child process) on a copy of a data dir, then ROUNDS times a
Metadata request for all topics and a Fetch v12 of every partition at offset 0 with
partition_max_bytes 1 KiB and max_bytes 64 MiB (bench/partitions.py's fetch_errors request),
each timed by the broker's CPU (utime + stime from /proc/PID/stat) around the request.

Same-run reference: after each Fetch, this process opens each partition's first segment,
preads its first 1 KiB and closes it (the least a Fetch of partitions whose descriptors are
not open can cost), timed by this process's CPU. `--old-src DIR` runs the same rounds against
another tree's `src` (e.g. `git archive main src | tar -x -C /tmp/old`) on a fresh copy in the
same run, and checks that both answer the same record bytes.

    nice -n 10 python bench/fetch_partitions.py --data-dir DIR [--rounds 6] [--old-src DIR]
    nice -n 10 python bench/fetch_partitions.py --topics 1000 --partitions 10 --records 25

Without --data-dir the layout is created first (CreateTopics, then RECORDS records of 100
bytes to every partition, then the broker killed), which takes minutes at 10,000 partitions.
The broker's CPU is counted in clock ticks (10 ms): the figures mean something from a few
thousand partitions on.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic
from partitions import TIMEOUT_S, produce_records

from onceflow.client.wire import Connection
from onceflow.protocol.apis import ApiKey
from onceflow.testing import BrokerProcess

PARTITION_MAX_BYTES = 1024
MAX_BYTES = 64 << 20
FIRST_SEGMENT = "00000000000000000000.log"


def broker_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def fetch_all(port: int, partitions: dict[str, list[int]]) -> tuple[int, int, str]:
    """(partitions answered with an error, record bytes, digest of the records in order)."""
    with Connection("127.0.0.1", port, timeout_s=TIMEOUT_S) as conn:
        answer = conn.call(
            ApiKey.FETCH, (12, 12), replica_id=-1, max_wait=0, min_bytes=0,
            max_bytes=MAX_BYTES, isolation_level=0, session_id=0, session_epoch=-1,
            topics=[{"topic": topic, "partitions": [
                {"partition": p, "current_leader_epoch": -1, "fetch_offset": 0,
                 "log_start_offset": -1, "partition_max_bytes": PARTITION_MAX_BYTES}
                for p in indexes]} for topic, indexes in partitions.items()],
            forgotten_topics_data=[], rack_id="")
    errors, size, digest = 0, 0, hashlib.sha256()
    for topic in answer.responses:
        for p in topic.partitions:
            errors += p.error_code != 0
            records = bytes(p.records or b"")
            size += len(records)
            digest.update(f"{topic.topic}-{p.partition_index}:{len(records)}:".encode())
            digest.update(records)
    return errors, size, digest.hexdigest()[:16]


def bare_reads_s(paths: list[str]) -> float:
    """This process's CPU for open + pread(1 KiB) + close of each path."""
    start = time.process_time()
    for path in paths:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        os.pread(fd, PARTITION_MAX_BYTES, 0)
        os.close(fd)
    return time.process_time() - start


def create_layout(data: Path, topics: int, partitions: int, records: int) -> None:
    broker = BrokerProcess(data).start()
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        futures = admin.create_topics([NewTopic(f"p-{i}", partitions, 1) for i in range(topics)],
                                      request_timeout=TIMEOUT_S, operation_timeout=TIMEOUT_S)
        for future in futures.values():
            future.result(TIMEOUT_S)
        produce_records(broker.bootstrap_servers, topics, partitions, records)
    finally:
        broker.kill()   # as after a crash (bench/partitions.py --restart); each run recovers


def wait_ready(broker: BrokerProcess) -> dict[str, list[int]]:
    """Every partition led and answering a Fetch (startup recovery done): the layout."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        metadata = admin.list_topics(timeout=TIMEOUT_S)
        partitions = {t.topic: sorted(t.partitions) for t in metadata.topics.values()
                      if not t.topic.startswith("__")}
        led = all(p.leader >= 0 for t in metadata.topics.values() for p in t.partitions.values())
        if led and fetch_all(broker.port, partitions)[0] == 0:
            return partitions
        if time.monotonic() > deadline:
            raise RuntimeError("the broker did not answer every partition")
        time.sleep(0.5)


def run_tree(label: str, src: str | None, source: Path, work: Path, rounds: int) -> dict:
    data = work / f"data-{label}"
    subprocess.run(["cp", "-a", str(source), str(data)], check=True)
    saved = os.environ.get("PYTHONPATH")
    if src is not None:
        os.environ["PYTHONPATH"] = src
    try:
        broker = BrokerProcess(data).start()
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
    assert broker.process is not None
    pid = broker.process.pid
    try:
        partitions = wait_ready(broker)
        total = sum(len(v) for v in partitions.values())
        paths = [str(data / f"{t}-{p}" / FIRST_SEGMENT) for t, ps in partitions.items() for p in ps]
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        fetch_us, metadata_us, bare_us, answer = [], [], [], None
        for _ in range(rounds):
            before = broker_cpu_s(pid)
            admin.list_topics(timeout=TIMEOUT_S)
            metadata_us.append((broker_cpu_s(pid) - before) / total * 1e6)
            before = broker_cpu_s(pid)
            errors, size, digest = fetch_all(broker.port, partitions)
            fetch_us.append((broker_cpu_s(pid) - before) / total * 1e6)
            bare_us.append(bare_reads_s(paths) / total * 1e6)
            if errors:
                raise RuntimeError(f"{errors} partitions answered with an error")
            answer = (size, digest)
        print(f"{label}: {total} partitions, Fetch answer {answer[0]} record bytes "
              f"(digest {answer[1]})")
        for name, values in (("Fetch broker CPU", fetch_us), ("Metadata broker CPU", metadata_us),
                             ("bare open+pread+close", bare_us)):
            print(f"  {name:22} per partition: median {statistics.median(values):5.1f} us, "
                  f"mean {statistics.fmean(values):5.1f} us  "
                  f"(rounds: {' '.join(f'{v:.0f}' for v in values)})")
        return {"answer": answer, "fetch": fetch_us, "bare": bare_us}
    finally:
        broker.kill()   # a clean stop of 10,000 partitions takes long; the copy is thrown away


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data-dir", type=Path, help="a broker data dir to copy (read only)")
    parser.add_argument("--topics", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=10)
    parser.add_argument("--records", type=int, default=25)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--old-src", help="another tree's src directory, run in the same run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="onceflow-bench-fetch-partitions-") as base:
        work = Path(base)
        source = args.data_dir
        if source is None:
            source = work / "layout"
            start = time.monotonic()
            create_layout(source, args.topics, args.partitions, args.records)
            print(f"created {args.topics} x {args.partitions} partitions with {args.records} "
                  f"records each in {time.monotonic() - start:.0f} s")
        this = run_tree("this tree", None, source, work, args.rounds)
        if args.old_src:
            old = run_tree("old tree", args.old_src, source, work, args.rounds)
            same = "the same" if old["answer"] == this["answer"] else "DIFFERENT"
            print(f"both trees answered {same} record bytes")


if __name__ == "__main__":
    sys.exit(main())
