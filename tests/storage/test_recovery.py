"""Recovery: torn tails, flipped bytes, garbage, lost indexes, clean shutdown, SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import NOW_MS
from storage_batches import crc_ok, make_batch, split_batches, with_base_offset

from onceflow.storage import LogConfig, PartitionLog
from onceflow.storage.layout import PARTITION_STATE_FILE, read_header, read_partition_state

CONFIG = LogConfig(index_interval_bytes=100, segment_bytes=1500)


def fill(log, n=30, records=3):
    stored = []
    for i in range(n):
        batch = make_batch(records, base_timestamp_ms=1000 + i)
        info = log.append([batch], NOW_MS)
        stored.append(with_base_offset(batch, info.first_offset))
    return stored


def crash(log) -> None:
    """What survives kill -9: the files as written, no flush, no clean-shutdown state."""
    log.discard()


def last_log_file(directory: Path) -> Path:
    return sorted(directory.glob("*.log"))[-1]


def assert_log_is(log, stored) -> None:
    """The log holds exactly `stored`, and every offset reads its own whole batch."""
    assert log.log_end_offset == (read_header(stored[-1]).last_offset + 1 if stored else 0)
    data = log.read(log.log_start_offset, 1 << 30, 1 << 62)
    assert split_batches(data) == stored
    assert all(crc_ok(b) for b in split_batches(data))
    for batch in stored:
        h = read_header(batch)
        assert log.read(h.last_offset, 1, 1 << 62) == batch


def test_clean_shutdown_skips_scan(open_log, tmp_path):
    log = open_log(CONFIG)
    stored = fill(log)
    log.close()
    state = read_partition_state(tmp_path / "t-0")
    assert state.clean_shutdown and state.log_end_offset == 90
    reopened = open_log(CONFIG)
    assert reopened.recovery.clean_shutdown and reopened.recovery.segments_scanned == 0
    assert reopened.recovery.bytes_scanned == 0
    assert_log_is(reopened, stored)
    assert not read_partition_state(tmp_path / "t-0").clean_shutdown  # consumed at open


@pytest.mark.parametrize("how", ["checkpoint", "flush"])
def test_unclean_open_rescans_from_recovery_point(open_log, monkeypatch, how):
    log = open_log(CONFIG)
    stored = fill(log)
    if how == "checkpoint":
        log.flush()
        log.checkpoint()
    else:
        monkeypatch.setattr("onceflow.storage.log.RECOVERY_CHECKPOINT_BYTES", 1)
        log.flush()
    stored += fill(log, 5)
    segments = len(log.segment_base_offsets)
    crash(log)
    reopened = open_log(CONFIG)
    report = reopened.recovery
    assert not report.clean_shutdown and report.bytes_truncated == 0
    assert 1 <= report.segments_scanned < segments
    assert_log_is(reopened, stored)


@pytest.mark.parametrize("cut", [1, 12, 60, -1])
def test_truncated_mid_batch(open_log, tmp_path, cut):
    log = open_log(CONFIG)
    stored = fill(log)
    crash(log)
    path = last_log_file(tmp_path / "t-0")
    last = stored[-1]
    size = path.stat().st_size
    keep = size - len(last) + (cut if cut > 0 else len(last) - 1)
    os.truncate(path, keep)
    reopened = open_log(CONFIG)
    assert reopened.recovery.bytes_truncated == keep - (size - len(last))
    assert_log_is(reopened, stored[:-1])
    assert path.stat().st_size == size - len(last)
    again = reopened.append([make_batch(2)], NOW_MS)  # appends continue at the cut
    assert again.first_offset == read_header(stored[-2]).last_offset + 1


@pytest.mark.parametrize("where", [0, 17, 30, 62, -1])
def test_flipped_byte_in_last_batch(open_log, tmp_path, where):
    log = open_log(CONFIG)
    stored = fill(log)
    crash(log)
    path = last_log_file(tmp_path / "t-0")
    size = path.stat().st_size
    pos = size - len(stored[-1]) + (where if where >= 0 else len(stored[-1]) - 1)
    with open(path, "r+b") as f:
        f.seek(pos)
        byte = f.read(1)
        f.seek(pos)
        f.write(bytes([byte[0] ^ 0x40]))
    reopened = open_log(CONFIG)
    assert reopened.recovery.bytes_truncated == len(stored[-1])
    assert_log_is(reopened, stored[:-1])


@pytest.mark.parametrize("garbage", [b"\x00" * 100, os.urandom(500), make_batch(2)[:40]])
def test_garbage_after_the_tail(open_log, tmp_path, garbage):
    log = open_log(CONFIG)
    stored = fill(log)
    crash(log)
    with open(last_log_file(tmp_path / "t-0"), "ab") as f:
        f.write(garbage)
    reopened = open_log(CONFIG)
    assert reopened.recovery.bytes_truncated == len(garbage)
    assert_log_is(reopened, stored)


def test_replayed_batch_with_old_offset_is_not_monotonic(open_log, tmp_path):
    log = open_log(CONFIG)
    stored = fill(log)
    crash(log)
    with open(last_log_file(tmp_path / "t-0"), "ab") as f:
        f.write(stored[-1])  # valid CRC, but offsets go backwards
    reopened = open_log(CONFIG)
    assert reopened.recovery.bytes_truncated == len(stored[-1])
    assert_log_is(reopened, stored)


@pytest.mark.parametrize("damage", ["missing", "garbage", "zero-tail", "points-past-end"])
@pytest.mark.parametrize("shutdown", ["clean", "crash"])
def test_missing_or_corrupt_index_is_rebuilt(open_log, tmp_path, damage, shutdown):
    log = open_log(CONFIG)
    stored = fill(log)
    log.close() if shutdown == "clean" else (log.flush(), crash(log))
    directory = tmp_path / "t-0"
    for index in sorted(directory.glob("*.index")) + sorted(directory.glob("*.timeindex")):
        if damage == "missing":
            index.unlink()
        elif damage == "garbage":
            index.write_bytes(os.urandom(index.stat().st_size or 24))
        elif damage == "zero-tail":
            with open(index, "ab") as f:
                f.write(b"\x00" * 24)
        else:  # an entry beyond the log: relative offset and position far past the end
            with open(index, "ab") as f:
                f.write((10**6).to_bytes(4, "big") * 3)
    reopened = open_log(CONFIG)
    assert_log_is(reopened, stored)
    assert reopened.offset_for_timestamp(1000 + 17) == (51, 1017)


def test_corrupt_middle_segment_drops_later_segments(open_log, tmp_path):
    log = open_log(CONFIG)
    stored = fill(log, 70)
    crash(log)  # nothing flushed: every segment is re-validated
    directory = tmp_path / "t-0"
    files = sorted(directory.glob("*.log"))
    assert len(files) >= 3
    second = files[1]
    with open(second, "r+b") as f:
        f.seek(200)
        f.write(b"\xff\xff")
    reopened = open_log(CONFIG)
    assert reopened.recovery.segments_dropped == len(files) - 2
    kept = split_batches(reopened.read(0, 1 << 30, 1 << 62))
    assert kept == stored[: len(kept)] and 0 < len(kept) < len(stored)
    assert sorted(p.name for p in directory.glob("*.log")) == [p.name for p in files[:2]]


def test_corrupt_state_file_means_full_recovery(open_log, tmp_path):
    log = open_log(CONFIG)
    stored = fill(log)
    log.close()
    (tmp_path / "t-0" / PARTITION_STATE_FILE).write_bytes(b"OFPS garbage")
    reopened = open_log(CONFIG)
    assert not reopened.recovery.clean_shutdown
    assert reopened.recovery.segments_scanned == len(reopened.segment_base_offsets)
    assert_log_is(reopened, stored)


def test_clean_state_that_does_not_match_files_is_not_trusted(open_log, tmp_path):
    log = open_log(CONFIG)
    stored = fill(log)
    log.close()
    with open(last_log_file(tmp_path / "t-0"), "ab") as f:
        f.write(b"\x01" * 30)  # e.g. a write after the state was saved
    reopened = open_log(CONFIG)
    assert not reopened.recovery.clean_shutdown and reopened.recovery.bytes_truncated == 30
    assert_log_is(reopened, stored)


def test_log_start_survives_crash_and_resurrected_segments_are_removed(open_log, tmp_path):
    log = open_log(CONFIG)
    stored = fill(log)
    directory = tmp_path / "t-0"
    first = sorted(directory.glob("*.log"))[0]
    saved = {p: p.read_bytes() for p in directory.glob(first.stem + ".*")}
    assert log.segment_base_offsets[1] <= 60
    start = log.delete_records_before(60)
    crash(log)
    for path, data in saved.items():  # the unlink did not reach the disk
        path.write_bytes(data)
    reopened = open_log(CONFIG)
    assert reopened.log_start_offset == start == 60
    assert not first.exists()
    kept = [b for b in stored if read_header(b).last_offset >= 60]
    assert split_batches(reopened.read(60, 1 << 30, 1 << 62)) == kept


_CHILD = textwrap.dedent("""
    import sys
    from pathlib import Path
    sys.path.insert(0, {tests!r})
    from storage_batches import make_batch
    from onceflow.storage import GroupCommitter, LogConfig, PartitionLog
    config = LogConfig(segment_bytes=20_000, index_interval_bytes=512)
    log = PartitionLog.open(Path({path!r}), config, 0)
    committer = GroupCommitter(fsync_enabled=True)
    i = 0
    while True:
        value = str(i).encode().ljust(40, b".")
        info = log.append([make_batch([value] * (1 + i % 7))], i)
        committer.request_flush(log).result()
        print(info.last_offset, flush=True)   # acknowledged: durable from here on
        i += 1
