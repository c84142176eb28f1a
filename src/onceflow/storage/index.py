"""Sparse per-segment indexes: `.index` (offset -> position) and `.timeindex` (time -> offset).

Theory of operation
-------------------
Both indexes are appended, never preallocated, and mirrored in memory as parallel `array`s
so that a lookup is one C-level `bisect`. Entries are added by `IndexBuilder`, the single rule
shared by append and recovery (so a rebuilt index is identical to the one written live):

* when at least `index_interval_bytes` of batches were written since the last entry, the next
  batch gets an offset entry (its base offset relative to the segment, its file position);
* at the same batch, if the largest timestamp seen so far in the segment grew since the last
  time entry, a time entry (that largest timestamp, the batch's relative base offset) is added.

So a time entry (T, O) states: every batch of the segment *before* offset O has a max
timestamp <= T. The first batch with max timestamp >= target therefore lies at or after the
O of the last entry with T < target, and a lookup scans forward from there.

Every entry points at a batch boundary inside the valid log. Recovery drops entries at or past
the valid size, and rebuilds an index that fails its checks (size not a multiple of the entry
size, entries not strictly increasing) from the log, so a lookup never returns a position
beyond the valid log. Index files are fsync'd when their segment stops being active; the active
segment's indexes are rebuilt by recovery after an unclean stop.

No file descriptor is held: the entries live in memory, and the ones not yet on disk are
written when the segment's indexes are flushed (`sync_fd`, at a roll, a rewrite or a close).
A segment thus keeps one descriptor open (its `.log`), not three, which is what lets
10,000 single-segment partitions fit under a 20,000-descriptor limit. Entries lost by a crash belong
to the active segment, whose indexes recovery rebuilds anyway.
"""

from __future__ import annotations

import logging
import os
import struct
import sys
from array import array
from bisect import bisect_left, bisect_right
from pathlib import Path

from onceflow.storage.layout import NO_TIMESTAMP, write_fully

OFFSET_ENTRY = struct.Struct(">II")  # relative offset (batch base - segment base), file position
TIME_ENTRY = struct.Struct(">qI")  # largest timestamp so far (ms), relative offset of the batch
OFFSET_ENTRY_BYTES = OFFSET_ENTRY.size  # 8
TIME_ENTRY_BYTES = TIME_ENTRY.size  # 12
_SWAP = sys.byteorder == "little"  # entries are big-endian on disk, like Kafka's
logger = logging.getLogger(__name__)


class IndexCorrupt(Exception):
    """An index file fails its checks; the caller rebuilds it from the log."""


def _strictly_increasing(values: array) -> bool:
    return all(a < b for a, b in zip(values, values[1:], strict=False))


def _open_rw(path: str | Path) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)


def _read_all(path: str) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise IndexCorrupt(f"{os.path.basename(path)} is missing") from None
    try:
        size = os.fstat(fd).st_size
        data = os.pread(fd, size, 0)
    finally:
        os.close(fd)
    if len(data) != size:
        raise IndexCorrupt(f"short read: {len(data)} of {size} bytes")
    return data


class _IndexFile:
    """The on-disk side of an index: entries written lazily, no descriptor kept."""

    entry_bytes: int

    def __init__(self, path: str | Path, max_entries: int, exists: bool = False) -> None:
        self.file = os.fspath(path)  # a str: segments build it without pathlib (segment.py)
        self.max_entries = max_entries
        self.persisted = 0  # entries already in the file
        # The whole file is rewritten by the next persist (after a recovery rebuild): the
        # rebuild itself writes nothing, so a restart after a crash does no index I/O; the
        # segment stays below the recovery point until that persist, so a crash before it
        # rebuilds the index again instead of loading the stale file.
        self._rewrite_pending = False
        if not exists:  # the file exists from the start, as the segment's other files
            os.close(_open_rw(self.file))

    @property
    def path(self) -> Path:
        return Path(self.file)

    @property
    def name(self) -> str:
        return os.path.basename(self.file)

    def _entries_bytes(self, start: int) -> bytes:
        raise NotImplementedError

    def _count(self) -> int:
        raise NotImplementedError

    def _all_bytes(self) -> bytes | bytearray:
        """Every entry as stored (a rebuild's rewrite), without a Python loop per entry."""
        raise NotImplementedError

    def persist(self) -> None:
        """Writes the entries not yet in the file (all of them after a rebuild)."""
        if self._rewrite_pending:
            self._rewrite_file(self._all_bytes())
            self._rewrite_pending = False
        elif self.persisted < self._count():
            data = self._entries_bytes(self.persisted)
            fd = _open_rw(self.file)
            try:
                write_fully(fd, data, self.persisted * self.entry_bytes)
            finally:
                os.close(fd)
            self.persisted = self._count()

    def sync_fd(self) -> int:
        """Writes what is pending and returns a new descriptor of the file for an fsync
        (the caller closes it)."""
        self.persist()
        return _open_rw(self.file)

    def _truncate_file(self, keep: int) -> None:
        if keep < self.persisted:
            fd = _open_rw(self.file)
            try:
                os.ftruncate(fd, keep * self.entry_bytes)
            finally:
                os.close(fd)
            self.persisted = keep

    def _rewrite_file(self, data: bytes | bytearray) -> None:
        fd = _open_rw(self.file)
        try:
            os.ftruncate(fd, 0)
            write_fully(fd, data, 0)
        finally:
            os.close(fd)
        self.persisted = self._count()

    def close(self) -> None:
        """Writes what is pending. A failure (a full disk) is only logged: an index file
        missing its tail or holding a torn entry is rebuilt or completed at the next open."""
        try:
            self.persist()
        except OSError as exc:
            logger.warning("could not write %s at close: %s", self.file, exc)


