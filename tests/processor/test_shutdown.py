"""Graceful shutdown drains fetched records (bounded) and commits them; the next
processor of the group continues exactly where the commit says, offset map included."""

from __future__ import annotations

import threading
import time

import processor_support as support
import pytest

from onceflow.processor import Processor, ProcessorConfig, Record, offset_map

RECORDS = 600
CONCURRENCY = 2


class Log:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.done: list[tuple[int, int]] = []

    def handler(self, delay_s: float):
        def handle(record: Record) -> None:
            time.sleep(delay_s)
            with self.lock:
                self.done.append((record.partition, record.offset))

        return handle


def committed_coverage(bootstrap: str, group: str, topic: str) -> set[tuple[int, int]]:
    covered = set()
    for tp in support.committed(bootstrap, group, topic):
        if tp.offset >= 0:
            covered.update((tp.partition, o) for o in range(tp.offset))
            for start, end in offset_map.decode(tp.metadata, tp.offset) or []:
                covered.update((tp.partition, o) for o in range(start, end))
    return covered


@pytest.mark.timeout(60)
def test_stop_drains_commits_and_the_next_instance_continues(
    kafka_bootstrap: str, make_topic, group_config
) -> None:
    topic = make_topic("shutdown")
    support.produce(kafka_bootstrap, topic, ((str(i % 40).encode(), b"x") for i in range(RECORDS)))
    group = support.unique("shutdown")
    first, second = Log(), Log()
    config = ProcessorConfig(
        concurrency=CONCURRENCY, commit_interval_ms=60_000, shutdown_timeout_ms=500
    )

    processor = Processor(
        bootstrap_servers=kafka_bootstrap,
        group_id=group,
        topics=[topic],
        handler=first.handler(0.02),
        config=config,
        consumer_config=group_config,
    )
    processor.start()
    assert support.wait_until(lambda: len(first.done) >= 150, timeout_s=20)
    stopped_at = time.monotonic()
    processor.stop()
    assert time.monotonic() - stopped_at < 5  # bounded by shutdown_timeout_ms (+ close)
    # The interval is a minute: everything committed comes from the shutdown commit.
    covered = committed_coverage(kafka_bootstrap, group, topic)
    with first.lock:
        processed_first = set(first.done)
    assert covered <= processed_first
    # Only records still running when the drain gave up may be missing from the commit.
    assert len(processed_first - covered) <= CONCURRENCY * support.PARTITIONS
    assert len(covered) >= 150

    with Processor(
        bootstrap_servers=kafka_bootstrap,
        group_id=group,
        topics=[topic],
        handler=second.handler(0.0),
        config=ProcessorConfig(commit_interval_ms=100),
        consumer_config=group_config,
    ) as follower:
        follower.start()
        everything = {
            (p, o)
            for p, end in support.end_offsets(kafka_bootstrap, topic).items()
            for o in range(end)
        }
        assert support.wait_until(lambda: covered | set(second.done) >= everything, timeout_s=20), (
            sorted(everything - covered - set(second.done))[:20],
            follower.statistics(),
        )
    assert not set(second.done) & covered
