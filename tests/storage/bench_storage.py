"""Storage measurements (not a test): run `python tests/storage/bench_storage.py [dir]`.

Prints: raw fdatasync latency of this disk, 1 MiB append+fsync latency, group-commit
fsyncs/s and requests/s with many concurrent requesters, append and read throughput.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from storage_batches import make_batch  # noqa: E402

from onceflow.storage import GroupCommitter, LogConfig, PartitionLog  # noqa: E402
from onceflow.storage.layout import read_header  # noqa: E402


def _ms(samples: list[float]) -> str:
    samples = sorted(samples)
    p99 = samples[min(len(samples) - 1, int(len(samples) * 0.99))]
    median = statistics.median(samples)
    return f"median {median * 1e3:.2f} ms, p99 {p99 * 1e3:.2f} ms (n={len(samples)})"


def raw_fsync(directory: Path, rounds: int = 50) -> None:
    fd = os.open(directory / "raw", os.O_RDWR | os.O_CREAT)
    samples = []
    for i in range(rounds):
        t = time.perf_counter()
        os.pwrite(fd, b"x" * 4096, i * 4096)
        os.fdatasync(fd)
        samples.append(time.perf_counter() - t)
    os.close(fd)
    print(f"raw 4 KiB pwrite+fdatasync: {_ms(samples)}")


def append_fsync_1mib(directory: Path, rounds: int = 30) -> None:
    log = PartitionLog.open(directory / "big-0", LogConfig(), 0)
    batch = make_batch([os.urandom(1000) for _ in range(1040)])  # ~1 MiB
    samples = []
    for _ in range(rounds):
        t = time.perf_counter()
        log.append([batch], 0)
        log.flush()
        samples.append(time.perf_counter() - t)
    log.close()
    print(f"1 MiB append + fsync ({len(batch)} B batch): {_ms(samples)}")


def group_commit(
    directory: Path, threads_n: int = 32, partitions: int = 4, seconds: float = 3.0
) -> None:
    logs = [PartitionLog.open(directory / f"gc-{i}", LogConfig(), 0) for i in range(partitions)]
    committer = GroupCommitter(fsync_enabled=True)
    batch = make_batch([b"v" * 100] * 10)  # ~1.2 KiB
    stop = time.monotonic() + seconds
    latencies: list[float] = []
    lock = threading.Lock()

    def requester(i: int) -> None:
        log, mine = logs[i % partitions], []
        while time.monotonic() < stop:
            t = time.perf_counter()
            log.append([batch], 0)
            committer.request_flush(log).result()
            mine.append(time.perf_counter() - t)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=requester, args=(i,)) for i in range(threads_n)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start
    committer.close()
    stats = committer.statistics()
    print(
        f"group commit, {threads_n} requesters on {partitions} logs: "
        f"{stats.requests / elapsed:.0f} acked appends/s, {stats.rounds / elapsed:.0f} rounds/s, "
        f"{stats.flushes / elapsed:.0f} log fsyncs/s, {stats.requests / max(stats.flushes, 1):.1f} "
        f"requests per fsync; append+ack {_ms(latencies)}"
    )
    for log in logs:
        log.close()


def throughput(directory: Path, total_mib: int = 256) -> None:
    log = PartitionLog.open(directory / "tp-0", LogConfig(segment_bytes=128 * 1024 * 1024), 0)
    batches = [make_batch([os.urandom(100) for _ in range(140)]) for _ in range(64)]  # ~16 KiB
    per_round = sum(len(b) for b in batches)
    rounds = total_mib * 1024 * 1024 // per_round
    t = time.perf_counter()
    for _ in range(rounds):
        for b in batches:
            log.append([b], 0)
    append_s = time.perf_counter() - t
    t = time.perf_counter()
    log.flush()
    flush_s = time.perf_counter() - t
    size = log.size_bytes
    t = time.perf_counter()
    offset, read = 0, 0
    while offset < log.log_end_offset:
        data = log.read(offset, 1024 * 1024, 1 << 62)
        read += len(data)
        offset = read_header(data, _last_batch_start(data)).last_offset + 1
    read_s = time.perf_counter() - t
    print(
        f"append {size / append_s / 2**20:.0f} MiB/s ({rounds * len(batches) / append_s:.0f} "
        f"batches/s of {len(batches[0])} B, no fsync), final fsync {flush_s * 1e3:.0f} ms, "
        f"read (1 MiB fetches) {read / read_s / 2**20:.0f} MiB/s"
    )
    log.close()


def _last_batch_start(data: bytes) -> int:
    pos = last = 0
    while pos < len(data):
        last = pos
        pos += 12 + int.from_bytes(data[pos + 8 : pos + 12], "big")
    return last


def main() -> None:
    base = Path(sys.argv[1]) if len(sys.argv) > 1 else None
    with tempfile.TemporaryDirectory(dir=base) as tmp:
        directory = Path(tmp)
        raw_fsync(directory)
        append_fsync_1mib(directory)
        group_commit(directory, threads_n=1, partitions=1)
        group_commit(directory, threads_n=32, partitions=1)
        group_commit(directory, threads_n=32, partitions=4)
        throughput(directory)


if __name__ == "__main__":
    main()
