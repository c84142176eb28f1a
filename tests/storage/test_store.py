"""Store (topics, partitions, crash-safe metadata) and topic config parsing."""

from __future__ import annotations

import json
import uuid

import pytest
from conftest import NOW_MS
from storage_batches import make_batch

from onceflow.storage import (
    TOPIC_CONFIGS,
    CorruptFileError,
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidTopicError,
    LogConfig,
    Store,
    TopicExistsError,
    UnknownTopicError,
    topic_config_defaults,
    validate_topic_configs,
)
from onceflow.storage.layout import read_checked_file, write_checked_file
from onceflow.storage.store import TOPICS_META_FILE, TOPICS_META_MAGIC, TOPICS_META_VERSION


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "data", NOW_MS)
    yield s
    s.close()


def test_create_append_reopen(tmp_path):
    store = Store(tmp_path, NOW_MS)
    info = store.create_topic("orders", 3, {"retention.ms": "1000"}, replication_factor=1)
    assert isinstance(info.topic_id, uuid.UUID) and info.num_partitions == 3
    store.partition("orders", 2).append([make_batch(4)], NOW_MS)
    assert store.log_config("orders").retention_ms == 1000
    store.close()
    again = Store(tmp_path, NOW_MS)
    try:
        assert again.topics() == {"orders": info}
        log = again.partition("orders", 2)
        assert log.log_end_offset == 4 and log.recovery.clean_shutdown
        assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == [
            "orders-0",
            "orders-1",
            "orders-2",
        ]
    finally:
        again.close()


def test_create_errors(store):
    store.create_topic("a.b", 1, {})
    with pytest.raises(TopicExistsError):
        store.create_topic("a.b", 1, {})
    with pytest.raises(InvalidTopicError):
        store.create_topic("a_b", 1, {})  # collides with a.b
    for bad in ["", ".", "..", "x" * 250, "a/b", "é"]:
        with pytest.raises(InvalidTopicError):
            store.create_topic(bad, 1, {})
    with pytest.raises(InvalidPartitionsError):
        store.create_topic("p", 0, {})
    with pytest.raises(InvalidConfigError):
        store.create_topic("c", 1, {"retention.ms": "soon"})
    with pytest.raises(InvalidConfigError):
        store.create_topic("c", 1, {"no.such.config": "1"})
    assert set(store.topics()) == {"a.b"}


def test_delete_topic_removes_directories(store):
    store.create_topic("gone", 2, {})
    store.partition("gone", 0).append([make_batch(1)], NOW_MS)
    store.delete_topic("gone")
    assert "gone" not in store.topics()
    assert not (store.data_dir / "gone-0").exists() and not (store.data_dir / "gone-1").exists()
    with pytest.raises(UnknownTopicError):
        store.partition("gone", 0)
    with pytest.raises(UnknownTopicError):
        store.delete_topic("gone")
    again = store.create_topic("gone", 1, {})
    assert store.partition("gone", 0).log_end_offset == 0 and again.num_partitions == 1


def test_interrupted_delete_is_finished_on_open(tmp_path):
    store = Store(tmp_path, NOW_MS)
    store.create_topic("doomed", 2, {})
    store.create_topic("kept", 1, {})
    store.partition("doomed", 1).append([make_batch(1)], NOW_MS)
    store.close()
    # A crash right after the "deleting" mark was written, before the directories went.
    _, payload = read_checked_file(
        tmp_path / TOPICS_META_FILE, TOPICS_META_MAGIC, (TOPICS_META_VERSION,)
    )
    meta = json.loads(payload)
    for entry in meta["topics"]:
        entry["deleting"] = entry["name"] == "doomed"
    write_checked_file(
        tmp_path / TOPICS_META_FILE,
        TOPICS_META_MAGIC,
        TOPICS_META_VERSION,
        json.dumps(meta).encode(),
    )
    again = Store(tmp_path, NOW_MS)
    try:
        assert set(again.topics()) == {"kept"}
        assert not (tmp_path / "doomed-0").exists() and not (tmp_path / "doomed-1").exists()
        _, payload = read_checked_file(tmp_path / TOPICS_META_FILE, TOPICS_META_MAGIC, (1,))
        assert [e["name"] for e in json.loads(payload)["topics"]] == ["kept"]
    finally:
        again.close()


def test_corrupt_metadata_is_refused(tmp_path):
    Store(tmp_path, NOW_MS).close()
    with open(tmp_path / TOPICS_META_FILE, "r+b") as f:
        f.seek(-3, 2)
        f.write(b"xyz")
    with pytest.raises(CorruptFileError):
        Store(tmp_path, NOW_MS)


