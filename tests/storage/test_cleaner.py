"""The log cleaner on a real PartitionLog: newest value per key, offsets unchanged, a
bounded key map that cleans in several rounds, tombstones kept until delete.retention.ms."""

from __future__ import annotations

import random

from onceflow.protocol.compression import batch_records
from onceflow.protocol.records import (
    SimpleRecord,
    TimestampType,
    build_batch,
    build_control_batch,
    iter_batches,
)
from onceflow.storage import LogConfig, PartitionLog
from onceflow.storage.cleaner import (
    KEY_MAP_ENTRY_BYTES,
    KeyMap,
    Throttler,
    apply_plan,
    cleanable_upper,
    plan_clean,
)
from onceflow.storage.txn_index import AbortedTxn

NOW_MS = 1_700_000_000_000
KEYS = [f"key-{i}".encode() for i in range(20)]


def _records(log: PartitionLog) -> list[tuple[int, bytes | None, bytes | None]]:
    chunk = log.read(log.log_start_offset, 1 << 30, log.log_end_offset)
    return [(r.offset, r.key, r.value) for _, batch in iter_batches(chunk)
            for r in batch_records(batch)]


def _write(log: PartitionLog, rng: random.Random, batches: int) -> dict:
    written = {}
    for i in range(batches):
        records = [SimpleRecord(key, None if rng.random() < 0.1 else f"{i}".encode())
                   for key in rng.sample(KEYS, rng.randint(1, 3))]
        info = log.append([build_batch(records, base_timestamp_ms=NOW_MS + i)], NOW_MS + i)
        for offset, record in zip(range(info.first_offset, info.last_offset + 1), records,
                                  strict=True):
            written[offset] = (record.key, record.value)
    return written


def test_key_map_is_bounded():
    key_map = KeyMap(KEY_MAP_ENTRY_BYTES * 10)
    assert key_map.capacity == 9  # 90% load factor
    assert all(key_map.put(bytes([i]), i) for i in range(9))
    assert not key_map.put(b"new", 99) and key_map.put(bytes([3]), 100)
    assert key_map.get(bytes([3])) == 100 and key_map.get(b"new") is None


def test_cleaning_in_rounds_with_a_small_key_map_keeps_each_keys_newest_record(tmp_path):
    for seed in range(2):
        rng = random.Random(seed)
        # A segment holds a few batches (at most 12 keys): one fits in the key map.
        config = LogConfig(segment_bytes=300, index_interval_bytes=128,
                           delete_retention_ms=10**12, min_compaction_lag_ms=0)
        log = PartitionLog.open(tmp_path / f"p{seed}", config, NOW_MS)
        written = _write(log, rng, 150)
        newest = {key: offset for offset, (key, _) in sorted(written.items())}
        size_before, first_dirty, rounds = log.size_bytes, 0, 0
        upper = cleanable_upper(log, None, NOW_MS + 10**6, config)
        while first_dirty < upper:
            plan = plan_clean(log, config, NOW_MS + 10**6, first_dirty, upper,
                              memory_bytes=KEY_MAP_ENTRY_BYTES * 15)  # 13 keys a round
            assert plan.upper_offset > first_dirty, "every round makes progress"
            apply_plan(log, plan.batches, plan.changed, NOW_MS)
            first_dirty, rounds = plan.upper_offset, rounds + 1
            for offset, key, value in _records(log):  # always a subset, offsets unchanged
                assert written[offset] == (key, value)
        assert rounds > 1, "the bounded key map needed several rounds"
        records = _records(log)
        kept = {offset for offset, _, _ in records}
        assert set(newest.values()) <= kept, "each key's newest record survives"
        below = [key for offset, key, _ in records if offset < upper]
        assert len(below) == len(set(below)), "below the cleaned bound each key appears once"
        assert log.size_bytes < size_before
        log.close()
        reopened = PartitionLog.open(tmp_path / f"p{seed}", config, NOW_MS)
        assert _records(reopened) == records
        reopened.close()


def test_tombstones_go_after_delete_retention(tmp_path):
    config = LogConfig(segment_bytes=1024, segment_ms=60_000, delete_retention_ms=1_000)
    log = PartitionLog.open(tmp_path / "p", config, NOW_MS)
    for i in range(60):
        key = KEYS[i % 5]
        value = None if i >= 55 else b"v"
        log.append([build_batch([SimpleRecord(key, value)], base_timestamp_ms=NOW_MS)], NOW_MS)
    log.append([build_batch([SimpleRecord(b"last", b"v")], base_timestamp_ms=NOW_MS)],
               NOW_MS + 60_000)  # rolls by segment.ms: the tombstones' segment is closed
    upper = cleanable_upper(log, None, NOW_MS + 500, config)
    early = plan_clean(log, config, NOW_MS + 500, 0, upper)
    apply_plan(log, early.batches, early.changed, NOW_MS)
    keys = [key for _, key, _ in _records(log)]
    tombstones = [key for offset, key, value in _records(log) if value is None]
    assert early.next_expiry_ms == NOW_MS + 1_001 and tombstones, "kept while fresh"
    late = plan_clean(log, config, NOW_MS + 2_000, 0, upper)
    apply_plan(log, late.batches, late.changed, NOW_MS)
    remaining = [key for offset, key, _ in _records(log) if offset < upper]
    assert not set(remaining) & set(KEYS[:5]), (keys, remaining)
    log.close()


