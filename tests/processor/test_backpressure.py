"""Pending records never exceed max_pending_records: full partitions are paused (and
seeked back to the first record that did not fit), and resume once drained."""

from __future__ import annotations

import threading
import time

import processor_support as support
import pytest

from onceflow.processor import Processor, ProcessorConfig, Record

MAX_PENDING = 40
RECORDS = 2000


@pytest.mark.timeout(60)
def test_pending_never_exceeds_max_pending_records(kafka_bootstrap: str, make_topic) -> None:
    topic = make_topic("backpressure")
    support.produce(kafka_bootstrap, topic, ((str(i % 97).encode(), b"x") for i in range(RECORDS)))
    seen: set[tuple[int, int]] = set()
    lock = threading.Lock()

    # One slow key per partition holds the watermark, so fast keys pile up above it.
    def handle(record: Record) -> None:
        time.sleep(0.02 if record.key == b"0" else 0.0005)
        with lock:
            seen.add((record.partition, record.offset))

    config = ProcessorConfig(
        concurrency=8,
        max_pending_records=MAX_PENDING,
        poll_batch_records=500,
        commit_interval_ms=100,
    )
    group = support.unique("bp")
    sampled_max = 0
    with Processor(
        bootstrap_servers=kafka_bootstrap,
        group_id=group,
        topics=[topic],
        handler=handle,
        config=config,
    ) as processor:
        processor.start()
        deadline = time.monotonic() + 45
        paused_seen = False
        while len(seen) < RECORDS and time.monotonic() < deadline:
            stats = processor.statistics()
            for partition in stats.partitions.values():
                sampled_max = max(sampled_max, partition.pending)
                paused_seen = paused_seen or partition.paused
            time.sleep(0.002)
        stats = processor.statistics()
    assert len(seen) == RECORDS  # nothing skipped by the pause/seek-back
    assert sampled_max <= MAX_PENDING
    assert all(p.pending_max <= MAX_PENDING for p in stats.partitions.values())
    assert max(p.pending_max for p in stats.partitions.values()) == MAX_PENDING  # bound reached
    assert paused_seen
    ends = support.end_offsets(kafka_bootstrap, topic)
    assert {
        tp.partition: tp.offset for tp in support.committed(kafka_bootstrap, group, topic)
    } == ends
