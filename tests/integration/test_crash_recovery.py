"""SIGKILL the broker while an acks=all producer runs: after a restart on the same
data dir every acknowledged record is there, and no partial batch is visible."""

from __future__ import annotations

import threading
import time
import uuid

from confluent_kafka import Consumer, Producer, TopicPartition

from tests.helpers import create_topic

PARTITIONS = 3
PRODUCE_BEFORE_KILL_S = 2.0
PRODUCE_AFTER_RESTART_S = 1.0
TIMEOUT_S = 30


class _AckedProducer:
    """Produces numbered records until stopped; remembers which ones were acked."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.acked: set[int] = set()
        self.failed = 0
        self._stop = threading.Event()
        self._producer = Producer({
            "bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
            "message.timeout.ms": 60_000, "reconnect.backoff.max.ms": 200,
            "compression.type": "gzip",
        })
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _on_delivery(self, err, message) -> None:
        if err is None:
            self.acked.add(int(message.value()))
        else:
            self.failed += 1

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            try:
                self._producer.produce(self.topic, value=str(i).encode(), on_delivery=self._on_delivery)
                i += 1
            except BufferError:
                pass
            self._producer.poll(0.001 if i % 100 == 0 else 0)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        assert self._producer.flush(TIMEOUT_S) == 0


def _read_all(bootstrap: str, topic: str) -> list[int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4()}",
                         "check.crcs": True, "enable.auto.commit": False})
    low_high = [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=TIMEOUT_S)
                for p in range(PARTITIONS)]
    expected = sum(high - low for low, high in low_high)
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    values: list[int] = []
    deadline = time.monotonic() + TIMEOUT_S
    while len(values) < expected and time.monotonic() < deadline:
        for message in consumer.consume(10_000, timeout=0.5):
            assert not message.error(), message.error()
            values.append(int(message.value()))
    consumer.close()
    assert len(values) == expected, "the log end offsets promise records the consumer cannot read"
    return values


def test_acked_records_survive_sigkill(onceflow_broker_process):
    broker = onceflow_broker_process()
    topic = f"crash-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap_servers, topic, PARTITIONS)
    producer = _AckedProducer(broker.bootstrap_servers, topic)
    producer.start()
    for _ in range(2):
        time.sleep(PRODUCE_BEFORE_KILL_S)
        acked_before_kill = len(producer.acked)
        broker.kill()
        time.sleep(0.3)
        broker.start()
        assert acked_before_kill > 0
    time.sleep(PRODUCE_AFTER_RESTART_S)
    producer.stop()
    values = _read_all(broker.bootstrap_servers, topic)
    missing = producer.acked - set(values)
    assert not missing, f"{len(missing)} acknowledged records lost, e.g. {sorted(missing)[:5]}"
    assert producer.failed == 0
    # Every stored record is one the producer sent (no garbage from torn writes).
    assert set(values) <= set(range(max(values) + 1))
