"""kill -9 during log cleaning, in a loop: nothing acknowledged is lost, nothing appears
twice, every offset keeps its record.

A broker process cleans a compacted topic (cleaner backoff 50 ms, dirty ratio 0.01) while
it is killed at random moments, restarted (recovery) and written to again. At the end a
reader from the start sees offsets in order, none twice, each holding the record that was
acknowledged at that offset, and every key's newest acknowledged value.
"""

from __future__ import annotations

import random
import time

from confluent_kafka import Producer

from onceflow.testing import BrokerProcess
from tests.helpers import TIMEOUT_S, create_topic, read_partition, unique

CYCLES = 8
KEYS = [f"key-{i}".encode() for i in range(300)]
VALUE_BYTES = 1_000
PROPERTIES = """\
log.cleaner.backoff.ms=50
offsets.topic.num.partitions=1
transaction.state.log.num.partitions=1
"""


def _write(bootstrap: str, topic: str, acked: dict[int, tuple[bytes, bytes]], count: int,
           rng: random.Random) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                         "enable.idempotence": True})

    def report(error, message) -> None:
        if error is None:
            acked[message.offset()] = (message.key(), message.value())

    for i in range(count):
        key = rng.choice(KEYS)
        value = f"{key.decode()}-{time.monotonic_ns()}-{i}".encode().ljust(VALUE_BYTES, b".")
        producer.produce(topic, value, key=key, on_delivery=report)
        producer.poll(0)
    assert producer.flush(TIMEOUT_S * 2) == 0


def _read_all(bootstrap: str, topic: str) -> list[tuple[int, bytes, bytes]]:
    return [(m.offset(), m.key(), m.value()) for m in read_partition(bootstrap, topic, 0, 60)]


def test_kill_during_cleaning_loses_and_duplicates_nothing(tmp_path):
    rng = random.Random(14)
    path = tmp_path / "server.properties"
    path.write_text(PROPERTIES)
    broker = BrokerProcess(tmp_path / "data", args=("--config", str(path))).start()
    topic = create_topic(broker.bootstrap_servers, unique("crash"), config={
        "cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01",
        "segment.bytes": str(1024 * 1024), "segment.ms": "200"})
    acked: dict[int, tuple[bytes, bytes]] = {}
    staged_at_kill = 0  # kills that caught a segment being staged (timing decides)
    try:
        for _cycle in range(CYCLES):
            _write(broker.bootstrap_servers, topic, acked, 1500, rng)
            time.sleep(rng.uniform(0.0, 0.4))  # the cleaner is at work by now, or soon
            broker.kill()
            staged_at_kill += (tmp_path / "data" / f"{topic}-0" / ".cleaned").exists()
            broker.start()
        _write(broker.bootstrap_servers, topic, acked, 50, rng)  # rolls the last segment
        newest = {key: offset for offset, (key, _) in sorted(acked.items())}
        # Let the cleaner finish with the broker up, then read.
        deadline = time.monotonic() + 60
        while True:
            records = _read_all(broker.bootstrap_servers, topic)
            if len(records) < len(acked) / 2 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    finally:
        broker.kill()
    offsets = [offset for offset, _, _ in records]
    assert offsets == sorted(set(offsets)), "offsets in order and none twice"
    for offset, key, value in records:
        assert acked.get(offset) == (key, value), f"offset {offset} changed its record"
    kept = set(offsets)
    missing = {key: offset for key, offset in newest.items() if offset not in kept}
    assert not missing, f"newest acknowledged values lost: {missing}"
    assert len(records) < len(acked) / 2, "the cleaner ran"
    cleanings = broker.log_path.read_text().count("cleaned ")
    print(f"{len(acked)} acknowledged, {len(records)} after cleaning, {cleanings} cleanings, "
          f"{staged_at_kill} of {CYCLES} kills left a staged segment")
