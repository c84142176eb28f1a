"""PartitionLog.replace_segment (log compaction): offsets kept, reads and recovery see the
rewritten segment, and every state a crash can leave in the middle of a swap opens."""

from __future__ import annotations

import os

import pytest
from conftest import NOW_MS
from storage_batches import make_batch, split_batches, with_base_offset

from onceflow.storage import LogConfig, PartitionLog
from onceflow.storage.layout import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX, segment_path
from onceflow.storage.rewrite import install_segment, stage_segment


def _filled(open_log, batches: int = 9, per_segment: int = 3):
    """A log of one-record batches, `per_segment` per segment; (log, stored batches)."""
    size = len(make_batch(1))
    log = open_log(LogConfig(segment_bytes=size * per_segment, index_interval_bytes=size))
    stored = []
    for _ in range(batches):
        info = log.append([make_batch(1)], NOW_MS)
        stored.append(with_base_offset(make_batch(1), info.first_offset))
    assert log.segment_base_offsets == list(range(0, batches, per_segment))
    return log, stored


def _everything(log: PartitionLog) -> list[bytes]:
    return split_batches(log.read(log.log_start_offset, 1 << 20, 1 << 62))


def test_replace_keeps_offsets_and_later_segments(open_log):
    log, stored = _filled(open_log)
    kept = [stored[0], stored[2]]  # offset 1 compacted away: a gap
    assert log.replace_segment(0, kept, NOW_MS) == sum(map(len, kept))
    assert _everything(log) == kept + stored[3:]
    assert log.read(1, 1 << 20, 100) == b"".join([stored[2]] + stored[3:])
    assert log.log_end_offset == 9
    info = log.append([make_batch(1)], NOW_MS)  # appends carry on at the LEO
    assert info.first_offset == 9


@pytest.mark.parametrize("clean", [True, False])
def test_rewritten_segments_survive_reopen(open_log, tmp_path, clean):
    log, stored = _filled(open_log)
    log.replace_segment(0, [stored[2]], NOW_MS)
    log.replace_segment(3, [], NOW_MS)  # a middle segment left empty is deleted
    assert log.segment_base_offsets == [0, 6]
    log.flush()
    if clean:
        log.close()
    else:
        log.discard()  # no clean-shutdown state: recovery re-validates
    reopened = open_log(log.config)
    assert _everything(reopened) == [stored[2]] + stored[6:]
    assert reopened.segment_base_offsets == [0, 6]
    assert reopened.log_end_offset == 9


def test_first_segment_emptied_stays_readable(open_log):
    log, stored = _filled(open_log)
    log.replace_segment(0, [], NOW_MS)
    assert log.segment_base_offsets == [0, 3, 6]
    assert log.read(0, 1 << 20, 100) == b"".join(stored[3:])


def test_refuses_the_active_segment_and_batches_outside_the_segment(open_log):
    log, stored = _filled(open_log)
    with pytest.raises(ValueError):
        log.replace_segment(6, [stored[6]], NOW_MS)  # active
    with pytest.raises(ValueError):
        log.replace_segment(1, [stored[1]], NOW_MS)  # no segment starts there
    with pytest.raises(ValueError):
        log.replace_segment(0, [stored[3]], NOW_MS)  # belongs to the next segment
    with pytest.raises(ValueError):
        log.replace_segment(0, [stored[2], stored[1]], NOW_MS)  # out of order
    assert _everything(log) == stored  # nothing changed


def _crash_during_swap(log: PartitionLog, kept: list[bytes], steps: int) -> None:
    """The swap of segment 0 stopped after `steps` of its file operations."""
    directory = log.directory
    staging = stage_segment(directory, 0, 3, kept, log.config.index_interval_bytes, 8, NOW_MS)
    operations = [
        lambda: os.unlink(segment_path(directory, 0, INDEX_SUFFIX)),
        lambda: os.unlink(segment_path(directory, 0, TIME_INDEX_SUFFIX)),
        *[lambda s=s: os.replace(segment_path(staging, 0, s), segment_path(directory, 0, s))
          for s in (LOG_SUFFIX, TIME_INDEX_SUFFIX, INDEX_SUFFIX)],
    ]
    for operation in operations[:steps]:
        operation()
    log.discard()


@pytest.mark.parametrize("steps", range(6))
def test_every_crash_point_of_a_swap_opens_to_old_or_new(open_log, steps):
    log, stored = _filled(open_log)
    log.flush()
    kept = [stored[1]]
    _crash_during_swap(log, kept, steps)
    reopened = open_log(log.config)
    expected_first = kept if steps >= 3 else stored[:3]  # the .log rename is the switch
    assert _everything(reopened) == expected_first + stored[3:]
    assert reopened.read(2, 1 << 20, 100) == b"".join(
        ([] if steps >= 3 else [stored[2]]) + stored[3:])


def test_install_is_idempotent_after_staging(open_log):
    log, stored = _filled(open_log)
    log.flush()
    staging = stage_segment(log.directory, 0, 3, [stored[0]], log.config.index_interval_bytes,
                            8, NOW_MS)
    log.discard()
    install_segment(log.directory, staging, 0)
    assert _everything(open_log(log.config)) == [stored[0]] + stored[3:]
