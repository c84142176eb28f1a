"""`onceflow broker --config server.properties` as a process: the file's values are the
broker's (auto-created topics, topic defaults, DescribeConfigs on the broker), flags win
over the file, and a bad value stops the start with one line naming the key."""

from __future__ import annotations

import subprocess
import sys

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource

from onceflow.testing import BrokerProcess
from tests.helpers import TIMEOUT_S, unique

PROPERTIES = """\
process.roles=broker,controller
node.id=1
listeners=PLAINTEXT://:9,CONTROLLER://:9093
controller.listener.names=CONTROLLER
log.dirs=/nonexistent/overridden-by-the-flag
num.partitions=3
log.retention.hours=2
log.segment.bytes=2097152
log.cleaner.backoff.ms=250
offsets.topic.num.partitions=2
transaction.state.log.num.partitions=2
group.initial.rebalance.delay.ms=0
"""


def test_config_file_values_reach_clients(tmp_path):
    path = tmp_path / "server.properties"
    path.write_text(PROPERTIES)
    broker = BrokerProcess(tmp_path / "data", args=("--config", str(path))).start()
    try:
        bootstrap = broker.bootstrap_servers  # --port and --data-dir override the file
        topic = unique("auto")
        producer = Producer({"bootstrap.servers": bootstrap})
        producer.produce(topic, b"x")
        assert producer.flush(TIMEOUT_S) == 0
        admin = AdminClient({"bootstrap.servers": bootstrap})
        metadata = admin.list_topics(topic, timeout=TIMEOUT_S)
        assert len(metadata.topics[topic].partitions) == 3  # num.partitions
        resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
        configs = admin.describe_configs([resource])[resource].result(TIMEOUT_S)
        assert configs["retention.ms"].value == str(2 * 3_600_000)
        assert configs["retention.ms"].source == ConfigSource.STATIC_BROKER_CONFIG.value
        assert configs["segment.bytes"].value == "2097152"
        broker_resource = ConfigResource(ConfigResource.Type.BROKER, "0")
        described = admin.describe_configs([broker_resource])[broker_resource].result(TIMEOUT_S)
        assert described["log.cleaner.backoff.ms"].value == "250"
        assert described["log.cleaner.backoff.ms"].source == \
            ConfigSource.STATIC_BROKER_CONFIG.value
        assert described["auto.create.topics.enable"].source == ConfigSource.DEFAULT_CONFIG.value
        assert (tmp_path / "data" / f"{topic}-2").is_dir()
    finally:
        broker.stop()


def test_a_bad_value_stops_the_start_naming_the_key(tmp_path):
    path = tmp_path / "server.properties"
    path.write_text(PROPERTIES + "num.partitions=lots\nmystery.key=1\n")
    result = subprocess.run(
        [sys.executable, "-m", "onceflow", "broker", "--config", str(path)],
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "num.partitions" in result.stderr and "lots" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
