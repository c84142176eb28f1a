"""PartitionLog: append/read round trips, index lookups, rolling, timestamps, retention."""

from __future__ import annotations

import os

import pytest
from conftest import NOW_MS
from storage_batches import crc_ok, make_batch, split_batches, with_base_offset

from onceflow.storage import LogConfig, OffsetOutOfRange
from onceflow.storage.layout import read_header


def append_n(log, counts, now_ms=NOW_MS, **kw):
    """Appends one batch per record count; returns the batches as stored (offsets assigned)."""
    stored = []
    for n in counts:
        batch = make_batch(n, **kw)
        info = log.append([memoryview(batch)], now_ms)
        stored.append(with_base_offset(batch, info.first_offset))
    return stored


def test_append_assigns_offsets_and_read_round_trips(open_log):
    log = open_log()
    b1, b2 = make_batch(3, base_offset=77), make_batch(2)
    info = log.append([b1, b2], NOW_MS)
    assert (info.first_offset, info.last_offset, info.end_position) == (0, 4, 5)
    assert info.log_append_time_ms == -1
    assert log.log_end_offset == 5
    data = log.read(0, 1 << 20, 1 << 62)
    assert data == with_base_offset(b1, 0) + with_base_offset(b2, 3)
    info2 = log.append([make_batch(1)], NOW_MS)
    assert info2.first_offset == 5 and log.log_end_offset == 6


def test_read_starts_at_batch_containing_offset_and_stops_before_upper(open_log):
    log = open_log()
    stored = append_n(log, [3, 3, 3])  # offsets 0-2, 3-5, 6-8
    assert log.read(4, 1 << 20, 100) == b"".join(stored[1:])
    assert log.read(4, 1 << 20, 6) == stored[1]  # batch at 6 excluded
    assert log.read(4, 1 << 20, 7) == b"".join(stored[1:])  # base 6 < 7: included whole
    assert log.read(9, 1 << 20, 100) == b""
    assert log.read(3, 1 << 20, 3) == b""


def test_read_max_bytes_whole_batches_and_at_least_one(open_log):
    log = open_log()
    stored = append_n(log, [5, 5, 5, 5])
    size = len(stored[0])
    assert log.read(0, size * 2, 100) == stored[0] + stored[1]
    assert log.read(0, size * 2 + size - 1, 100) == stored[0] + stored[1]
    assert log.read(0, 10, 100) == stored[0]  # KIP-74: one batch even if larger
    assert log.read(0, 0, 100) == stored[0]


def test_offset_out_of_range(open_log):
    log = open_log()
    append_n(log, [2])
    with pytest.raises(OffsetOutOfRange):
        log.read(3, 100, 100)
    with pytest.raises(OffsetOutOfRange):
        log.read(-1, 100, 100)
    assert log.read(2, 100, 100) == b""


def test_index_lookup_finds_every_offset(open_log):
    log = open_log(LogConfig(index_interval_bytes=200))
    stored = append_n(log, [1, 2, 3, 4, 5] * 20)
    assert len(log._segments[-1].offset_index) > 10
    offset = 0
    for batch in stored:
        h = read_header(batch)
        for o in range(h.base_offset, h.last_offset + 1):
            assert log.read(o, 1, 1 << 62) == batch
        offset = h.last_offset + 1
    assert offset == log.log_end_offset


def test_roll_by_size_and_reads_span_segments(open_log):
    batch_size = len(make_batch(10))
    log = open_log(LogConfig(segment_bytes=batch_size * 3))
    stored = append_n(log, [10] * 10)
    assert log.segment_base_offsets == [0, 30, 60, 90]
    assert log.read(0, 1 << 20, 1 << 62) == b"".join(stored)
    assert log.read(25, batch_size * 4, 1 << 62) == b"".join(stored[2:6])
    assert log.read(35, 1 << 20, 70) == b"".join(stored[3:7])


def test_roll_by_time_uses_first_append_time(open_log):
    log = open_log(LogConfig(segment_ms=1000))
    append_n(log, [1], now_ms=NOW_MS)
    append_n(log, [1], now_ms=NOW_MS + 999)
    assert len(log.segment_base_offsets) == 1
    append_n(log, [1], now_ms=NOW_MS + 1000)
    assert log.segment_base_offsets == [0, 2]
    append_n(log, [1], now_ms=NOW_MS + 1500)
    assert log.segment_base_offsets == [0, 2]


def test_roll_when_index_full(open_log):
    log = open_log(LogConfig(index_interval_bytes=0, segment_index_bytes=36))  # 3 entries
    append_n(log, [1] * 10)
    assert len(log.segment_base_offsets) > 2
    assert all(len(s.offset_index) <= 3 for s in log._segments)


