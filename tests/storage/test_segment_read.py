"""Segment.read: whole batches cut from one pread (issue 19), checked against the batches as
written, and the number of preads each kind of read costs."""

from __future__ import annotations

import os

import pytest
from conftest import NOW_MS
from storage_batches import make_batch, with_base_offset

from onceflow.storage import segment as segment_module
from onceflow.storage.layout import read_header
from onceflow.storage.open_files import OPEN_FILES
from onceflow.storage.segment import READ_FLOOR_BYTES, Segment, prepare_append

INDEX_ENTRIES_MAX = 1000


@pytest.fixture
def preads(monkeypatch):
    """The (length, position) of every pread the segment module makes."""
    calls: list[tuple[int, int]] = []
    real = os.pread

    def counting(fd: int, length: int, position: int) -> bytes:
        calls.append((length, position))
        return real(fd, length, position)

    monkeypatch.setattr(segment_module.os, "pread", counting)
    return calls


@pytest.fixture(autouse=True)
def _close_segments():
    yield
    while _OPENED:
        _OPENED.pop().close()


_OPENED: list[Segment] = []


def _segment(tmp_path, base_offset: int, first_offset: int, sizes: list[int],
             interval_bytes: int = 4096) -> tuple[Segment, list[bytes]]:
    """A segment at `base_offset` whose batches start at `first_offset` (above the base: a
    compacted segment), one batch per entry of `sizes` (values of that many bytes)."""
    seg = Segment.create(tmp_path, base_offset, interval_bytes, INDEX_ENTRIES_MAX)
    _OPENED.append(seg)
    batches = [make_batch([b"v" * size, b"w" * size]) for size in sizes]
    prepared = prepare_append([memoryview(b) for b in batches], first_offset, None, None)
    seg.append(prepared, NOW_MS)
    stored, offset = [], first_offset
    for batch in batches:
        stored.append(with_base_offset(batch, offset))
        offset = read_header(stored[-1]).last_offset + 1
    return seg, stored


def expected(stored: list[bytes], offset: int, budget: int, upper: int, at_least_one: bool):
    """The rule Segment.read implements, over the batches as written."""
    out, total = [], 0
    for batch in stored:
        header = read_header(batch)
        if header.last_offset < offset:
            continue
        if header.base_offset >= upper:
            break
        if total + len(batch) > budget and not (at_least_one and not out):
            break
        out.append(batch)
        total += len(batch)
        if total > budget:
            break
    return b"".join(out)


def test_a_read_at_the_base_offset_is_one_pread_without_a_walk(tmp_path, preads):
    seg, stored = _segment(tmp_path, 0, 0, [100, 100, 100])
    seg._read_hints.clear()
    data, end = seg.read(0, 1 << 20, 1 << 62, True)
    assert data == b"".join(stored) and end == seg.size_bytes
    assert preads == [(seg.size_bytes, 0)]


def test_a_read_inside_the_segment_walks_from_the_index_then_reads_once(tmp_path, preads):
    seg, stored = _segment(tmp_path, 0, 0, [100, 100, 100, 100])
    seg._read_hints.clear()
    offset = read_header(stored[2]).base_offset + 1   # inside the third batch
    data, _ = seg.read(offset, 1 << 20, 1 << 62, True)
    assert data == b"".join(stored[2:])
    assert len(preads) == 2   # the walk to the third batch, then its data
    preads.clear()
    next_offset = seg.next_offset
    assert seg.read(next_offset, 1 << 20, 1 << 62, True) == (b"", 0)
    assert preads == []


def test_a_first_batch_larger_than_the_budget_and_the_floor_is_read_whole(tmp_path, preads):
    big = READ_FLOOR_BYTES   # two values of this size: the batch is larger than the floor
    seg, stored = _segment(tmp_path, 0, 0, [big, 10])
    data, end = seg.read(0, 1024, 1 << 62, True)
    assert data == stored[0] and end == len(stored[0])
    assert [length for length, _ in preads] == [READ_FLOOR_BYTES, len(stored[0])]
    assert seg.read(0, 1024, 1 << 62, False) == (b"", 0)   # not the first: nothing


def test_a_first_batch_larger_than_the_budget_within_the_floor_costs_one_pread(tmp_path, preads):
    seg, stored = _segment(tmp_path, 0, 0, [1400, 1400])   # ~2.8 KB batches, 1 KiB budget
    data, _ = seg.read(0, 1024, 1 << 62, True)
    assert data == stored[0]
    assert len(preads) == 1
    # The next read starts where this one ended: remembered, no walk.
    preads.clear()
    data, _ = seg.read(read_header(stored[1]).base_offset, 1 << 20, 1 << 62, True)
    assert data == stored[1] and len(preads) == 1