def test_create_partitions_and_alter_configs(store):
    store.create_topic("t", 1, {})
    store.create_partitions("t", 3)
    assert store.topics()["t"].num_partitions == 3
    assert store.partition("t", 2).log_end_offset == 0
    with pytest.raises(InvalidPartitionsError):
        store.create_partitions("t", 3)
    store.alter_topic_configs("t", {"message.timestamp.type": "LogAppendTime"})
    assert store.partition("t", 1).config.log_append_time
    assert store.topics()["t"].configs == {"message.timestamp.type": "LogAppendTime"}
    with pytest.raises(InvalidConfigError):
        store.alter_topic_configs("t", {"segment.bytes": "10"})  # below Kafka's 1 MiB minimum
    assert store.topics()["t"].configs == {"message.timestamp.type": "LogAppendTime"}


def test_config_defaults_are_kafkas():
    defaults = topic_config_defaults()
    assert defaults["segment.bytes"] == "1073741824"
    assert defaults["segment.ms"] == defaults["retention.ms"] == "604800000"
    assert defaults["retention.bytes"] == "-1"
    assert defaults["max.message.bytes"] == "1048588"
    assert defaults["index.interval.bytes"] == "4096"
    assert defaults["message.timestamp.type"] == "CreateTime"
    assert defaults["cleanup.policy"] == "delete"
    assert defaults["min.insync.replicas"] == "1"
    assert defaults["compression.type"] == "producer"
    assert LogConfig.from_topic_configs({}) == LogConfig()


def test_config_parsing_and_layering():
    config = LogConfig.from_topic_configs(
        {"cleanup.policy": " compact , delete", "retention.bytes": "+2048"},
        {"retention.ms": "5000", "segment.bytes": "2097152"},
    )
    assert (config.cleanup_policy, config.retention_bytes) == ("compact,delete", 2048)
    assert (config.retention_ms, config.segment_bytes) == (5000, 2097152)
    assert config.deletes and config.compacts
    assert LogConfig.from_topic_configs({"internal.segment.bytes": "1000"}).segment_bytes == 1000
    assert validate_topic_configs({"retention.ms": None}) == {}


@pytest.mark.parametrize(
    "name,value",
    [
        ("segment.bytes", "1048575"),
        ("segment.bytes", "2147483648"),
        ("segment.ms", "0"),
        ("retention.ms", "-2"),
        ("retention.ms", "1e3"),
        ("retention.ms", "1_000"),
        ("cleanup.policy", "delete,forever"),
        ("message.timestamp.type", "createtime"),
        ("min.insync.replicas", "0"),
        ("compression.type", "brotli"),
        ("preallocate", "yes"),
        ("min.cleanable.dirty.ratio", "1.5"),
        ("compression.gzip.level", "0"),
        ("compression.zstd.level", "23"),
        ("unknown.config", "1"),
    ],
)
def test_invalid_config_values(name, value):
    with pytest.raises(InvalidConfigError, match=name):
        LogConfig.from_topic_configs({name: value})


def test_compaction_lags_must_be_ordered():
    with pytest.raises(InvalidConfigError):
        validate_topic_configs({"min.compaction.lag.ms": "10", "max.compaction.lag.ms": "5"})


def test_every_listed_default_is_valid():
    for name, key in TOPIC_CONFIGS.items():
        validate_topic_configs({name: key.default})


def test_batch_saves_topics_once_at_the_end(tmp_path, monkeypatch):
    store = Store(tmp_path, NOW_MS)
    saves = []
    real_save = store._save_meta
    monkeypatch.setattr(store, "_save_meta", lambda: (saves.append(1), real_save()))
    with store.batch():
        for i in range(5):
            store.create_topic(f"bulk-{i}", 3, {})
        assert saves == []  # nothing written before the block ends
    assert saves == [1]
    store.partition("bulk-4", 2).append([memoryview(make_batch(2))], NOW_MS)
    store.close()
    reopened = Store(tmp_path, NOW_MS)
    assert {f"bulk-{i}" for i in range(5)} <= set(reopened.topics())
    assert reopened.partition("bulk-4", 2).log_end_offset == 2
    reopened.close()


def test_batch_whose_write_fails_removes_its_topics(tmp_path, monkeypatch):
    store = Store(tmp_path, NOW_MS)
    store.create_topic("before", 1, {})

    def failing_save():
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        with store.batch():
            store.create_topic("lost", 2, {})
            monkeypatch.setattr(store, "_save_meta", failing_save)
    monkeypatch.undo()
    assert set(store.topics()) == {"before"}
    assert not (tmp_path / "lost-0").exists()
    store.close()
    assert set(Store(tmp_path, NOW_MS).topics()) == {"before"}