class OffsetIndex(_IndexFile):
    """`.index`: relative base offset (u32) -> file position (u32), both strictly increasing."""

    entry_bytes = OFFSET_ENTRY_BYTES

    def __init__(self, path: Path, max_entries: int, exists: bool = False) -> None:
        super().__init__(path, max_entries, exists)
        self.rel_offsets = array("I")
        self.positions = array("I")

    def _count(self) -> int:
        return len(self.positions)

    def _entries_bytes(self, start: int) -> bytes:
        return b"".join(OFFSET_ENTRY.pack(r, p) for r, p in
                        zip(self.rel_offsets[start:], self.positions[start:], strict=True))

    def load(self) -> None:
        """Reads the file into memory; raises IndexCorrupt if it cannot be trusted."""
        data = _read_all(self.file)
        if len(data) % OFFSET_ENTRY_BYTES:
            raise IndexCorrupt(f"{self.name}: {len(data)} bytes is not a whole entry count")
        words = array("I")
        words.frombytes(data)
        if _SWAP:
            words.byteswap()
        rel_offsets, positions = words[0::2], words[1::2]
        if not (_strictly_increasing(rel_offsets) and _strictly_increasing(positions)):
            raise IndexCorrupt(f"{self.name}: entries are not strictly increasing")
        self.rel_offsets, self.positions = rel_offsets, positions
        self.persisted = len(positions)

    def __len__(self) -> int:
        return len(self.positions)

    @property
    def is_full(self) -> bool:
        return len(self.positions) >= self.max_entries

    def lookup(self, rel_offset: int) -> int:
        """Position of the last indexed batch whose base is <= rel_offset (0 if none)."""
        i = bisect_right(self.rel_offsets, rel_offset) - 1
        return self.positions[i] if i >= 0 else 0

    def floor_position(self, position: int) -> int:
        """The largest indexed position <= `position` (0 if none): a batch boundary."""
        i = bisect_right(self.positions, position) - 1
        return self.positions[i] if i >= 0 else 0

    def last(self) -> tuple[int, int] | None:
        if not self.positions:
            return None
        return self.rel_offsets[-1], self.positions[-1]

    def append(self, entries: list[tuple[int, int]]) -> None:
        last = self.last()
        for rel_offset, position in entries:
            if last is not None and (rel_offset <= last[0] or position <= last[1]):
                raise AssertionError(f"{self.name}: entry {rel_offset, position} after {last}")
            last = (rel_offset, position)
        for rel_offset, position in entries:
            self.rel_offsets.append(rel_offset)
            self.positions.append(position)

    def truncate_to_position(self, size_bytes: int) -> None:
        """Drops entries at or beyond `size_bytes` of log (they point past the valid log)."""
        keep = bisect_left(self.positions, size_bytes)
        if keep < len(self.positions):
            del self.rel_offsets[keep:]
            del self.positions[keep:]
            self._truncate_file(keep)

    def replace(self, rel_offsets: array, positions: array) -> None:
        """The entries of a recovery rebuild; the file is rewritten by the next persist."""
        self.rel_offsets, self.positions = array("I", rel_offsets), array("I", positions)
        self.persisted = 0
        self._rewrite_pending = True

    def _all_bytes(self) -> bytes:
        words = array("I", bytes(8 * len(self.positions)))
        words[0::2], words[1::2] = self.rel_offsets, self.positions
        if _SWAP:
            words.byteswap()
        return words.tobytes()


