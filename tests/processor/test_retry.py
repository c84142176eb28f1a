"""Retry and dead-letter flow: failures go through the retry topic with back-off and an
attempt count; after max_attempts they land in the dead-letter topic with the error
in headers; records that succeed on a later attempt are not dead-lettered."""

from __future__ import annotations

import itertools
import threading
import time

import processor_support as support
import pytest

from onceflow.processor import Processor, ProcessorConfig, Record, RetryPolicy

BACKOFF_MS = 300
MAX_ATTEMPTS = 3


@pytest.mark.timeout(60)
def test_retry_then_dead_letter(kafka_bootstrap: str, make_topic, on_mock: bool) -> None:
    topic = make_topic("retry-in")
    group = support.unique("retry")
    retry_topic, dlq_topic = f"{group}-retry", f"{group}-dlq"
    for name in (retry_topic, dlq_topic):
        support.create_topic(kafka_bootstrap, name, mock=on_mock)
    records = [
        (f"{kind}-{i}".encode(), f"{kind}-{i}".encode())
        for i in range(10)
        for kind in ("good", "flaky", "bad")
    ]
    support.produce(kafka_bootstrap, topic, records)

    attempts: dict[bytes, list[tuple[int, float]]] = {}
    lock = threading.Lock()

    def handle(record: Record) -> None:
        with lock:
            attempts.setdefault(record.value, []).append((record.attempt, time.monotonic()))
        if record.value.startswith(b"bad") or (
            record.value.startswith(b"flaky") and record.attempt < 3
        ):
            raise ValueError(f"cannot handle {record.value.decode()} (attempt {record.attempt})")

    policy = RetryPolicy(max_attempts=MAX_ATTEMPTS, backoff_ms=BACKOFF_MS, backoff_multiplier=1.5)
    config = ProcessorConfig(concurrency=4, commit_interval_ms=200, retry=policy)

    def done() -> bool:
        with lock:
            finished = [a for v, a in attempts.items() if not v.startswith(b"good") and len(a) >= 3]
            return len(finished) == 20 and len(attempts) == 30

    with Processor(
        bootstrap_servers=kafka_bootstrap,
        group_id=group,
        topics=[topic],
        handler=handle,
        config=config,
    ) as processor:
        processor.start()
        assert support.wait_until(done, timeout_s=30)
        dead = support.read_all(kafka_bootstrap, dlq_topic, expected=10, timeout_s=10)
        stats = processor.statistics()

    assert all([a for a, _ in attempts[f"good-{i}".encode()]] == [1] for i in range(10))
    for i in range(10):
        for kind in ("flaky", "bad"):
            history = attempts[f"{kind}-{i}".encode()]
            assert [a for a, _ in history] == [1, 2, 3], (kind, i, history)
            gaps = [later - earlier for (_, earlier), (_, later) in itertools.pairwise(history)]
            # Back-off: 300 ms after the first failure, 450 ms after the second.
            assert gaps[0] >= 0.3 - 0.02 and gaps[1] >= 0.45 - 0.02, gaps

    assert sorted(m.value() for m in dead) == sorted(f"bad-{i}".encode() for i in range(10))
    for message in dead:
        headers = dict(message.headers())
        assert headers["onceflow.attempt"] == b"3"
        assert headers["onceflow.error-type"] == b"builtins.ValueError"
        assert headers["onceflow.error"].startswith(b"cannot handle bad-")
        assert headers["onceflow.origin-topic"] == topic.encode()
        assert message.key() == message.value()
    assert stats.total("retried") == 40  # 10 flaky x 2 + 10 bad x 2
    assert stats.total("dead_lettered") == 10
    assert stats.total("failed") == 50
