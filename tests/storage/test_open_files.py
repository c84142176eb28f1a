"""The open-files LRU: segment descriptors stay under log.max.open.files however many logs
are open, and a log whose file was closed reads and appends as before."""

from __future__ import annotations

import os

import pytest
from conftest import NOW_MS
from storage_batches import make_batch, with_base_offset

from onceflow.storage.open_files import OPEN_FILES


def open_log_fds(tmp_path) -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(tmp_path)) and target.endswith(".log"):
            count += 1
    return count


@pytest.fixture
def small_cap():
    before = OPEN_FILES.files_max
    OPEN_FILES.set_files_max(3)
    yield
    OPEN_FILES.set_files_max(before)


def test_logs_beyond_the_cap_keep_working(open_log, tmp_path, small_cap):
    logs = [open_log(name=f"t-{i}") for i in range(20)]
    stored = {}
    for round_ in range(3):
        for i, log in enumerate(logs):
            batch = make_batch(2 + round_)
            info = log.append([memoryview(batch)], NOW_MS)
            stored.setdefault(i, []).append(with_base_offset(batch, info.first_offset))
            assert open_log_fds(tmp_path) <= 3
    reopens = OPEN_FILES.reopens
    for i, log in enumerate(logs):
        assert log.read(0, 1 << 20, 1 << 62) == b"".join(stored[i])
        log.flush()
    assert OPEN_FILES.reopens > reopens
    assert open_log_fds(tmp_path) <= 3


def test_closed_logs_leave_the_lru(open_log, small_cap):
    before = len(OPEN_FILES)
    logs = [open_log(name=f"c-{i}") for i in range(5)]
    for log in logs:
        log.append([memoryview(make_batch(1))], NOW_MS)
    for log in logs:
        log.close()
    assert len(OPEN_FILES) <= before