class TimeIndex(_IndexFile):
    """`.timeindex`: max timestamp so far (i64) -> relative offset (u32), both increasing."""

    entry_bytes = TIME_ENTRY_BYTES

    def __init__(self, path: Path, max_entries: int, exists: bool = False) -> None:
        super().__init__(path, max_entries, exists)
        self.timestamps = array("q")
        self.rel_offsets = array("I")

    def _count(self) -> int:
        return len(self.timestamps)

    def _entries_bytes(self, start: int) -> bytes:
        return b"".join(TIME_ENTRY.pack(t, r) for t, r in
                        zip(self.timestamps[start:], self.rel_offsets[start:], strict=True))

    def load(self) -> None:
        data = _read_all(self.file)
        if len(data) % TIME_ENTRY_BYTES:
            raise IndexCorrupt(f"{self.name}: {len(data)} bytes is not a whole entry count")
        count = len(data) // TIME_ENTRY_BYTES
        # De-interleave the 12-byte records with strided byte copies (C speed, no Python loop
        # over entries): bytes k of every timestamp, then bytes k of every relative offset.
        ts_bytes, rel_bytes = bytearray(8 * count), bytearray(4 * count)
        for k in range(8):
            ts_bytes[k::8] = data[k::TIME_ENTRY_BYTES]
        for k in range(4):
            rel_bytes[k::4] = data[8 + k :: TIME_ENTRY_BYTES]
        timestamps, rel_offsets = array("q", ts_bytes), array("I", rel_bytes)
        if _SWAP:
            timestamps.byteswap()
            rel_offsets.byteswap()
        if not (_strictly_increasing(timestamps) and _strictly_increasing(rel_offsets)):
            raise IndexCorrupt(f"{self.name}: entries are not strictly increasing")
        self.timestamps, self.rel_offsets = timestamps, rel_offsets
        self.persisted = count

    def __len__(self) -> int:
        return len(self.timestamps)

    @property
    def is_full(self) -> bool:
        return len(self.timestamps) >= self.max_entries

    def lookup(self, timestamp_ms: int) -> int | None:
        """Relative offset from which to scan for the first batch with max timestamp >=
        timestamp_ms: that of the last entry whose timestamp is < timestamp_ms (None: scan
        from the segment's start)."""
        i = bisect_left(self.timestamps, timestamp_ms) - 1
        return self.rel_offsets[i] if i >= 0 else None

    def last(self) -> tuple[int, int] | None:
        if not self.timestamps:
            return None
        return self.timestamps[-1], self.rel_offsets[-1]

    def append(self, entries: list[tuple[int, int]]) -> None:
        last = self.last()
        for timestamp_ms, rel_offset in entries:
            if last is not None and (timestamp_ms <= last[0] or rel_offset <= last[1]):
                raise AssertionError(
                    f"{self.name}: entry {timestamp_ms, rel_offset} after {last}"
                )
            last = (timestamp_ms, rel_offset)
        for timestamp_ms, rel_offset in entries:
            self.timestamps.append(timestamp_ms)
            self.rel_offsets.append(rel_offset)

    def truncate_to_rel_offset(self, rel_offset_end: int) -> None:
        """Drops entries whose batch starts at or after `rel_offset_end` (past the valid log)."""
        keep = bisect_left(self.rel_offsets, rel_offset_end)
        if keep < len(self.rel_offsets):
            del self.timestamps[keep:]
            del self.rel_offsets[keep:]
            self._truncate_file(keep)

    def replace(self, timestamps: array, rel_offsets: array) -> None:
        """The entries of a recovery rebuild; the file is rewritten by the next persist."""
        self.timestamps, self.rel_offsets = array("q", timestamps), array("I", rel_offsets)
        self.persisted = 0
        self._rewrite_pending = True

    def _all_bytes(self) -> bytearray:
        count = len(self.timestamps)
        ts, rel = array("q", self.timestamps), array("I", self.rel_offsets)
        if _SWAP:
            ts.byteswap()
            rel.byteswap()
        ts_bytes, rel_bytes = ts.tobytes(), rel.tobytes()
        data = bytearray(TIME_ENTRY_BYTES * count)
        for k in range(8):
            data[k::TIME_ENTRY_BYTES] = ts_bytes[k::8]
        for k in range(4):
            data[8 + k :: TIME_ENTRY_BYTES] = rel_bytes[k::4]
        return data


class IndexBuilder:
    """The one rule deciding index entries, fed batch by batch (see the module docstring)."""

    __slots__ = ("interval_bytes", "bytes_since_entry", "max_timestamp_ms", "last_time_entry_ms")

    def __init__(self, interval_bytes: int) -> None:
        self.interval_bytes = interval_bytes
        self.bytes_since_entry = 0
        self.max_timestamp_ms = NO_TIMESTAMP
        self.last_time_entry_ms = NO_TIMESTAMP

    def observe(
        self,
        rel_offset: int,
        position: int,
        size_bytes: int,
        max_timestamp_ms: int,
        offset_entries: list[tuple[int, int]],
        time_entries: list[tuple[int, int]],
    ) -> None:
        if self.bytes_since_entry >= self.interval_bytes:
            offset_entries.append((rel_offset, position))
            if self.max_timestamp_ms > self.last_time_entry_ms:
                time_entries.append((self.max_timestamp_ms, rel_offset))
                self.last_time_entry_ms = self.max_timestamp_ms
            self.bytes_since_entry = 0
        self.bytes_since_entry += size_bytes
        if max_timestamp_ms > self.max_timestamp_ms:
            self.max_timestamp_ms = max_timestamp_ms
