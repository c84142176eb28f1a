"""Deferred completion (a handler finishes a record later, from another thread) with a
timeout that force-completes and reports; at-least-once outputs; Prometheus metrics."""

from __future__ import annotations

import random
import threading
from collections import Counter

import processor_support as support
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from onceflow.processor import Output, Processor, ProcessorConfig, Record

RECORDS = 400
NEVER = 8  # records with key b"never" are deferred and never completed


@pytest.mark.timeout(60)
def test_deferred_completion_timeout_outputs_and_metrics(kafka_bootstrap: str, make_topic) -> None:
    topic = make_topic("deferred")
    out_topic = make_topic("deferred-out")
    data = [(b"never", b"n")] * NEVER + [
        (f"k{i % 13}".encode(), b"v") for i in range(RECORDS - NEVER)
    ]
    support.produce(kafka_bootstrap, topic, data)
    group = support.unique("deferred")
    registry = CollectorRegistry()

    def handle(record: Record) -> None:
        completion = record.defer(timeout_ms=300 if record.key == b"never" else None)
        if record.key == b"never":
            return
        output = Output(out_topic, f"{record.partition}:{record.offset}".encode(), record.key)
        threading.Timer(random.random() * 0.02, completion.complete, args=(output,)).start()

    config = ProcessorConfig(concurrency=4, commit_interval_ms=100, deferred_timeout_ms=60_000)
    with Processor(
        bootstrap_servers=kafka_bootstrap,
        group_id=group,
        topics=[topic],
        handler=handle,
        config=config,
        registry=registry,
    ) as processor:
        processor.start()
        ends = support.end_offsets(kafka_bootstrap, topic)
        assert support.wait_until(
            lambda: (
                {p: s.committed_offset for (_, p), s in processor.statistics().partitions.items()}
                == ends
            ),
            timeout_s=20,
        )
        stats = processor.statistics()
        exposition = generate_latest(registry).decode()

    assert stats.total("deferred_timeouts") == NEVER
    assert stats.total("processed") == RECORDS - NEVER
    outputs = support.read_all(kafka_bootstrap, out_topic, expected=RECORDS - NEVER, timeout_s=10)
    never = never_positions(kafka_bootstrap, topic)
    expected = Counter(
        f"{p}:{o}".encode() for p, end in ends.items() for o in range(end) if (p, o) not in never
    )
    assert Counter(m.value() for m in outputs) == expected
    for name in (
        "onceflow_processor_records_processed_total",
        "onceflow_processor_deferred_timeouts_total",
        "onceflow_processor_pending_records",
        "onceflow_processor_commit_lag_records",
        "onceflow_processor_processing_seconds_bucket",
        "onceflow_processor_records_failed_total",
    ):
        assert name in exposition, name
    assert f'onceflow_processor_deferred_timeouts_total{{group="{group}"' in exposition


def never_positions(bootstrap: str, topic: str) -> set[tuple[int, int]]:
    messages = support.read_all(bootstrap, topic, expected=RECORDS, timeout_s=10)
    return {(m.partition(), m.offset()) for m in messages if m.key() == b"never"}
