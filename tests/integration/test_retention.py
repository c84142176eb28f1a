"""Retention with real clients: segments roll by segment.ms and go by retention.ms and
retention.bytes, the log start follows, and reads below it are out of range.

The cleaner may delete a segment while a test lists the partition directory: a file that
vanished between listing and stat counts as 0 bytes.
"""

from __future__ import annotations

import time
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from onceflow.broker.embedded import Broker
from tests.helpers import create_topic, unique, wait_for

CHECK_INTERVAL_MS = 500  # log.retention.check.interval.ms for these tests
WRITE_S = 10.0
RETENTION_MS = 2_000
SEGMENT_MS = 1_000


def _dir_bytes(directory: Path, pattern: str = "*") -> int:
    total = 0
    for path in directory.glob(pattern):
        try:
            total += path.stat().st_size
        except FileNotFoundError:  # deleted by the cleaner since the listing
            pass
    return total


def _earliest(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("g")})
    try:
        low, _high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        return low
    finally:
        consumer.close()


def test_retention_ms_moves_the_log_start_and_bounds_the_disk():
    with Broker(retention_check_interval_ms=CHECK_INTERVAL_MS) as broker:
        bootstrap = broker.bootstrap_servers
        topic = create_topic(bootstrap, unique("ret"), config={
            "retention.ms": str(RETENTION_MS), "segment.ms": str(SEGMENT_MS)})
        directory = broker.data_dir / f"{topic}-0"
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        value = b"v" * 200
        start = time.monotonic()
        sizes: list[tuple[float, int]] = []
        earliest_at: float | None = None
        written = 0
        while (elapsed := time.monotonic() - start) < WRITE_S:
            for _ in range(50):
                producer.produce(topic, value, key=b"k")
                written += 1
            producer.poll(0)
            time.sleep(0.02)
            if int(elapsed * 4) != int((time.monotonic() - start) * 4):
                producer.flush(10)
                sizes.append((elapsed, _dir_bytes(directory)))
                if earliest_at is None and _earliest(bootstrap, topic) > 0:
                    earliest_at = elapsed
        assert producer.flush(15) == 0
        # Past 0 within retention.ms + check interval + one segment (+ a loaded machine's
        # slack), all well inside the 10 s of writing.
        assert earliest_at is not None, f"earliest offset still 0 after {WRITE_S} s"
        assert earliest_at < (RETENTION_MS + CHECK_INTERVAL_MS + SEGMENT_MS) / 1000 + 4
        # Disk usage stops growing: the last third is no bigger than the middle third
        # (with room for a segment of jitter), and far below what was written.
        middle = max(size for t, size in sizes if WRITE_S / 3 <= t < 2 * WRITE_S / 3)
        last = max(size for t, size in sizes if t >= 2 * WRITE_S / 3)
        assert last <= middle * 1.6, (middle, last)
        assert last < written * len(value) * 0.7, (last, written)

        # A read below the log start is OFFSET_OUT_OF_RANGE (auto.offset.reset=error).
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("g"),
                             "auto.offset.reset": "error", "enable.auto.commit": False})
        try:
            consumer.assign([TopicPartition(topic, 0, 0)])
            error = None
            deadline = time.monotonic() + 30
            while error is None and time.monotonic() < deadline:
                message = consumer.poll(1)
                if message is not None and message.error() is not None:
                    error = message.error()
                elif message is not None:
                    raise AssertionError(f"read offset {message.offset()} below the log start")
            assert error is not None and error.code() == KafkaError._AUTO_OFFSET_RESET, error
            assert "out of range" in error.str().lower(), error.str()
        finally:
            consumer.close()


def test_retention_bytes_bounds_a_partition_to_within_one_segment():
    segment_bytes = 1024 * 1024  # Kafka's least segment.bytes
    retention_bytes = 2 * segment_bytes
    with Broker(retention_check_interval_ms=CHECK_INTERVAL_MS) as broker:
        bootstrap = broker.bootstrap_servers
        topic = create_topic(bootstrap, unique("retb"), config={
            "retention.bytes": str(retention_bytes), "segment.bytes": str(segment_bytes)})
        directory = broker.data_dir / f"{topic}-0"
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        value = b"x" * 10_000
        for _ in range(800):  # about 8 MB
            producer.produce(topic, value)
            producer.poll(0)
        assert producer.flush(30) == 0

        def log_bytes() -> int:
            return _dir_bytes(directory, "*.log")

        wait_for(lambda: log_bytes() <= retention_bytes + segment_bytes,
                 "the partition to shrink to retention.bytes + one segment", 30)
        assert log_bytes() >= retention_bytes - segment_bytes  # retention keeps what it must
        assert _earliest(bootstrap, topic) > 0
