"""`--config server.properties`: Kafka's keys parsed, log.* defaults mapped to topic
configs, flags over the file, unknown keys warned about, bad values named."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from onceflow.broker.config_file import (
    ConfigFileError,
    config_from_properties,
    effective_broker_configs,
    load_config_file,
    parse_properties,
)

# Kafka 4's config/server.properties (KRaft, combined mode), comments cut, plus retention
# and cleaner keys as an operator would add them.
SERVER_PROPERTIES = r"""
# Licensed to the Apache Software Foundation (ASF) ...
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=localhost:9093
listeners=PLAINTEXT://:19092,CONTROLLER://:19093
inter.broker.listener.name=PLAINTEXT
advertised.listeners=PLAINTEXT://localhost:19092,CONTROLLER://localhost:19093
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SSL:SSL
num.network.threads=3
num.io.threads=8
socket.send.buffer.bytes=102400
socket.receive.buffer.bytes=102400
socket.request.max.bytes=104857600
log.dirs=/tmp/kraft-combined-logs
num.partitions=3
num.recovery.threads.per.data.dir=1
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
log.retention.hours=168
log.retention.minutes : 60
log.segment.bytes=1073741824
log.retention.check.interval.ms=300000
log.flush.offset.checkpoint.interval.ms=30000
log.cleanup.policy=delete
log.cleaner.backoff.ms = 500
log.cleaner.dedupe.buffer.size=\
  1048576
log.cleaner.io.max.bytes.per.second=5e6
offsets.topic.num.partitions=5
"""


def test_a_real_looking_server_properties_gives_its_values():
    config = config_from_properties(parse_properties(SERVER_PROPERTIES), {})
    assert (config.host, config.port) == ("0.0.0.0", 19092)
    assert (config.advertised_host, config.advertised_port) == ("localhost", 19092)
    assert config.data_dir == Path("/tmp/kraft-combined-logs")
    assert config.num_partitions == 3 and config.offsets_topic_num_partitions == 5
    assert config.log_cleaner_backoff_ms == 500 == config.offsets_compaction_interval_ms
    assert config.log_cleaner_dedupe_buffer_size == 1048576
    assert config.recovery_checkpoint_interval_ms == 30_000
    assert config.log_cleaner_io_max_bytes_per_second == 5_000_000
    defaults = dict(config.log_defaults)
    # log.retention.minutes wins over .hours (Kafka's precedence), in milliseconds
    assert defaults["retention.ms"] == str(60 * 60_000)
    assert defaults["segment.bytes"] == "1073741824" and defaults["cleanup.policy"] == "delete"
    described = effective_broker_configs(config)
    assert described["num.partitions"] == ("3", True)
    assert described["auto.create.topics.enable"] == ("true", False)
    unlimited = effective_broker_configs(config_from_properties({"log.dirs": "/d"}, {}))
    assert unlimited["log.cleaner.io.max.bytes.per.second"] == ("1.7976931348623157E308", False)
    assert described["log.retention.ms"] == (str(3_600_000), True)


def test_flags_override_the_file(tmp_path):
    path = tmp_path / "server.properties"
    path.write_text(SERVER_PROPERTIES)
    config = load_config_file(path, {"port": 29092, "data_dir": tmp_path / "data"})
    assert config.port == 29092 and config.data_dir == tmp_path / "data"
    assert config.num_partitions == 3


def test_unknown_keys_are_named_in_a_warning(caplog):
    with caplog.at_level(logging.WARNING):
        config_from_properties({"log.dirs": "/d", "log.retenshun.ms": "5", "foo": "1"}, {})
    assert "unknown keys ignored: foo, log.retenshun.ms" in caplog.text


@pytest.mark.parametrize("key,value", [
    ("num.partitions", "three"),
    ("num.partitions", "0"),
    ("auto.create.topics.enable", "yes"),
    ("log.retention.hours", "a week"),
    ("log.segment.bytes", "12"),          # below Kafka's minimum segment.bytes
    ("log.cleanup.policy", "shred"),
    ("listeners", "SASL_SSL://:9092"),
    ("log.cleaner.min.cleanable.ratio", "2"),
])
def test_a_bad_value_is_an_error_naming_the_key(key, value):
    with pytest.raises(ConfigFileError, match=key.replace(".", r"\.")):
        config_from_properties({"log.dirs": "/d", key: value}, {})


def test_properties_syntax():
    props = parse_properties("a=1\n  b : two words \n! comment\nc\\:d=x\\ny\ne \\\n  f\n")
    assert props == {"a": "1", "b": "two words", "c:d": "x\ny", "e": "f"}
