"""Run-time properties: blocked keys, rate limit and concurrency change while the
processor runs, without a restart, and per-key order survives the lane resize."""

from __future__ import annotations

import threading
import time

import processor_support as support
import pytest

from onceflow.processor import Processor, ProcessorConfig, Record

RATE_PER_PARTITION = 50.0
KEYS = 20


class Observer:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.running_max = 0
        self.times: list[float] = []
        self.values: list[bytes] = []
        self.order_errors: list[str] = []
        self.last: dict[bytes, int] = {}

    def handle(self, record: Record) -> None:
        seq = int(record.value.split(b":")[1])
        with self.lock:
            self.running += 1
            self.running_max = max(self.running_max, self.running)
            if seq <= self.last.get(record.key, -1):
                self.order_errors.append(f"{record.key!r} {seq}")
            self.last[record.key] = seq
        time.sleep(0.005)
        with self.lock:
            self.running -= 1
            self.times.append(time.monotonic())
            self.values.append(record.value)

    def reset_max(self) -> None:
        with self.lock:
            self.running_max = self.running


def records(start: int, count: int, blocked: int) -> list[tuple[bytes, bytes]]:
    out = [(b"blocked", f"blocked:{start + i}".encode()) for i in range(blocked)]
    out += [(f"k{i % KEYS}".encode(), f"k{i % KEYS}:{start + i}".encode()) for i in range(count)]
    return out


@pytest.mark.timeout(60)
def test_blocked_keys_rate_and_concurrency_change_at_run_time(
    kafka_bootstrap: str, make_topic
) -> None:
    topic = make_topic("props")
    support.produce(kafka_bootstrap, topic, records(0, 400, blocked=40))
    observer = Observer()
    config = ProcessorConfig(
        concurrency=1,
        rate_limit_per_s=RATE_PER_PARTITION,
        blocked_keys=frozenset({b"blocked"}),
        commit_interval_ms=200,
    )
    with Processor(
        bootstrap_servers=kafka_bootstrap,
        group_id=support.unique("props"),
        topics=[topic],
        handler=observer.handle,
        config=config,
    ) as processor:
        processor.start()
        # Phase 1: one lane per partition, 50 records/s per partition, key blocked.
        assert support.wait_until(lambda: len(observer.times) >= 150, timeout_s=20)
        assert support.wait_until(
            lambda: processor.statistics().total("skipped") == 40, timeout_s=20
        )
        with observer.lock:
            first, last, count = observer.times[0], observer.times[-1], len(observer.times)
        rate = (count - 1) / (last - first)
        assert rate <= 4 * RATE_PER_PARTITION * 1.25, rate
        assert observer.running_max <= 4  # one lane in each of the 4 partitions

        # Phase 2: no limit, 16 lanes, nothing blocked; new "blocked" records now run.
        processor.update_properties(concurrency=16, rate_limit_per_s=None, blocked_keys=set())
        observer.reset_max()
        support.produce(kafka_bootstrap, topic, records(1000, 400, blocked=10))
        assert support.wait_until(lambda: len(observer.values) >= 800 + 10, timeout_s=20)
        stats = processor.statistics()
    assert observer.running_max > 4, "concurrency did not grow"
    assert observer.order_errors == []
    blocked_seen = sorted(v for v in observer.values if v.startswith(b"blocked"))
    assert blocked_seen == sorted(f"blocked:{1000 + i}".encode() for i in range(10))
    assert stats.total("skipped") == 40
    assert processor.properties.concurrency == 16
