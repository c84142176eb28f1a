"""Opening a log after kill -9 the cheap way (issue 19): one pass over the listing removes
leftovers, the re-validation scan reads through a descriptor of its own (no OPEN_FILES
entry), and a transaction index without entries holds no arrays - with every check kept."""

from __future__ import annotations

from conftest import NOW_MS
from storage_batches import make_batch, with_base_offset

from onceflow.storage import LogConfig
from onceflow.storage.layout import read_header
from onceflow.storage.open_files import OPEN_FILES
from onceflow.storage.txn_index import TXN_INDEX_SUFFIX, AbortedTxn, TxnIndex, decode_entries

CONFIG = LogConfig(index_interval_bytes=100, segment_bytes=1500)


def fill(log, n: int) -> list[bytes]:
    stored = []
    for i in range(n):
        batch = make_batch(3, base_timestamp_ms=1000 + i)
        stored.append(with_base_offset(batch, log.append([batch], NOW_MS).first_offset))
    return stored


def test_leftovers_go_and_every_segment_file_stays(open_log, tmp_path):
    log = open_log(CONFIG)
    stored = fill(log, 40)
    bases = log.segment_base_offsets
    assert len(bases) >= 3
    log.discard()  # kill -9: nothing flushed, no clean state
    directory = tmp_path / "t-0"
    orphan = f"{99_999:020d}"  # a segment whose .log is gone (deleted before its indexes)
    leftovers = [f"{orphan}.index", f"{orphan}.timeindex", f"{orphan}{TXN_INDEX_SUFFIX}",
                 "partition.state.tmp", f"{bases[1]:020d}.index.tmp"]
    for name in leftovers:
        (directory / name).write_bytes(b"\x00" * 12)
    (directory / "README").write_bytes(b"not ours")  # not a segment file: left alone
    before = {p.name for p in directory.iterdir()}
    reopened = open_log(CONFIG)
    after = {p.name for p in directory.iterdir()}
    assert after == (before - set(leftovers)) - {"partition.state.tmp"}
    for base in bases:  # each segment's own files are kept
        assert {f"{base:020d}.log", f"{base:020d}.index", f"{base:020d}.timeindex"} <= after
    assert reopened.segment_base_offsets == bases
    assert reopened.read(0, 1 << 30, 1 << 62) == b"".join(stored)


def test_rescan_leaves_no_descriptor_and_the_log_works_on(open_log, tmp_path):
    log = open_log(CONFIG)
    stored = fill(log, 40)
    log.discard()
    directory = tmp_path / "t-0"
    last = max(directory.glob("*.log"))
    with open(last, "ab") as f:  # a torn tail: the scan must truncate through its descriptor
        f.write(stored[-1][:30])
    open_before = len(OPEN_FILES)
    reopened = open_log(CONFIG)
    assert reopened.recovery.segments_scanned == len(reopened.segment_base_offsets)
    assert reopened.recovery.bytes_truncated == 30
    assert len(OPEN_FILES) == open_before  # read once and closed, the LRU untouched
    assert last.stat().st_size == reopened.segment_infos()[-1].size_bytes
    stored += fill(reopened, 3)  # the active segment's file opens again on first use
    reopened.flush()
    assert reopened.read(0, 1 << 30, 1 << 62) == b"".join(stored)
    reopened.close()
    again = open_log(CONFIG)
    assert again.recovery.clean_shutdown
    end = read_header(stored[-1]).last_offset + 1
    assert again.log_end_offset == end
    assert again.read(0, 1 << 30, 1 << 62) == b"".join(stored)


def test_txn_index_without_entries_then_with_entries(tmp_path):
    index = TxnIndex(tmp_path / f"{0:020d}{TXN_INDEX_SUFFIX}")
    assert len(index) == 0 and index.truncate_from(0) == 0
    found: list[AbortedTxn] = []
    assert not index.collect(0, 100, found) and found == []
    index.append(AbortedTxn(7, 0, 4, 5))
    index.append(AbortedTxn(8, 2, 9, 10))
    assert index.truncate_from(0) == 2 and len(index) == 0  # emptied...
    index.append(AbortedTxn(9, 1, 3, 4))  # ...and written again
    assert index.entries() == [AbortedTxn(9, 1, 3, 4)]
    assert decode_entries(index.path.read_bytes()) == ([AbortedTxn(9, 1, 3, 4)], None)
    index.close()
    reloaded = TxnIndex(str(index.path))  # segments pass plain string paths
    reloaded.load()
    assert reloaded.entries() == [AbortedTxn(9, 1, 3, 4)]
    reloaded.close()