def test_aborted_records_then_their_marker_and_index_entry_go(tmp_path):
    config = LogConfig(segment_bytes=1 << 20, segment_ms=60_000, delete_retention_ms=1_000)
    log = PartitionLog.open(tmp_path / "p", config, NOW_MS)

    def append(batch: bytes) -> int:
        return log.append([batch], NOW_MS).first_offset

    aborted_first = append(build_batch([SimpleRecord(b"a", b"x"), SimpleRecord(b"b", b"y")],
                                       base_timestamp_ms=NOW_MS, producer_id=1,
                                       producer_epoch=0, base_sequence=0, transactional=True))
    abort_at = append(build_control_batch(producer_id=1, producer_epoch=0, commit=False,
                                          coordinator_epoch=0, timestamp_ms=NOW_MS))
    log.append_aborted_txn(AbortedTxn(1, aborted_first, abort_at, abort_at + 1))
    committed = append(build_batch([SimpleRecord(b"a", b"z")], base_timestamp_ms=NOW_MS,
                                   producer_id=2, producer_epoch=0, base_sequence=0,
                                   transactional=True))
    commit_at = append(build_control_batch(producer_id=2, producer_epoch=0, commit=True,
                                           coordinator_epoch=0, timestamp_ms=NOW_MS))
    log.append([build_batch([SimpleRecord(b"tick", b"t")], base_timestamp_ms=NOW_MS)],
               NOW_MS + 60_000)  # rolls: everything above is in a closed segment
    later = NOW_MS + 10_000
    upper = cleanable_upper(log, None, later, config)
    offsets_before = [h.base_offset for h in log.batches_from(0)]
    assert offsets_before == [aborted_first, abort_at, committed, commit_at, upper]
    first = plan_clean(log, config, later, 0, upper)
    apply_plan(log, first.batches, first.changed, later, first.aborted)
    # Round 1: the aborted records go; the markers stay (records were there this round).
    assert [h.base_offset for h in log.batches_from(0)] == [abort_at, committed, commit_at,
                                                            upper]
    assert [t.last_offset for t in log.aborted_transactions(0, upper)] == [abort_at]
    second = plan_clean(log, config, later, upper, upper)
    apply_plan(log, second.batches, second.changed, later, second.aborted)
    # Round 2: the ABORT marker and its index entry go; the COMMIT marker stays while its
    # transaction's record does.
    assert [h.base_offset for h in log.batches_from(0)] == [committed, commit_at, upper]
    assert log.aborted_transactions(0, upper) == []
    log.close()
    reopened = PartitionLog.open(tmp_path / "p", config, NOW_MS)
    assert reopened.aborted_transactions(0, upper) == []
    reopened.close()


def test_the_accelerated_readers_agree_with_ours():
    from onceflow.protocol.compression import batch_keys, batch_records
    from onceflow.storage import cleaner

    c_keys, c_records = cleaner.readers()
    assert c_keys is not batch_keys and c_records is not batch_records, \
        "aiokafka (a test dependency) is installed"
    rng = random.Random(3)
    for _ in range(50):
        records = [SimpleRecord(rng.choice([None, *KEYS]), rng.choice([None, b"", b"v" * 300]),
                                (("h", b"x"),) * rng.randint(0, 2))
                   for _ in range(rng.randint(1, 30))]
        batch = build_batch(records, base_offset=rng.randint(0, 10**12),
                            base_timestamp_ms=rng.randint(0, 10**12),
                            timestamp_type=rng.choice(list(TimestampType)))
        assert c_keys(batch) == cleaner.record_keys(batch) == batch_keys(batch)
        assert c_records(batch) == cleaner.record_list(batch) == batch_records(batch)


def test_throttler_holds_the_rate():
    now = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    throttle = Throttler(1_000_000, clock=lambda: now[0], sleep=sleep)
    throttle(500_000)
    assert slept == [0.5]
    now[0] += 2.0  # time passed doing other work: no sleep needed
    throttle(1_000_000)
    assert slept == [0.5]
    throttle(3_000_000)
    assert slept[-1] == 2.0 and now[0] == 4.5  # 4.5 MB at 1 MB/s: 4.5 s in all
