"""Compaction of user topics with real clients (confluent-kafka): newest value per key,
tombstones gone after delete.retention.ms, transactions as Kafka's cleaner treats them.

Segments roll by segment.ms while a ticker writes records under keys of their own (each
tick key is written once, so it appears once whatever the cleaner does); the cleaner only
ever cleans closed segments.
"""

from __future__ import annotations

import itertools
import os
import signal
import time
from collections import Counter

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from onceflow.broker.embedded import Broker
from tests.helpers import create_topic, unique

CLEANER_BACKOFF_MS = 200
DEADLINE_S = 60
KEYS = [f"k{i}".encode() for i in range(10)]
COMPACT = {"cleanup.policy": "compact", "segment.ms": "100",
           "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "1000"}


def _read_all(bootstrap: str, topic: str, isolation: str) -> list[tuple[int, bytes, bytes | None]]:
    """(offset, key, value) of every record from the start to the end, as a reader sees it."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("r"),
                         "enable.auto.commit": False, "isolation.level": isolation,
                         "enable.partition.eof": True})
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        out = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            message = consumer.poll(1)
            if message is None:
                continue
            if message.error() is not None:
                if message.error().code() == message.error()._PARTITION_EOF:
                    return out
                raise AssertionError(message.error())
            out.append((message.offset(), message.key(), message.value()))
        raise AssertionError("no end of partition within 30 s")
    finally:
        consumer.close()


class Ticker:
    """Writes a record under a fresh key, so segments keep rolling by segment.ms."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
        self.topic = topic
        self.count = itertools.count()

    def tick(self) -> None:
        self.producer.produce(self.topic, b"t", key=f"tick-{next(self.count)}".encode())
        self.producer.flush(10)


def _wait(condition, ticker: Ticker, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {DEADLINE_S} s waiting for {what}")
        ticker.tick()
        time.sleep(0.2)


def _by_key(records, keys=KEYS) -> dict[bytes, list[bytes | None]]:
    out: dict[bytes, list[bytes | None]] = {}
    for _offset, key, value in records:
        if key in keys:
            out.setdefault(key, []).append(value)
    return out


def test_compaction_keeps_the_newest_value_and_drops_expired_tombstones():
    with Broker(log_cleaner_backoff_ms=CLEANER_BACKOFF_MS) as broker:
        bootstrap = broker.bootstrap_servers
        topic = create_topic(bootstrap, unique("compact"), config=COMPACT)
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        for round_ in range(5):
            for key in KEYS:
                producer.produce(topic, f"{key.decode()}-v{round_}".encode(), key=key)
        for key in KEYS[:3]:
            producer.produce(topic, None, key=key)  # tombstones
        assert producer.flush(15) == 0
        written = 53
        ticker = Ticker(bootstrap, topic)
        expected = {key: [f"{key.decode()}-v4".encode()] for key in KEYS[3:]}

        def compacted() -> bool:
            return _by_key(_read_all(bootstrap, topic, "read_uncommitted")) == expected

        _wait(compacted, ticker, "each live key once, deleted keys gone")
        records = _read_all(bootstrap, topic, "read_uncommitted")
        offsets = [offset for offset, _, _ in records]
        assert offsets == sorted(set(offsets)), "offsets kept, in order, none twice"
        assert offsets[0] >= 0 and len([o for o in offsets if o < written]) == 7


def test_compaction_with_transactions_keeps_committed_values_and_open_transactions():
    with Broker(log_cleaner_backoff_ms=CLEANER_BACKOFF_MS,
                transaction_state_num_partitions=1, offsets_topic_num_partitions=1) as broker:
        bootstrap = broker.bootstrap_servers
        topic = create_topic(bootstrap, unique("compact-txn"), config=COMPACT)
        producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": unique("t")})
        producer.init_transactions(30)
        committed: dict[bytes, bytes] = {}
        for round_ in range(8):
            producer.begin_transaction()
            values = {key: f"{key.decode()}-r{round_}".encode() for key in KEYS}
            for key, value in values.items():
                producer.produce(topic, value, key=key)
            if round_ % 4 == 3:
                producer.abort_transaction(30)
            else:
                producer.commit_transaction(30)
                committed.update(values)
        ticker = Ticker(bootstrap, topic)
        for _ in range(3):  # committed rounds go into closed segments
            time.sleep(0.15)
            ticker.tick()
        # A transaction left open: the cleaner must stop before its first record.
        opener = Producer({"bootstrap.servers": bootstrap, "transactional.id": unique("o")})
        opener.init_transactions(30)
        opener.begin_transaction()
        open_values = {key: f"{key.decode()}-open".encode() for key in KEYS[:4]}
        for key, value in open_values.items():
            opener.produce(topic, value, key=key)
        opener.flush(15)
        expected = {key: [committed[key]] for key in KEYS}

        def compacted() -> bool:
            return _by_key(_read_all(bootstrap, topic, "read_committed")) == expected

        _wait(compacted, ticker, "read_committed: each key's newest committed value once")
        # Aborted values are gone from the log, not just hidden.
        uncommitted = _read_all(bootstrap, topic, "read_uncommitted")
        values = Counter(value for _, key, value in uncommitted if key in KEYS)
        assert not [v for v in values if v.endswith((b"-r3", b"-r7"))], values
        # The open transaction's records are still there, and commit later.
        assert all(values[value] == 1 for value in open_values.values()), values
        opener.commit_transaction(30)
        after = _by_key(_read_all(bootstrap, topic, "read_committed"))
        for key in KEYS:
            assert after[key][-1] == open_values.get(key, committed[key]), (key, after[key])


def test_cleaner_metrics():
    with Broker(log_cleaner_backoff_ms=CLEANER_BACKOFF_MS) as broker:
        bootstrap = broker.bootstrap_servers
        topic = create_topic(bootstrap, unique("compact-metrics"), config=COMPACT)
        producer = Producer({"bootstrap.servers": bootstrap})
        for round_ in range(3):
            for key in KEYS:
                producer.produce(topic, f"v{round_}".encode(), key=key)
        producer.flush(15)
        ticker = Ticker(bootstrap, topic)
        metrics = broker._server.state.metrics

        def cleaned() -> bool:
            text = metrics.render().decode()
            return f'onceflow_log_cleaner_runs_total{{topic="{topic}"}}' in text

        _wait(cleaned, ticker, "a cleaning counted")
        text = metrics.render().decode()
        assert f'onceflow_log_cleaner_dirty_ratio{{partition="0",topic="{topic}"}}' in text
        assert f'onceflow_log_cleaner_uncleanable_offset{{partition="0",topic="{topic}"}}' in text


def _cleaner_pids(broker: Broker) -> set[int]:
    pool = broker._server.cleaner._pool
    return set(pool._processes or ()) if pool is not None else set()


def test_cleaner_process_killed_mid_cleaning_leaves_the_log_intact_and_is_replaced():
    """The cleaner's child process, killed while it reads and stages (its I/O throttled so
    that a cleaning lasts seconds): the log reads as before, and a new child cleans."""
    with Broker(log_cleaner_backoff_ms=CLEANER_BACKOFF_MS,
                log_cleaner_io_max_bytes_per_second=50_000) as broker:
        bootstrap = broker.bootstrap_servers
        topic = create_topic(bootstrap, unique("compact-kill"), config=COMPACT)
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        for round_ in range(20):
            for key in KEYS:
                producer.produce(topic, f"{key.decode()}-v{round_}".encode().ljust(500, b"."),
                                 key=key)
        assert producer.flush(15) == 0
        ticker = Ticker(bootstrap, topic)
        cleaner = broker._server.cleaner
        _wait(lambda: (cleaner.cleaning_now is not None and cleaner.child_ready is not None
                       and cleaner.child_ready.done() and not cleaner.history), ticker,
              "the first cleaning under way in the child")
        (killed,) = _cleaner_pids(broker)
        os.kill(killed, signal.SIGKILL)
        before = _read_all(bootstrap, topic, "read_uncommitted")
        offsets = [offset for offset, _, _ in before]
        assert offsets == sorted(set(offsets)), "offsets kept, in order, none twice"
        expected = {key: f"{key.decode()}-v19".encode().ljust(500, b".") for key in KEYS}
        assert {key: values[-1] for key, values in _by_key(before).items()} == expected

        def compacted() -> bool:
            return _by_key(_read_all(bootstrap, topic, "read_uncommitted")) == {
                key: [value] for key, value in expected.items()}

        _wait(compacted, ticker, "each key once, cleaned by a new child")
        assert cleaner.history and killed not in _cleaner_pids(broker)
