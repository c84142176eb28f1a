"""Hypothesis: random append/read/flush/retention/delete/reopen sequences against a simple
in-memory model of the log (a list of stored batches and a log start offset)."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from storage_batches import make_batch, with_base_offset

from onceflow.storage import LogConfig, OffsetOutOfRange, PartitionLog
from onceflow.storage.layout import read_header

NOW_MS = 1_000_000


def expected_read(model, fetch, max_bytes, upper):
    if fetch >= upper:
        return b""
    out, total = [], 0
    for batch in model:
        h = read_header(batch)
        if h.last_offset < fetch:
            continue
        if h.base_offset >= upper or (out and total + len(batch) > max_bytes):
            break
        out.append(batch)
        total += len(batch)
        if total > max_bytes:  # the one oversized first batch (KIP-74)
            break
    return b"".join(out)


def expected_timestamp(model, target, log_start):
    for batch in model:
        h = read_header(batch)
        for j in range(h.records_count):
            step = (h.max_timestamp - h.base_timestamp) // max(h.records_count - 1, 1)
            offset, ts = h.base_offset + j, h.base_timestamp + j * step
            if offset >= log_start and ts >= target:
                return offset, ts
    return None


class LogMachine(RuleBasedStateMachine):
    @initialize(segment_bytes=st.integers(300, 2000), interval=st.integers(0, 400))
    def setup(self, segment_bytes, interval):
        self.dir = Path(tempfile.mkdtemp(prefix="onceflow-model-"))
        self.config = LogConfig(
            segment_bytes=segment_bytes,
            index_interval_bytes=interval,
            retention_ms=-1,
            retention_bytes=-1,
        )
        self.log = PartitionLog.open(self.dir / "t-0", self.config, NOW_MS)
        self.model: list[bytes] = []  # live batches, as stored
        self.written: list[bytes] = []  # every batch still in a file (below the start too)
        self.log_start = 0
        self.now_ms = NOW_MS

    def teardown(self):
        if hasattr(self, "log"):
            self.log.discard()
            shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def leo(self):
        return (
            read_header(self.model[-1]).last_offset + 1 if self.model else self.log.log_end_offset
        )

    @rule(
        specs=st.lists(
            st.tuples(
                st.integers(1, 6), st.integers(0, 40), st.integers(0, 5_000), st.integers(0, 3)
            ),
            min_size=1,
            max_size=4,
        ),
        advance_ms=st.integers(0, 2_000),
    )
    def append(self, specs, advance_ms):
        self.now_ms += advance_ms
        batches = [
            make_batch([b"v" * size] * n, base_timestamp_ms=ts, timestamp_step_ms=step)
            for n, size, ts, step in specs
        ]
        leo = self.leo
        info = self.log.append(batches, self.now_ms)
        assert info.first_offset == leo
        offset = info.first_offset
        for batch in batches:
            self.model.append(with_base_offset(batch, offset))
            self.written.append(self.model[-1])
            offset = read_header(batch).last_offset_delta + offset + 1
        assert info.end_position == offset == self.log.log_end_offset

    @rule(data=st.data(), max_bytes=st.integers(0, 3_000))
    def read(self, data, max_bytes):
        fetch = data.draw(st.integers(self.log_start - 2, self.leo + 2))
        upper = data.draw(st.integers(self.log_start, self.leo + 2))
        if not self.log_start <= fetch <= self.leo:
            with pytest.raises(OffsetOutOfRange):
                self.log.read(fetch, max_bytes, upper)
            return
        expected = expected_read(self.model, fetch, max_bytes, min(upper, self.leo))
        assert self.log.read(fetch, max_bytes, upper) == expected

    @rule(timestamp_ms=st.integers(-1, 5_100))
    def offset_for_timestamp(self, timestamp_ms):
        expected = expected_timestamp(self.model, timestamp_ms, self.log_start)
        assert self.log.offset_for_timestamp(timestamp_ms) == expected

    @rule()
    def max_timestamp(self):
        first = self.log.segment_base_offsets[0]
        present = [b for b in self.written if read_header(b).base_offset >= first]
        best = None
        for batch in present:
            h = read_header(batch)
            if best is None or h.max_timestamp > best[0]:
                step = (h.max_timestamp - h.base_timestamp) // max(h.records_count - 1, 1)
                j = next(
                    j
                    for j in range(h.records_count)
                    if h.base_timestamp + j * step == h.max_timestamp
                )
                best = (h.max_timestamp, h.base_offset + j)
        assert self.log.max_timestamp() == best

    @rule(data=st.data())
    def batches_from(self, data):
        offset = data.draw(st.integers(0, self.leo + 1))
        got = [h.base_offset for h in self.log.batches_from(offset)]
        start = max(offset, self.log_start)
        assert got == [
            read_header(b).base_offset for b in self.model if read_header(b).last_offset >= start
        ]

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def crash_with_torn_tail(self, data):
        """kill -9 in the middle of writing the last batch: its tail never reached the file."""
        self.log.discard()
        last_file = [p for p in sorted((self.dir / "t-0").glob("*.log")) if p.stat().st_size][-1]
        last = self.model[-1]
        assert last_file.stat().st_size >= len(last)
        cut = data.draw(st.integers(1, len(last)))
        os.truncate(last_file, last_file.stat().st_size - cut)
        self.log = PartitionLog.open(self.dir / "t-0", self.config, self.now_ms)
        assert self.log.recovery.bytes_truncated == len(last) - cut
        self.model.pop()
        self.written.pop()
        if self.log.log_start_offset > self.log_start:  # the start was in the lost batch
            self.log_start = self.log.log_start_offset
            self.written = []
        assert self.log.log_start_offset == self.log_start

    @rule()
    def flush(self):
        self.log.flush()
        assert self.log.recovery_point_offset == self.leo

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def delete_records(self, data):
        offset = data.draw(st.integers(self.log_start, self.leo))
        assert self.log.delete_records_before(offset) == max(offset, self.log_start)
        self._adopt_log_start()

    @rule(retention_bytes=st.integers(-1, 3_000))
    def retention_by_size(self, retention_bytes):
        self.log.update_config(replace(self.config, retention_bytes=retention_bytes))
        bases = self.log.segment_base_offsets
        below_start = sum(1 for b in bases[1:] if b <= self.log_start)  # deleted whatever the size
        before = self.log.size_bytes
        deleted = self.log.enforce_retention(self.now_ms).segments_deleted
        assert deleted >= below_start
        if deleted > below_start:
            assert self.log.size_bytes >= retention_bytes and self.log.size_bytes < before
        assert len(self.log.segment_base_offsets) >= 1
        self._adopt_log_start()
        self.log.update_config(self.config)

    @rule(clean=st.booleans())
    def reopen(self, clean):
        self.log.close() if clean else self.log.discard()
        self.log = PartitionLog.open(self.dir / "t-0", self.config, self.now_ms)
        assert self.log.recovery.clean_shutdown == clean
        bases = self.log.segment_base_offsets
        self.written = [b for b in self.written if read_header(b).base_offset >= bases[0]]
        assert self.log.recovery.bytes_truncated == 0
        assert self.log.log_start_offset == self.log_start

    def _adopt_log_start(self):
        start = self.log.log_start_offset
        assert start >= self.log_start
        self.log_start = start
        self.model = [b for b in self.model if read_header(b).last_offset >= start]

    @invariant()
    def ends_agree(self):
        if hasattr(self, "log"):
            assert self.log.log_end_offset == self.leo
            assert self.log.log_start_offset == self.log_start
            assert self.log.segment_base_offsets[0] <= self.log_start


LogMachine.TestCase.settings = settings(
    max_examples=30,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestLogModel = LogMachine.TestCase
