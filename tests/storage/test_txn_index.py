"""The aborted-transaction index: its file format, its queries, and how it follows its
segment (roll, retention, recovery) and is rebuilt from the log."""

from __future__ import annotations

import pytest
from conftest import NOW_MS

from onceflow.broker.state import PartitionState, load_producer_state
from onceflow.protocol.records import (
    EndTxnMarker,
    SimpleRecord,
    build_batch,
    build_control_batch,
    iter_batches,
)
from onceflow.storage import LogConfig, PartitionLog
from onceflow.storage.producer_state import AppendOrigin
from onceflow.storage.txn_index import (
    ENTRY_BYTES,
    TXN_INDEX_SUFFIX,
    AbortedTxn,
    TxnIndex,
    decode_entries,
    encode_entry,
)

EXPIRATION_MS = 86_400_000


def _entries(*spans: tuple[int, int, int]) -> list[AbortedTxn]:
    """(pid, first, last) -> entries whose LSO is the marker's next offset."""
    return [AbortedTxn(pid, first, last, last + 1) for pid, first, last in spans]


# ---------------------------------------------------------------- the file


def test_entries_round_trip_through_the_file(tmp_path):
    path = tmp_path / f"{0:020d}{TXN_INDEX_SUFFIX}"
    index = TxnIndex(path)
    assert not path.exists(), "created only with the first entry"
    for txn in _entries((7, 0, 4), (8, 2, 9)):
        index.append(txn)
    index.close()
    assert path.stat().st_size == 2 * ENTRY_BYTES
    again = TxnIndex(path)
    again.load()
    assert again.entries() == _entries((7, 0, 4), (8, 2, 9))


@pytest.mark.parametrize("damage", ["torn", "crc", "order"])
def test_load_keeps_the_valid_prefix_and_truncates_the_file(tmp_path, damage):
    path = tmp_path / f"{0:020d}{TXN_INDEX_SUFFIX}"
    good = _entries((1, 0, 3), (2, 4, 6))
    data = b"".join(encode_entry(t) for t in good)
    if damage == "torn":
        data += encode_entry(AbortedTxn(3, 7, 9, 10))[:-5]
    elif damage == "crc":
        bad = bytearray(encode_entry(AbortedTxn(3, 7, 9, 10)))
        bad[5] ^= 0xFF
        data += bytes(bad) + encode_entry(AbortedTxn(4, 11, 12, 13))
    else:  # a marker offset that goes back: not an index we wrote
        data += encode_entry(AbortedTxn(3, 0, 5, 6))
    path.write_bytes(data)
    index = TxnIndex(path)
    index.load()
    assert index.entries() == good
    assert path.stat().st_size == 2 * ENTRY_BYTES
    assert decode_entries(path.read_bytes()) == (good, None)
    index.close()


def test_truncate_from_drops_entries_whose_marker_is_at_or_after(tmp_path):
    index = TxnIndex(tmp_path / f"{0:020d}{TXN_INDEX_SUFFIX}")
    for txn in _entries((1, 0, 3), (2, 4, 6), (3, 5, 8)):
        index.append(txn)
    assert index.truncate_from(6) == 2
    assert index.entries() == _entries((1, 0, 3))
    assert decode_entries(index.path.read_bytes()) == (_entries((1, 0, 3)), None)
    index.close()


def test_collect_overlapping_entries_and_stop_when_complete(tmp_path):
    index = TxnIndex(tmp_path / f"{0:020d}{TXN_INDEX_SUFFIX}")
    index.append(AbortedTxn(1, 0, 3, 4))
    index.append(AbortedTxn(2, 5, 8, 6))  # another transaction was still open at 6
    index.append(AbortedTxn(3, 10, 12, 13))
    found: list[AbortedTxn] = []
    assert index.collect(4, 9, found) is True  # entry 3's LSO 13 >= 9: the search is over
    assert [t.producer_id for t in found] == [2]  # (entry 3 starts at 10: not overlapping)
    found.clear()
    assert index.collect(0, 4, found) is True  # entry 1's LSO 4 >= 4: nothing later counts
    assert [t.producer_id for t in found] == [1]
    found.clear()
    assert index.collect(4, 20, found) is False  # a later segment may hold more
    assert [t.producer_id for t in found] == [2, 3]
    index.close()


# ---------------------------------------------------------------- the log


def _data(pid: int, sequence: int, count: int = 2, epoch: int = 0) -> bytes:
    records = [SimpleRecord(None, b"x" * 100) for _ in range(count)]
    return build_batch(records, producer_id=pid, producer_epoch=epoch, base_sequence=sequence,
                       transactional=True, base_timestamp_ms=NOW_MS)


def _append(partition: PartitionState, batch: bytes, marker: EndTxnMarker | None = None):
    header, _ = next(iter_batches(batch))
    origin = AppendOrigin.COORDINATOR if marker is not None else AppendOrigin.CLIENT
    return partition.append([header], [batch], NOW_MS, origin=origin, marker=marker)


def _abort(partition: PartitionState, pid: int, epoch: int = 0):
    batch = build_control_batch(producer_id=pid, producer_epoch=epoch, commit=False,
                                coordinator_epoch=0, timestamp_ms=NOW_MS)
    return _append(partition, batch, EndTxnMarker(False, 0))


