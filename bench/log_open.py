"""CPU per log of opening every partition of a data directory, in-process, as the broker's
startup recovery does (`Store.partition` = `PartitionLog.open`, then `load_producer_state`,
as `BrokerState._open_locked`), and in the same run a floor: the bare system calls a minimal
open needs per log (listdir of the partition directory, open/read/close of
`partition.state`, open/pread/close of each `.log`).

The source directory is copied first (`cp -a`: opening repairs and rewrites files), so the
same crashed directory can be opened again and again; the copy also puts it in the page
cache, so the figures are CPU, not disk. Judge a change by `open µs/log` against the floor of
the same run (the machine is shared; process CPU time is less noisy than wall time).

    nice -n 10 python bench/log_open.py /tmp/p10k/data [--repeat 3] [--close] [--profile OUT]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from onceflow.broker.state import load_producer_state
from onceflow.storage.store import Store

PRODUCER_ID_EXPIRATION_MS = 7 * 24 * 3600 * 1000  # Kafka's producer.id.expiration.ms default


def open_all(data_dir: Path, close: bool = False) -> tuple[int, float, float]:
    """(logs opened, CPU seconds of the opens, CPU seconds of Store construction).
    `close`: then a clean shutdown of the store (fsyncs on), timed in wall seconds."""
    now = int(time.time() * 1000)
    cpu0 = time.process_time()
    store = Store(data_dir, now)
    cpu1 = time.process_time()
    keys = [(name, i) for name, info in sorted(store.topics().items())
            for i in range(info.num_partitions)]
    for topic, index in keys:
        load_producer_state(store.partition(topic, index), now, PRODUCER_ID_EXPIRATION_MS)
    cpu2 = time.process_time()
    if close:
        wall = time.monotonic()
        store.close()
        print(f"  Store.close() of {len(keys)} logs: {time.monotonic() - wall:.2f} s wall, "
              f"{time.process_time() - cpu2:.2f} s CPU", flush=True)
    return len(keys), cpu2 - cpu1, cpu1 - cpu0


def floor(data_dir: Path) -> tuple[int, float]:
    """(logs, CPU seconds) of the bare os calls a minimal open makes."""
    dirs = [e.path for e in os.scandir(data_dir) if e.is_dir()]
    cpu0 = time.process_time()
    for path in dirs:
        names = os.listdir(path)
        if "partition.state" in names:
            fd = os.open(f"{path}/partition.state", os.O_RDONLY | os.O_CLOEXEC)
            os.read(fd, 65536)
            os.close(fd)
        for name in names:
            if name.endswith(".log"):
                fd = os.open(f"{path}/{name}", os.O_RDONLY | os.O_CLOEXEC)
                os.pread(fd, os.fstat(fd).st_size, 0)
                os.close(fd)
    return len(dirs), time.process_time() - cpu0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="a (crashed) data directory; only read")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--close", action="store_true",
                        help="then close the store cleanly and print how long that took")
    parser.add_argument("--profile", type=Path, help="cProfile output of the last run's opens")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="log_open-") as tmp:
        for run in range(args.repeat):
            data_dir = Path(tmp) / f"data{run}"
            subprocess.run(["cp", "-a", str(args.source), str(data_dir)], check=True)
            if args.profile and run == args.repeat - 1:
                import cProfile
                profiler = cProfile.Profile()
                profiler.enable()
                logs, open_s, store_s = open_all(data_dir)
                profiler.disable()
                profiler.dump_stats(args.profile)
            else:
                logs, open_s, store_s = open_all(data_dir, args.close)
            floor_logs, floor_s = floor(data_dir)
            print(f"run {run}: {logs} logs, open {open_s / logs * 1e6:.0f} µs/log "
                  f"(total {open_s:.2f} s, Store() {store_s:.2f} s), "
                  f"floor {floor_s / max(floor_logs, 1) * 1e6:.0f} µs/log", flush=True)
            shutil.rmtree(data_dir)


if __name__ == "__main__":
    main()
