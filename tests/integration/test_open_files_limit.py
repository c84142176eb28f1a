"""A broker whose RLIMIT_NOFILE is far below its partition count: one CreateTopics of many
partitions succeeds (segment files beyond log.max.open.files are closed and reopened on
use), every partition takes and returns records, and new connections are still accepted."""

from __future__ import annotations

import resource

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from onceflow.testing import BrokerProcess

NOFILE = 128  # soft and hard: the broker cannot raise it
OPEN_FILES_MAX = 32
TOPICS = 8
PARTITIONS = 50  # 400 partitions, each with a .log: three times the descriptor limit
TIMEOUT_S = 60


def _low_nofile() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))


def test_more_partitions_than_descriptors(tmp_path):
    props = tmp_path / "server.properties"
    props.write_text(f"log.max.open.files={OPEN_FILES_MAX}\n")
    broker = BrokerProcess(tmp_path / "data", args=("--config", str(props)),
                           preexec_fn=_low_nofile).start()
    try:
        bootstrap = broker.bootstrap_servers
        admin = AdminClient({"bootstrap.servers": bootstrap})
        names = [f"many-{i}" for i in range(TOPICS)]
        futures = admin.create_topics([NewTopic(n, PARTITIONS, 1) for n in names],
                                      request_timeout=TIMEOUT_S)
        for future in futures.values():
            future.result(TIMEOUT_S)
        metadata = admin.list_topics(timeout=TIMEOUT_S)
        assert all(len(metadata.topics[n].partitions) == PARTITIONS for n in names)

        producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
        for name in names:
            for p in range(PARTITIONS):
                producer.produce(name, value=f"{name}/{p}".encode(), partition=p)
        assert producer.flush(TIMEOUT_S) == 0

        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "g",
                             "enable.auto.commit": False})
        wanted = {(n, p) for n in names for p in range(PARTITIONS)}
        consumer.assign([TopicPartition(n, p, 0) for n, p in wanted])
        seen = set()
        for _ in range(TIMEOUT_S * 10):
            for message in consumer.consume(500, 0.1):
                if message.error() is None:
                    assert message.value() == f"{message.topic()}/{message.partition()}".encode()
                    seen.add((message.topic(), message.partition()))
            if seen == wanted:
                break
        consumer.close()
        assert seen == wanted
        # a fresh client still connects and is answered
        assert names[0] in AdminClient({"bootstrap.servers": bootstrap}).list_topics(
            timeout=TIMEOUT_S).topics
    finally:
        broker.kill()


def test_running_out_of_descriptors_is_an_error_on_the_request(tmp_path):
    """With the cap above the limit, the CreateTopics that runs out of descriptors gets
    KAFKA_STORAGE_ERROR for that topic; the connection and the broker keep working."""
    props = tmp_path / "server.properties"
    props.write_text("log.max.open.files=100000\n")
    broker = BrokerProcess(tmp_path / "data", args=("--config", str(props)),
                           preexec_fn=_low_nofile).start()
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        futures = admin.create_topics([NewTopic("too-many", 2 * NOFILE, 1)],
                                      request_timeout=TIMEOUT_S)
        try:
            futures["too-many"].result(TIMEOUT_S)
            raise AssertionError("creating more logs than descriptors succeeded")
        except KafkaException as exc:
            assert exc.args[0].code() == KafkaError.KAFKA_STORAGE_ERROR
        # the same client, then a new one, are still answered; a small topic still works
        assert "too-many" not in admin.list_topics(timeout=TIMEOUT_S).topics
        fresh = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        fresh.create_topics([NewTopic("small", 2, 1)])["small"].result(TIMEOUT_S)
        assert len(fresh.list_topics(timeout=TIMEOUT_S).topics["small"].partitions) == 2
    finally:
        broker.kill()