def test_log_append_time_stamps_header_and_crc(open_log):
    log = open_log(LogConfig(message_timestamp_type="LogAppendTime"))
    info = log.append([make_batch(3, base_timestamp_ms=5)], NOW_MS + 7)
    assert info.log_append_time_ms == NOW_MS + 7
    stored = log.read(0, 1 << 20, 100)
    header = read_header(stored)
    assert header.max_timestamp == NOW_MS + 7 and header.timestamp_type == 1
    assert crc_ok(stored)
    plain = open_log(name="t-1").append([make_batch(1)], NOW_MS, log_append_time=True)
    assert plain.log_append_time_ms == NOW_MS


def test_partition_leader_epoch_rewritten(open_log):
    log = open_log()
    log.append([make_batch(2)], NOW_MS, partition_leader_epoch=9)
    stored = log.read(0, 1 << 20, 100)
    assert read_header(stored).partition_leader_epoch == 9 and crc_ok(stored)


def test_offset_for_timestamp(open_log):
    log = open_log(LogConfig(index_interval_bytes=100, segment_bytes=1000))
    for i in range(40):  # batch i: 4 records, timestamps 1000*i + 0, 10, 20, 30
        log.append([make_batch(4, base_timestamp_ms=1000 * i, timestamp_step_ms=10)], NOW_MS)
    assert len(log.segment_base_offsets) > 2
    assert log.offset_for_timestamp(0) == (0, 0)
    assert log.offset_for_timestamp(5000) == (20, 5000)
    assert log.offset_for_timestamp(5011) == (22, 5020)  # record-level inside the batch
    assert log.offset_for_timestamp(5031) == (24, 6000)
    assert log.offset_for_timestamp(39_030) == (159, 39_030)
    assert log.offset_for_timestamp(39_031) is None


def test_retention_by_time_deletes_old_segments_never_active(open_log):
    size = len(make_batch(1))
    log = open_log(LogConfig(segment_bytes=size * 2, retention_ms=1000))
    for i in range(6):
        log.append([make_batch(1, base_timestamp_ms=NOW_MS + 1000 * i)], NOW_MS)
    assert log.segment_base_offsets == [0, 2, 4]
    assert log.enforce_retention(NOW_MS + 1000).segments_deleted == 0
    assert log.enforce_retention(NOW_MS + 2001).segments_deleted == 1  # segment 0 newest = NOW+1000
    assert log.log_start_offset == 2
    with pytest.raises(OffsetOutOfRange):
        log.read(1, 100, 100)
    assert log.enforce_retention(NOW_MS + 10**9).segments_deleted == 1  # the active segment stays
    assert log.segment_base_offsets == [4] and log.log_start_offset == 4
    assert read_header(log.read(4, 1 << 20, 100)).base_offset == 4


def test_retention_by_size(open_log):
    size = len(make_batch(1))
    log = open_log(LogConfig(segment_bytes=size * 2, retention_ms=-1, retention_bytes=size * 3))
    append_n(log, [1] * 7)  # segments [0,1] [2,3] [4,5] [6]
    assert log.enforce_retention(NOW_MS).segments_deleted == 2  # 7 -> 3 batches' worth is the floor
    assert log.segment_base_offsets == [4, 6] and log.size_bytes == size * 3
    assert log.enforce_retention(NOW_MS).segments_deleted == 0


def test_retention_skipped_for_compact_policy(open_log):
    log = open_log(LogConfig(segment_bytes=100, retention_ms=0, cleanup_policy="compact"))
    append_n(log, [1] * 4)
    assert log.enforce_retention(NOW_MS + 10**9).segments_deleted == 0


def test_delete_records_before(open_log):
    size = len(make_batch(2))
    log = open_log(LogConfig(segment_bytes=size * 2))
    stored = append_n(log, [2] * 6)  # segments [0-3] [4-7] [8-11]
    assert log.delete_records_before(5) == 5
    assert log.segment_base_offsets == [4, 8]
    with pytest.raises(OffsetOutOfRange):
        log.read(4, 100, 100)
    assert log.read(5, 1 << 20, 100) == b"".join(stored[2:])  # batch containing 5
    assert log.delete_records_before(3) == 5  # never moves backwards
    with pytest.raises(OffsetOutOfRange):
        log.delete_records_before(13)
    assert log.delete_records_before(12) == 12
    assert log.read(12, 100, 100) == b""


def test_batches_from_replays_headers(open_log):
    log = open_log(LogConfig(segment_bytes=300))
    append_n(log, [2] * 10, producer_id=7, producer_epoch=1, base_sequence=0)
    headers = list(log.batches_from(5))
    assert [h.base_offset for h in headers] == list(range(4, 20, 2))
    assert all(h.producer_id == 7 for h in headers)
    assert list(log.batches_from(20)) == []


def test_flush_advances_recovery_point(open_log):
    log = open_log()
    append_n(log, [3])
    assert log.recovery_point_offset == 0
    log.flush()
    assert log.recovery_point_offset == 3
    info = log.append([make_batch(1)], NOW_MS)
    log.flush_to(info.end_position)
    assert log.recovery_point_offset == 4


def test_append_rejects_partial_batch(open_log):
    log = open_log()
    with pytest.raises(AssertionError):
        log.append([make_batch(2)[:-1]], NOW_MS)
    assert log.log_end_offset == 0


