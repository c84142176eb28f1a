"""`onceflow broker` as a process: clean stop on SIGTERM, restart on the same data,
and advertised listeners."""

from __future__ import annotations

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from onceflow import Broker
from tests.helpers import TIMEOUT_S, create_topic, unique

RECORDS = 500


def _count(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("count"),
                         "enable.auto.commit": False})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=TIMEOUT_S)[1]
    finally:
        consumer.close()


def test_sigterm_stops_cleanly_and_data_survives_restart(onceflow_broker_process):
    broker = onceflow_broker_process()
    topic = create_topic(broker.bootstrap_servers, unique("restart"))
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "acks": "all"})
    for i in range(RECORDS):
        producer.produce(topic, str(i).encode())
    assert producer.flush(TIMEOUT_S) == 0
    assert broker.stop() == 0, "SIGTERM must end the broker with exit code 0"
    broker.start()
    assert _count(broker.bootstrap_servers, topic) == RECORDS
    assert "stopped cleanly" in broker.log_path.read_text()


def test_advertised_address_reaches_clients():
    with Broker() as real:
        port = int(real.bootstrap_servers.rsplit(":", 1)[1])
    with Broker(port=port, advertised_host="localhost") as broker:
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"})
        brokers = admin.list_topics(timeout=TIMEOUT_S).brokers
        assert [(b.host, b.port) for b in brokers.values()] == [("localhost", port)]