def _partition(path, config: LogConfig | None = None) -> PartitionState:
    log = PartitionLog.open(path, config or LogConfig(), NOW_MS)
    return PartitionState("t", 0, log, load_producer_state(log, NOW_MS, EXPIRATION_MS),
                          snapshot_fsync=False)


def test_abort_marker_records_the_transaction_and_moves_the_lso(tmp_path):
    partition = _partition(tmp_path / "t-0")
    _append(partition, _data(1, 0))            # 0-1, pid 1
    _append(partition, _data(2, 0))            # 2-3, pid 2
    assert partition.last_stable_offset == 0
    assert _abort(partition, 1).first_offset == 4
    assert partition.last_stable_offset == 2   # pid 2 still open
    assert partition.aborted_transactions(0, 5) == [AbortedTxn(1, 0, 4, 2)]
    assert partition.aborted_transactions(5, 6) == []  # the marker is before the range
    partition.log.close()


def test_query_finds_a_transaction_whose_marker_is_in_a_later_segment(tmp_path):
    config = LogConfig(segment_bytes=600)
    partition = _partition(tmp_path / "t-0", config)
    _append(partition, _data(1, 0))            # 0-1 in the first segment
    for i in range(4):                         # plain batches roll the log
        _append(partition, build_batch([SimpleRecord(None, b"y" * 200)]))
    _abort(partition, 1)
    log = partition.log
    assert len(log.segment_base_offsets) > 1
    marker_segment = log.segment_base_offsets[-1]
    assert (tmp_path / "t-0" / f"{marker_segment:020d}{TXN_INDEX_SUFFIX}").exists()
    assert [t.producer_id for t in log.aborted_transactions(0, 2)] == [1]
    log.close()


def test_retention_deletes_the_index_with_its_segment(tmp_path):
    config = LogConfig(segment_bytes=600)
    partition = _partition(tmp_path / "t-0", config)
    _append(partition, _data(1, 0))
    _abort(partition, 1)
    for _ in range(4):
        _append(partition, build_batch([SimpleRecord(None, b"y" * 200)]))
    index_file = tmp_path / "t-0" / f"{0:020d}{TXN_INDEX_SUFFIX}"
    assert index_file.exists()
    log = partition.log
    log.delete_records_before(log.segment_base_offsets[1])
    log.enforce_retention(NOW_MS)
    assert not index_file.exists()
    assert log.aborted_transactions(0, log.log_end_offset) == []
    log.close()


@pytest.mark.parametrize("lose", ["index file", "nothing"])
def test_reopen_rebuilds_the_index_from_the_log(tmp_path, lose):
    partition = _partition(tmp_path / "t-0")
    _append(partition, _data(1, 0))
    _append(partition, _data(2, 0))
    _abort(partition, 1)
    _abort(partition, 2)
    expected = partition.log.aborted_transactions(0, 100)
    assert [t.producer_id for t in expected] == [1, 2]
    partition.log.flush()
    partition.log.discard()  # a crash: no clean shutdown, no snapshot at the log end
    index_file = tmp_path / "t-0" / f"{0:020d}{TXN_INDEX_SUFFIX}"
    if lose == "index file":
        index_file.unlink()
    reopened = _partition(tmp_path / "t-0")
    assert reopened.log.aborted_transactions(0, 100) == expected
    assert decode_entries(index_file.read_bytes()) == (expected, None)
    assert reopened.last_stable_offset == reopened.high_watermark
    reopened.log.close()


def test_reopen_drops_entries_past_a_truncated_log_end(tmp_path):
    partition = _partition(tmp_path / "t-0")
    _append(partition, _data(1, 0))
    _abort(partition, 1)                       # marker at 2
    partition.log.flush()
    partition.log.discard()
    log_file = tmp_path / "t-0" / f"{0:020d}.log"
    header, _ = next(iter_batches(log_file.read_bytes()))
    with open(log_file, "r+b") as f:           # the marker's bytes were lost
        f.truncate(header.size_bytes)
    reopened = PartitionLog.open(tmp_path / "t-0", LogConfig(), NOW_MS)
    assert reopened.log_end_offset == 2
    assert reopened.aborted_transactions(0, 100) == []
    reopened.close()


def test_entries_below_a_snapshot_are_kept_and_later_ones_rebuilt(tmp_path):
    partition = _partition(tmp_path / "t-0")
    _append(partition, _data(1, 0))
    _abort(partition, 1)                       # 0-1, marker 2: below the snapshot
    partition.snapshot(partition.log.log_end_offset)
    _append(partition, _data(2, 0))
    _abort(partition, 2)                       # 3-4, marker 5: after it
    expected = partition.log.aborted_transactions(0, 100)
    partition.log.flush()
    partition.log.discard()
    reopened = _partition(tmp_path / "t-0")
    assert reopened.log.aborted_transactions(0, 100) == expected
    assert [(t.producer_id, t.first_offset, t.last_offset) for t in expected] == [
        (1, 0, 2), (2, 3, 5)]
    reopened.log.close()