def test_many_batches_in_one_append(open_log):
    log = open_log(LogConfig(index_interval_bytes=64))
    batches = [make_batch(1) for _ in range(3000)]  # more than IOV_MAX buffers
    info = log.append(batches, NOW_MS)
    assert info.last_offset == 2999
    data = log.read(0, 1 << 30, 1 << 62)
    assert split_batches(data) == [with_base_offset(b, i) for i, b in enumerate(batches)]


def test_max_timestamp_exact_and_after_reopen(open_log):
    config = LogConfig(index_interval_bytes=100, segment_bytes=1000)
    log = open_log(config)
    stamps = [500, 9_000, 700, 9_000, 800] + [1_000 + i for i in range(30)]
    for ts in stamps:  # batch: 3 records at ts-20, ts-10, ts
        log.append([make_batch(3, base_timestamp_ms=ts - 20, timestamp_step_ms=10)], NOW_MS)
    assert log.max_timestamp() == (9_000, 5)  # first record holding the max
    log.close()
    reopened = open_log(config)
    assert reopened.recovery.clean_shutdown
    assert reopened.max_timestamp() == (9_000, 5)
    assert open_log(name="empty").max_timestamp() is None


def test_concurrent_append_read_flush(open_log):
    """The broker appends and reads on one thread and flushes on another: readers must only
    ever see whole batches, and the recovery point never passes the log end."""
    import threading

    log = open_log(LogConfig(segment_bytes=20_000, index_interval_bytes=256))
    stop = threading.Event()
    problems: list[str] = []

    def flusher():
        while not stop.is_set():
            log.flush()
            if log.recovery_point_offset > log.log_end_offset:
                problems.append("recovery point past LEO")

    def reader():
        while not stop.is_set():
            leo = log.log_end_offset
            data = log.read(max(0, leo - 50), 1 << 20, 1 << 62)
            if not all(crc_ok(b) for b in split_batches(data)):
                problems.append("bad batch")

    threads = [threading.Thread(target=f) for f in (flusher, reader)]
    for t in threads:
        t.start()
    for i in range(2000):
        log.append([make_batch(1 + i % 5)], NOW_MS)
    stop.set()
    for t in threads:
        t.join()
    log.flush()
    assert not problems and log.recovery_point_offset == log.log_end_offset
    assert len(log.segment_base_offsets) > 3


def test_read_budget_is_capped(open_log, monkeypatch):
    monkeypatch.setattr("onceflow.storage.log.READ_BYTES_MAX", 1000)
    log = open_log()
    stored = append_n(log, [20] * 10)
    assert len(stored[0]) > 200
    data = log.read(0, 1 << 30, 1 << 62)
    assert split_batches(data) == stored[: 1000 // len(stored[0])]


def _open_fds() -> set[str]:
    return {os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
            if os.path.exists(f"/proc/self/fd/{fd}")}


@pytest.mark.parametrize("clean", [True, False])
def test_a_segment_holds_one_descriptor_and_its_indexes_survive(open_log, tmp_path, clean):
    """Indexes are written when flushed or closed, never kept open: one descriptor per
    segment (its .log); rolled segments' indexes are on disk after a flush, and
    a reopened log - after close() or after an unclean stop - finds every batch."""
    config = LogConfig(segment_bytes=2048, index_interval_bytes=128)
    log = open_log(config, name="fds-0")
    stored = append_n(log, [3] * 60)
    log.flush()
    held = {path for path in _open_fds() if "fds-0" in path}
    assert len(log.segment_base_offsets) > 2
    assert held == {str(log.directory / f"{base:020d}.log")
                    for base in log.segment_base_offsets}, held
    rolled = log.segment_base_offsets[0]
    assert (log.directory / f"{rolled:020d}.index").stat().st_size > 0   # flushed at roll
    if clean:
        log.close()
    else:
        log.discard()   # like a kill: nothing written at close, no clean-shutdown flag
    reopened = open_log(config, name="fds-0")
    for i, batch in enumerate(stored):
        assert reopened.read(3 * i, len(batch), 1 << 62) == batch, i


def test_an_index_write_failing_at_flush_fails_the_log(open_log, monkeypatch):
    """The rolled segments' index entries are written at the next flush: when that write
    fails (ENOSPC), the flush fails the log instead of letting a later flush count the
    unsynced data as durable."""
    import errno

    from onceflow.storage.index import OffsetIndex
    from onceflow.storage.layout import LogFailedError

    log = open_log(LogConfig(segment_bytes=2048, index_interval_bytes=128), name="enospc-0")
    append_n(log, [3] * 40)           # rolls: the rolled segments' indexes are pending

    def full(_index):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(OffsetIndex, "persist", full)
    point = log.recovery_point_offset
    with pytest.raises(LogFailedError):
        log.flush()
    assert log.recovery_point_offset == point
    monkeypatch.undo()
    with pytest.raises(LogFailedError):   # failed for good, until a restart
        log.flush()