""")


def test_sigkill_loses_no_flushed_offset(tmp_path):
    path = tmp_path / "t-0"
    code = _CHILD.format(tests=str(Path(__file__).parent), path=str(path))
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    acked = []
    deadline = time.monotonic() + 20
    while len(acked) < 300 and time.monotonic() < deadline:
        line = child.stdout.readline()
        if not line:
            break
        acked.append(int(line))
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert len(acked) >= 50, "child did not get going"
    log = PartitionLog.open(path, LogConfig(segment_bytes=20_000, index_interval_bytes=512), 0)
    try:
        assert not log.recovery.clean_shutdown
        assert log.log_end_offset > acked[-1]
        data = log.read(0, 1 << 30, 1 << 62)
        batches = split_batches(data)
        assert all(crc_ok(b) for b in batches)
        assert [read_header(b).last_offset for b in batches][: len(acked)] == acked
        assert len(log._segments) > 1
    finally:
        log.close()


def test_crash_after_a_clean_restart_is_recovered(open_log, tmp_path):
    """A clean shutdown, a restart (the state now says unclean), more appends past the
    recovery point, a torn tail, kill -9: the next open rescans and truncates the tail."""
    log = open_log(CONFIG)
    stored = fill(log, n=10)
    log.close()
    restarted = open_log(CONFIG)
    assert restarted.recovery.clean_shutdown
    assert not read_partition_state(tmp_path / "t-0").clean_shutdown
    stored += fill(restarted, n=10)
    crash(restarted)
    path = last_log_file(tmp_path / "t-0")
    with open(path, "ab") as f:
        f.write(stored[-1][: len(stored[-1]) // 2])  # a torn batch past the valid end
    reopened = open_log(CONFIG)
    assert not reopened.recovery.clean_shutdown
    assert reopened.recovery.bytes_truncated == len(stored[-1]) // 2
    assert_log_is(reopened, stored)


def test_crash_after_a_crash_is_fully_recovered(open_log, tmp_path):
    """kill -9 twice in a row (the second open writes its unclean state without fsync):
    every appended batch is back and a torn tail is cut."""
    log = open_log(CONFIG)
    stored = fill(log, n=10)
    crash(log)
    again = open_log(CONFIG)
    stored += fill(again, n=5)
    crash(again)
    path = last_log_file(tmp_path / "t-0")
    with open(path, "ab") as f:
        f.write(b"\x00" * 7)
    reopened = open_log(CONFIG)
    assert reopened.recovery.bytes_truncated == 7
    assert_log_is(reopened, stored)


def test_rescanned_segments_count_as_durable_only_after_a_flush(open_log, tmp_path):
    """Recovery does not fsync what it re-validated: the recovery point (in memory and in
    the state file) stays at the first re-validated segment until the next flush, so a
    crash before that flush re-validates the same segments again."""
    log = open_log(CONFIG)
    stored = fill(log)  # several segments, none flushed: the recovery point is 0
    crash(log)
    reopened = open_log(CONFIG)
    assert reopened.recovery.segments_scanned == len(reopened.segment_base_offsets)
    assert reopened.recovery_point_offset == reopened.recovery.first_scanned == 0
    assert read_partition_state(tmp_path / "t-0").recovery_point_offset == 0
    crash(reopened)
    again = open_log(CONFIG)
    assert again.recovery.segments_scanned == len(again.segment_base_offsets)
    assert_log_is(again, stored)
    again.flush()
    assert again.recovery_point_offset == again.log_end_offset
    again.checkpoint()
    crash(again)
    last = open_log(CONFIG)
    assert last.recovery.segments_scanned == 1  # only the segment holding the point
    assert_log_is(last, stored)


@pytest.mark.parametrize("producer_id", [-1, 7])
def test_rescan_tells_whether_producer_state_needs_a_replay(open_log, producer_id):
    """A log re-validated at open knows whether any batch carries a producer id: without
    one the producer-state replay is skipped; appending afterwards ends the shortcut."""
    log = open_log(CONFIG)
    fill(log)
    log.append([make_batch(2, producer_id=producer_id, producer_epoch=0, base_sequence=0)],
               NOW_MS)
    fill(log, n=2)
    crash(log)
    reopened = open_log(CONFIG)
    assert reopened.recovery.segments_scanned == len(reopened.segment_base_offsets) > 1
    assert reopened.needs_producer_replay(0) == (producer_id >= 0)
    fill(reopened, n=1)
    assert reopened.needs_producer_replay(0)
    reopened.close()
    clean = open_log(CONFIG)  # loaded trusting its indexes: unknown, so replayed
    assert clean.needs_producer_replay(clean.log_end_offset)


def test_empty_segment_loads_without_its_index_files_and_empties_them(open_log, tmp_path):
    """A trusted empty segment does not read its index files; whatever they hold is
    replaced by the next persist, so entries written later never sit behind stale ones."""
    log = open_log(CONFIG)
    log.close()
    index = tmp_path / "t-0" / f"{0:020d}.index"
    index.write_bytes(b"\x00\x00\x00\x05\x00\x00\x00\x40" * 3)  # stale, not for this log
    reopened = open_log(CONFIG)
    assert reopened.recovery.clean_shutdown and reopened.log_end_offset == 0
    stored = fill(reopened)
    reopened.close()
    again = open_log(CONFIG)
    assert again.recovery.clean_shutdown and again.recovery.segments_scanned == 0
    assert_log_is(again, stored)