@pytest.mark.parametrize("upper_batch", [1, 2, 3])
def test_the_upper_offset_cuts_inside_the_buffer(tmp_path, upper_batch):
    seg, stored = _segment(tmp_path, 0, 0, [50, 50, 50, 50], interval_bytes=0)
    headers = [read_header(b) for b in stored]
    for upper in (headers[upper_batch].base_offset, headers[upper_batch].base_offset + 1):
        for at_least_one in (True, False):
            data, end = seg.read(0, 1 << 20, upper, at_least_one)
            want = expected(stored, 0, 1 << 20, upper, at_least_one)
            assert data == want and end == len(want)
    assert seg.read(0, 1 << 20, 0, True) == (b"", 0)   # the first batch is at the upper offset


def test_a_compacted_segment_whose_first_batch_is_above_its_base(tmp_path, preads):
    seg, stored = _segment(tmp_path, 100, 105, [30, 30, 30])
    for offset in (100, 103, 105):   # at the base, inside the gap, at the first batch
        seg._read_hints.clear()
        preads.clear()
        data, _ = seg.read(offset, 1 << 20, 1 << 62, True)
        assert data == b"".join(stored)
        assert len(preads) == (1 if offset == 100 else 2)   # above the base: a walk first
    second = read_header(stored[1])
    assert seg.read(second.base_offset, 1 << 20, 1 << 62, True)[0] == b"".join(stored[1:])
    assert seg.read(100, 1 << 20, 105, True) == (b"", 0)   # first batch at the upper offset


@pytest.mark.parametrize("interval_bytes", [0, 150, 4096])
def test_every_offset_budget_and_upper_agrees_with_the_batches(tmp_path, interval_bytes):
    seg, stored = _segment(tmp_path, 10, 12, [20, 90, 5, 300, 40, 70, 10], interval_bytes)
    last = seg.next_offset
    lengths = sorted({len(b) for b in stored})
    budgets = [0, 1, 60, *lengths, lengths[-1] + lengths[0], 500, 1 << 20]
    for offset in range(10, last + 1):
        for budget in budgets:
            for upper in (12, offset + 1, offset + 3, last, 1 << 62):
                for at_least_one in (True, False):
                    seg._read_hints.clear()
                    data, _ = seg.read(offset, budget, upper, at_least_one)
                    assert data == expected(stored, offset, budget, upper, at_least_one), (
                        offset, budget, upper, at_least_one)


def test_reads_past_the_open_files_limit_leave_the_lru_alone(open_log, tmp_path):
    before = OPEN_FILES.files_max
    OPEN_FILES.set_files_max(3)
    try:
        logs = [open_log(name=f"t-{i}") for i in range(8)]
        stored = []
        for log in logs:
            batch = make_batch(3)
            info = log.append([memoryview(batch)], NOW_MS)
            stored.append(with_base_offset(batch, info.first_offset))
        held = {id(s) for s in OPEN_FILES._open.values()}
        reopens = OPEN_FILES.reopens
        for _ in range(2):
            for log, batch in zip(logs, stored):
                assert log.read(0, 1 << 20, 1 << 62) == batch
        assert {id(s) for s in OPEN_FILES._open.values()} == held   # nothing evicted
        assert OPEN_FILES.reopens == reopens
        log_fds = [fd for fd in os.listdir("/proc/self/fd")
                   if _target(fd).startswith(str(tmp_path)) and _target(fd).endswith(".log")]
        assert len(log_fds) <= 3
    finally:
        OPEN_FILES.set_files_max(before)


def _target(fd: str) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


def test_a_read_to_the_end_remembers_where_the_next_one_starts(tmp_path, preads):
    seg, stored = _segment(tmp_path, 0, 0, [100, 100])
    assert seg.read(0, 1 << 20, 1 << 62, True)[0] == b"".join(stored)
    more = make_batch([b"x" * 50])
    seg.append(prepare_append([memoryview(more)], seg.next_offset, None, None), NOW_MS)
    preads.clear()
    data, _ = seg.read(read_header(stored[-1]).last_offset + 1, 1 << 20, 1 << 62, True)
    assert data == with_base_offset(more, read_header(stored[-1]).last_offset + 1)
    assert len(preads) == 1   # no walk: the previous read said where this one starts
