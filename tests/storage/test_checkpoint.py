"""The data directory's recovery checkpoint (storage/checkpoint.py): a clean stop restarts
without scanning or rewriting any log's state, a kill -9 re-validates only what lies past
each log's checkpointed recovery point (a torn tail there is truncated), and a corrupt,
missing or stale checkpoint costs a longer scan, never data."""

from __future__ import annotations

import os
from bisect import bisect_left
from pathlib import Path

import pytest
from conftest import NOW_MS
from storage_batches import crc_ok, make_batch, split_batches, with_base_offset

from onceflow.storage import Store
from onceflow.storage.checkpoint import RECOVERY_CHECKPOINT_FILE, read_recovery_checkpoint
from onceflow.storage.layout import PARTITION_STATE_FILE, read_header, read_partition_state

TOPIC = "t"
PARTITIONS = 2
# Small segments (internal.segment.bytes: Kafka's test-only override) so that a log has
# several of them and "only the segment holding the recovery point" is a real difference.
CONFIGS = {"internal.segment.bytes": "1500", "index.interval.bytes": "100"}


def fill(store: Store, partition: int, n: int) -> list[bytes]:
    log = store.partition(TOPIC, partition)
    stored = []
    for i in range(n):
        batch = make_batch(3, base_timestamp_ms=1000 + i)
        info = log.append([batch], NOW_MS)
        stored.append(with_base_offset(batch, info.first_offset))
    log.flush()  # acknowledged with acks=all: durable
    return stored


def crash(store: Store) -> None:
    """What survives kill -9: the files as written, no close, no checkpoint."""
    for partition in range(PARTITIONS):
        if store.is_open(TOPIC, partition):
            store.partition(TOPIC, partition).discard()


def assert_log_is(store: Store, partition: int, stored: list[bytes]) -> None:
    log = store.partition(TOPIC, partition)
    assert log.log_end_offset == read_header(stored[-1]).last_offset + 1
    batches = split_batches(log.read(0, 1 << 30, 1 << 62))
    assert batches == stored and all(crc_ok(b) for b in batches)


def last_log_file(directory: Path) -> Path:
    return sorted(directory.glob("*.log"))[-1]


@pytest.fixture
def data_dir(tmp_path):
    store = Store(tmp_path, NOW_MS)
    store.create_topic(TOPIC, PARTITIONS, CONFIGS)
    crash(store)
    return tmp_path


def test_clean_shutdown_restarts_without_scanning(data_dir):
    store = Store(data_dir, NOW_MS)
    stored = {p: fill(store, p, 20) for p in range(PARTITIONS)}
    store.close()
    assert read_recovery_checkpoint(data_dir).clean
    state_file = data_dir / f"{TOPIC}-0" / PARTITION_STATE_FILE
    before = os.stat(state_file)

    store = Store(data_dir, NOW_MS)
    assert not read_recovery_checkpoint(data_dir).clean  # the marker goes before any change
    for partition in range(PARTITIONS):
        report = store.partition(TOPIC, partition).recovery
        assert report.clean_shutdown
        assert report.segments_scanned == report.bytes_scanned == 0
        assert_log_is(store, partition, stored[partition])
    after = os.stat(state_file)  # neither read for its content nor rewritten
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    store.close()


