"""Producer state survives broker crashes: retries after a SIGKILL are still duplicates.

Two views of the same promise (the seeds' "broker failure" case):

- a confluent-kafka idempotent producer (retries on) keeps sending numbered records while
  the broker process is SIGKILLed and restarted three times; afterwards every record is
  stored exactly once and each partition holds them in send order. Segments are small,
  so the restarted broker rebuilds its producer state from a snapshot taken at a segment
  roll plus a replay of the log after it;
- with a raw client, byte-exact: batches appended before a SIGKILL (or a clean stop)
  are answered, when retried after the restart, with their original offsets.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from confluent_kafka import Producer
from kio.schema.errors import ErrorCode

from onceflow.protocol.records import SimpleRecord, build_batch
from tests.helpers import create_topic
from tests.integration.test_idempotence_clients import exactly_once_problems, read_ids, value_of
from tests.integration.test_idempotence_rules import (
    RECORDS_PER_BATCH,
    WINDOW,
    Sent,
    init_producer_id,
    log_end_offset,
    new_producer,
    now_ms,
    send_window,
)
from tests.kafka_raw import RawClient

PARTITIONS = 3
KILLS = 3
RUN_BEFORE_KILL_S = 1.5
DOWN_S = 0.3
RUN_AFTER_LAST_RESTART_S = 1.0
# Small segments: several rolls per run, so the restarted broker loads a snapshot taken
# at a roll and replays only the log after it.
SEGMENT_BYTES = 1024 * 1024
ROLL_VALUE_BYTES = 400_000  # three such batches overflow one segment
# The producer notices a dead broker through its requests timing out or the connection
# dropping; keep both short so the test does not wait on them.
SOCKET_TIMEOUT_MS = 5_000
DELIVERY_TIMEOUT_MS = 120_000
FLUSH_TIMEOUT_S = 120


class SendingProducer:
    """Sends records with increasing ids from a thread until stopped; counts failures."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.sent = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._producer = Producer({
            "bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
            "linger.ms": 5, "socket.timeout.ms": SOCKET_TIMEOUT_MS,
            "delivery.timeout.ms": DELIVERY_TIMEOUT_MS, "reconnect.backoff.ms": 50,
            "reconnect.backoff.max.ms": 200, "queue.buffering.max.messages": 20_000,
        })
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _on_delivery(self, err, _message) -> None:
        if err is not None:
            self.errors.append(str(err))

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._producer.produce(self.topic, value=value_of(self.sent),
                                       on_delivery=self._on_delivery)
                self.sent += 1
            except BufferError:
                self._producer.poll(0.01)
            if self.sent % 500 == 0:
                self._producer.poll(0)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        assert self._producer.flush(FLUSH_TIMEOUT_S) == 0, "records still undelivered"


@pytest.mark.slow
def test_idempotent_producer_through_three_sigkills(onceflow_broker_process):
    broker = onceflow_broker_process()
    topic = create_topic(broker.bootstrap_servers, f"crash-{uuid.uuid4().hex[:8]}", PARTITIONS,
                         config={"segment.bytes": str(SEGMENT_BYTES)})
    producer = SendingProducer(broker.bootstrap_servers, topic)
    producer.start()
    for _ in range(KILLS):
        time.sleep(RUN_BEFORE_KILL_S)
        sent_before = producer.sent
        broker.kill()
        time.sleep(DOWN_S)
        broker.start()
        assert sent_before > 0
    time.sleep(RUN_AFTER_LAST_RESTART_S)
    producer.stop()
    assert not producer.errors, producer.errors[:5]
    log = broker.log_path.read_text()
    assert "producer state rebuilt" in log, "the restarts never replayed producer state"
    ids = read_ids(broker.bootstrap_servers, topic, PARTITIONS)
    problems = exactly_once_problems(ids, range(producer.sent))
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("stop", ["sigkill", "clean"])
def test_retries_after_a_restart_are_duplicates(onceflow_broker_process, stop):
    broker = onceflow_broker_process()
    topic = create_topic(broker.bootstrap_servers, f"restart-{uuid.uuid4().hex[:8]}")
    with RawClient(broker.bootstrap_servers) as client:
        producer = new_producer(client, topic)
        offsets = send_window(producer)
        batches = [producer.batch(i * RECORDS_PER_BATCH) for i in range(WINDOW)]
    broker.kill() if stop == "sigkill" else broker.stop()
    broker.start()
    with RawClient(broker.bootstrap_servers) as client:
        producer.client = client
        end = log_end_offset(client, topic)
        assert end == WINDOW * RECORDS_PER_BATCH
        for batch, offset in zip(batches, offsets, strict=True):
            assert producer.send(batch) == Sent(ErrorCode.none, offset)
        assert log_end_offset(client, topic) == end
        gap = producer.produce((WINDOW + 1) * RECORDS_PER_BATCH)
        assert gap.error == ErrorCode.out_of_order_sequence_number
        assert producer.produce(WINDOW * RECORDS_PER_BATCH) == Sent(ErrorCode.none, end)
        # Producer ids are never handed out twice, also across restarts.
        assert init_producer_id(client).producer_id > producer.producer_id


def test_snapshot_at_a_roll_then_replay_after_a_sigkill(onceflow_broker_process):
    """Precise: the log rolls (a snapshot is taken), more batches follow, SIGKILL (no clean
    snapshot). Retries of batches from before and after the roll are all recognised."""
    broker = onceflow_broker_process()
    topic = create_topic(broker.bootstrap_servers, f"roll-{uuid.uuid4().hex[:8]}",
                         config={"segment.bytes": str(SEGMENT_BYTES)})
    value_bytes = [ROLL_VALUE_BYTES] * 3 + [10, 10]  # the 3rd big batch rolls the log
    with RawClient(broker.bootstrap_servers) as client:
        producer = new_producer(client, topic)
        batches = [padded_batch(producer, seq, size) for seq, size in enumerate(value_bytes)]
        answers = [producer.send(batch) for batch in batches]
    assert all(a.error == ErrorCode.none for a in answers)
    partition_dir = broker.data_dir / f"{topic}-0"
    assert len(list(partition_dir.glob("*.log"))) > 1, "the log did not roll"
    assert list(partition_dir.glob("*.snapshot")), "the roll took no producer state snapshot"
    broker.kill()
    broker.start()
    with RawClient(broker.bootstrap_servers) as client:
        producer.client = client
        for batch, answer in zip(batches, answers, strict=True):
            assert producer.send(batch) == answer


def padded_batch(producer, sequence: int, value_bytes: int) -> bytes:
    """A one-record batch of `producer` with a value of `value_bytes`."""
    return build_batch([SimpleRecord(key=None, value=b"v" * value_bytes)],
                       producer_id=producer.producer_id, producer_epoch=producer.epoch,
                       base_sequence=sequence, base_timestamp_ms=now_ms())
