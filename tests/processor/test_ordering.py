"""Per-key order with concurrency 64 per partition and random task latencies: every
key's sequence numbers arrive in order, one key never runs twice at once, different
keys do run concurrently, and everything ends up committed."""

from __future__ import annotations

import asyncio
import random
import threading
import time

import processor_support as support
import pytest

from onceflow.processor import Processor, ProcessorConfig, Record

KEYS = 200
SEQUENCES = 25  # records per key: 5000 in all
LATENCY_S_MAX = 0.003


class OrderChecker:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.last_seq: dict[bytes, int] = {}
        self.running: set[bytes] = set()
        self.concurrent_max = 0
        self.violations: list[str] = []
        self.count = 0

    def begin(self, record: Record) -> None:
        seq = int(record.value)
        with self.lock:
            if record.key in self.running:
                self.violations.append(f"{record.key!r} ran concurrently")
            self.running.add(record.key)
            self.concurrent_max = max(self.concurrent_max, len(self.running))
            expected = self.last_seq.get(record.key, -1) + 1
            if seq != expected:
                self.violations.append(f"{record.key!r}: got {seq}, expected {expected}")
            self.last_seq[record.key] = seq

    def end(self, record: Record) -> None:
        with self.lock:
            self.running.discard(record.key)
            self.count += 1


def produce_sequences(bootstrap: str, topic: str) -> None:
    # Interleave keys so that every partition holds many keys in mixed order.
    records = [
        (f"key-{k}".encode(), str(seq).encode()) for seq in range(SEQUENCES) for k in range(KEYS)
    ]
    support.produce(bootstrap, topic, records)


def run_and_check(bootstrap: str, topic: str, handler, checker: OrderChecker) -> None:
    group = support.unique("order")
    config = ProcessorConfig(concurrency=64, commit_interval_ms=200)
    with Processor(
        bootstrap_servers=bootstrap, group_id=group, topics=[topic], handler=handler, config=config
    ) as processor:
        processor.start()
        assert support.wait_until(lambda: checker.count >= KEYS * SEQUENCES, timeout_s=40)
    assert checker.violations == []
    assert checker.count == KEYS * SEQUENCES
    assert all(seq == SEQUENCES - 1 for seq in checker.last_seq.values())
    assert checker.concurrent_max >= 8, "keys did not run concurrently"
    ends = support.end_offsets(bootstrap, topic)
    assert {tp.partition: tp.offset for tp in support.committed(bootstrap, group, topic)} == ends


@pytest.mark.timeout(60)
def test_per_key_order_with_threads(kafka_bootstrap: str, make_topic) -> None:
    topic = make_topic("order-threads")
    produce_sequences(kafka_bootstrap, topic)
    checker = OrderChecker()

    def handle(record: Record) -> None:
        checker.begin(record)
        time.sleep(random.random() * LATENCY_S_MAX)
        checker.end(record)

    run_and_check(kafka_bootstrap, topic, handle, checker)


@pytest.mark.timeout(60)
def test_per_key_order_with_asyncio(kafka_bootstrap: str, make_topic) -> None:
    topic = make_topic("order-async")
    produce_sequences(kafka_bootstrap, topic)
    checker = OrderChecker()

    async def handle(record: Record) -> None:
        checker.begin(record)
        await asyncio.sleep(random.random() * LATENCY_S_MAX)
        checker.end(record)

    run_and_check(kafka_bootstrap, topic, handle, checker)