def test_kill_rescans_and_truncates_only_past_the_checkpointed_recovery_point(data_dir):
    store = Store(data_dir, NOW_MS)
    stored = fill(store, 0, 40)
    store.checkpoint_recovery_points()
    stored += fill(store, 0, 5)  # durable, past the checkpoint
    segments = len(store.partition(TOPIC, 0).segment_base_offsets)
    crash(store)
    directory = data_dir / f"{TOPIC}-0"
    assert read_partition_state(directory).recovery_point_offset == 0  # its own is stale
    torn = stored[-1][: len(stored[-1]) // 2]
    with open(last_log_file(directory), "ab") as f:
        f.write(torn)  # a batch half written when the process died

    store = Store(data_dir, NOW_MS)
    report = store.partition(TOPIC, 0).recovery
    assert not report.clean_shutdown
    assert 1 <= report.segments_scanned < segments
    assert report.bytes_truncated == len(torn)
    assert_log_is(store, 0, stored)
    store.close()


@pytest.mark.parametrize("stop", ["close", "kill"])
@pytest.mark.parametrize("damage", ["corrupt", "missing"])
def test_damaged_checkpoint_falls_back_to_a_full_scan(data_dir, stop, damage):
    store = Store(data_dir, NOW_MS)
    stored = fill(store, 0, 30)
    store.checkpoint_recovery_points()
    if stop == "close":
        store.close()
    else:
        crash(store)
    path = data_dir / RECOVERY_CHECKPOINT_FILE
    if damage == "corrupt":
        data = bytearray(path.read_bytes())
        data[-3] ^= 0xFF
        path.write_bytes(bytes(data))
    else:
        path.unlink()

    # A clean stop leaves the state file as it was (the checkpoint carries the clean state):
    # without the checkpoint both stops re-validate from the state file's recovery point,
    # the bound of a kill -9 (RECOVERY_CHECKPOINT_BYTES past it, here nothing checkpointed).
    recovery_point = read_partition_state(data_dir / f"{TOPIC}-0").recovery_point_offset
    store = Store(data_dir, NOW_MS)
    log = store.partition(TOPIC, 0)
    report = log.recovery
    assert not report.clean_shutdown  # a state file's clean flag alone is not believed
    bases = log.segment_base_offsets
    trusted = max(bisect_left(bases, recovery_point) - 1, 0)
    assert report.segments_scanned == len(bases) - trusted and len(bases) > 1
    assert_log_is(store, 0, stored)
    store.close()


def test_clean_stop_writes_no_state_file_and_keeps_the_log_start(data_dir):
    store = Store(data_dir, NOW_MS)
    stored = fill(store, 0, 30)
    log = store.partition(TOPIC, 0)
    log_start = read_header(stored[9]).base_offset
    assert log.delete_records_before(log_start) == log_start  # durable when it returns
    state_file = data_dir / f"{TOPIC}-0" / PARTITION_STATE_FILE
    before = os.stat(state_file)
    store.close()
    after = os.stat(state_file)  # the checkpoint carries the clean state, not the file
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    (data_dir / RECOVERY_CHECKPOINT_FILE).unlink()  # lost: the state file must still do

    store = Store(data_dir, NOW_MS)
    log = store.partition(TOPIC, 0)
    assert not log.recovery.clean_shutdown
    assert log.log_start_offset == log_start
    assert split_batches(log.read(log_start, 1 << 30, 1 << 62)) == stored[9:]
    store.close()


def test_a_failed_checkpoint_at_close_falls_back_to_state_files(data_dir, monkeypatch):
    store = Store(data_dir, NOW_MS)
    stored = fill(store, 0, 30)

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("onceflow.storage.store.write_recovery_checkpoint", disk_full)
    with pytest.raises(OSError):
        store.close()
    monkeypatch.undo()
    state = read_partition_state(data_dir / f"{TOPIC}-0")
    assert state.clean_shutdown and state.recovery_point_offset == len(stored) * 3

    store = Store(data_dir, NOW_MS)  # the checkpoint is the last periodic one (none here)
    log = store.partition(TOPIC, 0)
    assert not log.recovery.clean_shutdown and log.recovery.segments_scanned == 1
    assert_log_is(store, 0, stored)
    store.close()


def test_a_crash_after_a_clean_restart_is_not_taken_for_a_clean_stop(data_dir):
    store = Store(data_dir, NOW_MS)
    stored = fill(store, 0, 10)
    store.close()
    store = Store(data_dir, NOW_MS)  # clean start: the state files still say clean
    assert store.partition(TOPIC, 0).recovery.clean_shutdown
    stored += fill(store, 0, 10)
    crash(store)
    directory = data_dir / f"{TOPIC}-0"
    with open(last_log_file(directory), "ab") as f:
        f.write(b"\x00" * 7)

    store = Store(data_dir, NOW_MS)
    report = store.partition(TOPIC, 0).recovery
    assert not report.clean_shutdown and report.bytes_truncated == 7
    assert_log_is(store, 0, stored)
    store.close()


def test_a_topic_created_again_ignores_the_old_topics_entries(data_dir):
    store = Store(data_dir, NOW_MS)
    fill(store, 0, 30)
    store.close()
    store = Store(data_dir, NOW_MS)  # partition 0 not opened: its clean entry is kept
    store.delete_topic(TOPIC)
    store.create_topic(TOPIC, PARTITIONS, CONFIGS)
    stored = fill(store, 0, 2)
    store.close()
    store = Store(data_dir, NOW_MS)
    assert store.partition(TOPIC, 0).recovery.clean_shutdown
    assert_log_is(store, 0, stored)
    assert read_recovery_checkpoint(data_dir).entries[0].topic_id == store.topics()[TOPIC].topic_id
    store.close()
