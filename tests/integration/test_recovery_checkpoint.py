"""log.flush.offset.checkpoint.interval.ms: the running broker writes every log's recovery
point to the data directory's checkpoint that often (storage/checkpoint.py)."""

from __future__ import annotations

from confluent_kafka import Producer

from onceflow.broker.embedded import Broker
from onceflow.storage.checkpoint import read_recovery_checkpoint
from tests.helpers import create_topic, unique, wait_for

RECORDS = 10


def _checkpointed_end(broker: Broker) -> int:
    """The highest log end among the checkpoint's logs whose recovery point reached it."""
    checkpoint = read_recovery_checkpoint(broker.data_dir)
    if checkpoint is None:
        return 0
    return max((e.state.log_end_offset for e in checkpoint.entries
                if e.state.recovery_point_offset >= e.state.log_end_offset), default=0)


def test_the_checkpoint_follows_acknowledged_writes_at_the_configured_interval():
    # Kafka's default is 60 s; at 200 ms the records written below reach the file within
    # the wait (at the default they would not: the wait is well under 60 s).
    with Broker(recovery_checkpoint_interval_ms=200) as broker:
        topic = create_topic(broker.bootstrap_servers, unique("ckpt"))
        producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "acks": "all"})
        for i in range(RECORDS):
            producer.produce(topic, b"v%d" % i)
        assert producer.flush(30) == 0
        wait_for(lambda: _checkpointed_end(broker) >= RECORDS, timeout_s=20,
                 what="the recovery checkpoint to hold the acknowledged records")
