"""__consumer_offsets under a million offset commits: its size with compaction.

    .venv/bin/python bench/offsets_compaction.py                       # 1M commits
    .venv/bin/python bench/offsets_compaction.py --commits 200000 --segment-bytes 262144

Theory of operation: an embedded onceflow broker (its own thread and event loop, fsync
on unless --no-fsync) and a confluent-kafka consumer that never subscribes: it commits
explicit offsets for G groups x P partitions (a "simple" consumer, generation -1), each
commit() one OffsetCommit request of P offsets, asynchronously so that librdkafka keeps
several requests in flight. Every offset committed is one record appended to
__consumer_offsets, so without compaction the topic grows linearly; the compactor
(offsets_compaction_interval_ms) rewrites closed segments down to about one record per
live key. Every `--report-every` commits the script prints a markdown table row: records
appended so far, the bytes they took when appended, the topic's size on disk and its
segment count. At the end every group's offsets are fetched back and checked.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from onceflow.broker.embedded import Broker  # noqa: E402
from onceflow.broker.runtime.groups import OFFSETS_TOPIC  # noqa: E402

COMMITS_DEFAULT = 1_000_000
GROUPS_DEFAULT = 10
PARTITIONS_DEFAULT = 10
SEGMENT_BYTES_DEFAULT = 1024 * 1024
COMPACTION_INTERVAL_MS = 1_000
REPORT_EVERY_DEFAULT = 100_000
# Outstanding async commits before the script waits for callbacks: keeps librdkafka's
# queue (and our memory) bounded while several requests stay in flight.
IN_FLIGHT_MAX = 64
TIMEOUT_S = 60


def topic_bytes(data_dir: Path) -> tuple[int, int]:
    """(bytes, segment count) of every __consumer_offsets partition directory."""
    size = segments = 0
    for directory in data_dir.glob(f"{OFFSETS_TOPIC}-*"):
        for path in directory.iterdir():
            if path.is_file():
                size += path.stat().st_size
                segments += path.suffix == ".log"
    return size, segments


class Committer:
    def __init__(self, bootstrap: str, topic: str, groups: int, partitions: int) -> None:
        self.topic = topic
        self.partitions = partitions
        self.consumers = [
            Consumer(
                {
                    "bootstrap.servers": bootstrap,
                    "group.id": f"bench-g{g}",
                    "enable.auto.commit": False,
                    "on_commit": self._committed,
                }
            )
            for g in range(groups)
        ]
        self.sent = self.done = self.failed = 0
        self.last: dict[int, int] = {}  # consumer index -> last offset it committed

    def _committed(self, error, _partitions) -> None:
        self.done += 1
        self.failed += error is not None

    def commit(self, offset: int) -> None:
        index = self.sent % len(self.consumers)
        consumer = self.consumers[index]
        self.last[index] = offset
        offsets = [TopicPartition(self.topic, p, offset) for p in range(self.partitions)]
        consumer.commit(offsets=offsets, asynchronous=True)
        self.sent += 1
        while self.sent - self.done >= IN_FLIGHT_MAX:
            self.poll(0.01)

    def poll(self, timeout_s: float) -> None:
        for consumer in self.consumers:
            consumer.poll(timeout_s / len(self.consumers))

    def drain(self) -> None:
        deadline = time.monotonic() + TIMEOUT_S
        while self.done < self.sent and time.monotonic() < deadline:
            self.poll(0.05)
        assert self.done == self.sent, (self.done, self.sent)

    def check(self, expected: dict[int, int]) -> None:
        """Each group's committed offsets are the last it committed."""
        for index, consumer in enumerate(self.consumers):
            found = consumer.committed(
                [TopicPartition(self.topic, p) for p in range(self.partitions)], timeout=TIMEOUT_S
            )
            assert {tp.offset for tp in found} == {expected[index]}, found

    def close(self) -> None:
        for consumer in self.consumers:
            consumer.close()


def run(args: argparse.Namespace, data_dir: Path) -> None:
    settings = {
        "offsets_topic_num_partitions": 1,
        "fsync": args.fsync,
        "offsets_topic_segment_bytes": args.segment_bytes,
        "offsets_compaction_interval_ms": COMPACTION_INTERVAL_MS,
    }
    with Broker(data_dir, **settings) as broker:
        bootstrap = broker.bootstrap_servers
        topic = "bench-commits"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(topic, args.partitions, 1)])[topic].result(TIMEOUT_S)
        committer = Committer(bootstrap, topic, args.groups, args.partitions)
        runtime = broker.server.groups
        requests = args.commits // args.partitions
        every = max(args.report_every // args.partitions, 1)
        print(
            f"{args.commits} offset commits = {requests} OffsetCommit requests of "
            f"{args.partitions} partitions over {args.groups} groups; segment.bytes "
            f"{args.segment_bytes}, fsync {'on' if args.fsync else 'off'}\n"
        )
        print("| commits | appended bytes | on-disk bytes | segments | compactions | commits/s |")
        print("|---:|---:|---:|---:|---:|---:|")
        started = time.monotonic()
        for i in range(1, requests + 1):
            committer.commit(i)
            if i % every == 0 or i == requests:
                committer.drain()
                size, segments = topic_bytes(data_dir)
                rate = i * args.partitions / (time.monotonic() - started)
                compactions = len(runtime.compactor.history) if runtime.compactor else 0
                print(
                    f"| {i * args.partitions} | {runtime.appended_bytes} | {size} | "
                    f"{segments} | {compactions} | {rate:.0f} |",
                    flush=True,
                )
        assert committer.failed == 0, f"{committer.failed} commits failed"
        time.sleep(2 * COMPACTION_INTERVAL_MS / 1000)  # let the last rolled segment go
        size, segments = topic_bytes(data_dir)
        print(
            f"\nafter a last compaction: {size} bytes in {segments} segments "
            f"(appended: {runtime.appended_bytes} bytes)"
        )
        expected = dict(committer.last)
        committer.check(expected)
        committer.close()
    with Broker(data_dir, **settings) as broker:  # the compacted log replays to the same
        checker = Committer(broker.bootstrap_servers, "bench-commits", args.groups, args.partitions)
        checker.check(expected)
        checker.close()
    print("every group's committed offsets checked, before and after a restart")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=COMMITS_DEFAULT)
    parser.add_argument("--groups", type=int, default=GROUPS_DEFAULT)
    parser.add_argument("--partitions", type=int, default=PARTITIONS_DEFAULT)
    parser.add_argument("--segment-bytes", type=int, default=SEGMENT_BYTES_DEFAULT)
    parser.add_argument("--report-every", type=int, default=REPORT_EVERY_DEFAULT)
    parser.add_argument("--fsync", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="onceflow-bench-") as tmp:
        run(args, Path(tmp) / "data")


if __name__ == "__main__":
    main()
