"""One log segment: `<base_offset>.log` plus its sparse `.index` and `.timeindex`, and the
aborted-transaction index `.txnindex` when it has entries (storage/txn_index.py).

Theory of operation
-------------------
A segment file is a sequence of whole v2 record batches with strictly increasing offsets.
`size_bytes` is the *valid* length: appends write past it with one `pwritev` at an explicit
position and only then advance it, so readers (which never look past `size_bytes`) cannot see
a partial batch, and a failed write leaves nothing that counts.

Appends are prepared first (`prepare_append`: offsets assigned, headers rewritten into small
side buffers, no mutation), then written. Batches are never copied or parsed past their
61-byte header unless the caller asks for the LogAppendTime stamp, which rewrites the header's
max timestamp and attributes and recomputes the CRC (the one case that copies a batch).

Lookups start at an index entry (a known batch boundary) and walk batch headers forward,
reading windows of `WALK_WINDOW_BYTES`; the walk is bounded by `index_interval_bytes` plus one
batch. Every header crossed by a walk is checked (magic, length bounds), so a wrong index entry
surfaces as `CorruptLogError`, never as garbage returned to a client.

A read (`read`) takes one pread from the fetch's batch (position 0 without a walk when the
fetch offset is at or below the base) that covers what may be returned, and cuts the whole
batches to return out of that buffer; a segment whose descriptor the LRU closed is read
through a descriptor of its own while the LRU is full, so a Fetch of many partitions does
not close the descriptors of others (storage/open_files.py).

Recovery (`recover`) re-reads the whole file in `RECOVERY_CHUNK_BYTES` chunks, validates each
batch (length bounds, magic 2, CRC-32C, offsets monotonic) and truncates the file at the first
bad byte, rebuilding both indexes with the same `IndexBuilder` rule as live appends.

A `Segment` is not thread-safe on its own: `PartitionLog` serialises access with its lock.
"""

from __future__ import annotations

import os
import struct
import threading
from array import array
from bisect import bisect_left
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import crc32c

from onceflow.storage.index import IndexBuilder, IndexCorrupt, OffsetIndex, TimeIndex
from onceflow.storage.layout import (
    ATTR_COMPRESSION_MASK,
    ATTR_LOG_APPEND_TIME,
    ATTRIBUTES_OFFSET,
    BASE_OFFSET_FIELD,
    BATCH_HEADER,
    BATCH_HEADER_BYTES,
    BATCH_LENGTH_MIN,
    CRC_FIELD,
    CRC_OFFSET,
    CRC_START,
    INDEX_SUFFIX,
    LOG_OVERHEAD_BYTES,
    LOG_SUFFIX,
    MAGIC_V2,
    MAX_TIMESTAMP_OFFSET,
    NO_TIMESTAMP,
    OFFSET_AND_EPOCH_FIELDS,
    SEGMENT_NAME_DIGITS,
    TIME_INDEX_SUFFIX,
    BatchHeader,
    CorruptLogError,
    first_record_at_or_after,
    header_problem,
    read_header,
)
from onceflow.storage.open_files import OPEN_FILES
from onceflow.storage.txn_index import TXN_INDEX_SUFFIX, TxnIndex

# Relative offsets are stored as u32; like Kafka we keep them within a signed int so that any
# reader treating them as int32 is still right. A batch that would exceed this rolls the log.
REL_OFFSET_MAX = 2**31 - 1
POSITION_MAX = 2**32 - 1  # positions are u32 in the offset index
WALK_WINDOW_BYTES = 16 * 1024  # one pread covers an index interval (4 KiB) of small batches
RECOVERY_CHUNK_BYTES = 8 * 1024 * 1024  # large sequential reads; bounded memory
IOV_BUFFERS_MAX = 1024  # Linux IOV_MAX: most buffers one pwritev accepts
# The least a read that must return one whole batch asks for: one pread then holds a typical
# first batch even when the budget is smaller (a read past the budget costs a second pread).
READ_FLOOR_BYTES = WALK_WINDOW_BYTES
READ_HINTS_MAX = 64  # remembered (offset -> position) pairs of recent reads: ~ live consumers
_MAX_TIMESTAMP = struct.Struct(">q")
_ATTRIBUTES = struct.Struct(">h")


class PreparedAppend(NamedTuple):
    """What `Segment.append` writes; built without touching any state."""

    buffers: list  # bytes-like pieces, in file order
    metas: list[tuple[int, int, int]]  # per batch: (base_offset, size_bytes, max_timestamp_ms)
    total_bytes: int
    first_offset: int
    next_offset: int  # exclusive: first offset after the last batch
    max_timestamp_ms: int


def _stamp_log_append_time(
    view: memoryview, offset: int, epoch: int | None, now_ms: int
) -> bytearray:
    """A copy of the batch with the LogAppendTime stamp: attribute bit 3 set, max_timestamp =
    now_ms, CRC recomputed (base offset and leader epoch are outside the CRC)."""
    buf = bytearray(view)
    header = read_header(buf)
    BASE_OFFSET_FIELD.pack_into(buf, 0, offset)
    if epoch is not None:
        OFFSET_AND_EPOCH_FIELDS.pack_into(buf, 0, offset, header.batch_length, epoch)
    _ATTRIBUTES.pack_into(buf, ATTRIBUTES_OFFSET, header.attributes | ATTR_LOG_APPEND_TIME)
    _MAX_TIMESTAMP.pack_into(buf, MAX_TIMESTAMP_OFFSET, now_ms)
    CRC_FIELD.pack_into(buf, CRC_OFFSET, crc32c.crc32c(memoryview(buf)[CRC_START:]))
    return buf


def prepare_append(
    batches: list, first_offset: int, append_time_ms: int | None, leader_epoch: int | None
) -> PreparedAppend:
    """Assigns offsets from `first_offset`; `append_time_ms` set = stamp LogAppendTime.
    One header unpack per batch, no per-record work, no copy of the batch bytes (except for
    the LogAppendTime stamp)."""
    buffers: list = []
    metas: list[tuple[int, int, int]] = []
    offset, total, max_ts = first_offset, 0, NO_TIMESTAMP
    for batch in batches:
        view = memoryview(batch)
        if view.format != "B":
            view = view.cast("B")
        size = view.nbytes
        if size < BATCH_HEADER_BYTES:
            raise AssertionError(f"append: {size} bytes is shorter than a batch header")
        # (base_offset, batch_length, epoch, magic, crc, attributes, last_offset_delta,
        #  base_timestamp, max_timestamp, ...): see layout.BATCH_HEADER
        fields = BATCH_HEADER.unpack_from(view)
        if fields[1] + LOG_OVERHEAD_BYTES != size or fields[3] != MAGIC_V2 or fields[6] < 0:
            raise AssertionError(
                f"append: not one whole v2 batch ({size} bytes, header {fields[:7]})"
            )
        if append_time_ms is not None:
            buffers.append(_stamp_log_append_time(view, offset, leader_epoch, append_time_ms))
            batch_max_ts = append_time_ms
        elif leader_epoch is not None:
            buffers.append(OFFSET_AND_EPOCH_FIELDS.pack(offset, fields[1], leader_epoch))
            buffers.append(view[OFFSET_AND_EPOCH_FIELDS.size :])
            batch_max_ts = fields[8]
        else:
            buffers.append(BASE_OFFSET_FIELD.pack(offset))
            buffers.append(view[BASE_OFFSET_FIELD.size :])
            batch_max_ts = fields[8]
        metas.append((offset, size, batch_max_ts))
        if batch_max_ts > max_ts:
            max_ts = batch_max_ts
        total += size
        offset += fields[6] + 1
    return PreparedAppend(buffers, metas, total, first_offset, offset, max_ts)


def _pwritev_fully(fd: int, buffers: list, position: int, total_bytes: int) -> None:
    """Writes `buffers` contiguously at `position`; raises OSError unless all bytes landed."""
    written = 0
    for start in range(0, len(buffers), IOV_BUFFERS_MAX):
        group = buffers[start : start + IOV_BUFFERS_MAX]
        if len(buffers) <= IOV_BUFFERS_MAX:
            group_bytes = total_bytes
        else:
            group_bytes = sum(memoryview(b).nbytes for b in group)
        n = os.pwritev(fd, group, position + written)
        if n != group_bytes:  # short write (rare: signals, quotas): finish it byte-wise
            rest = memoryview(b"".join(group))[n:]
            while rest:
                m = os.pwrite(fd, rest, position + written + n)
                if m <= 0:
                    raise OSError(f"pwrite wrote {m} bytes")
                n, rest = n + m, rest[m:]
        written += group_bytes
    if written != total_bytes:
        raise AssertionError(f"wrote {written} bytes, prepared {total_bytes}")


class ScanResult(NamedTuple):
    """Outcome of `Segment.recover`."""

    bytes_scanned: int
    bytes_truncated: int
    batches: int
    problem: str | None  # why the scan stopped early (None: the whole file was valid)


class Segment:
    """One segment's files and in-memory state (see the module docstring)."""

    def __init__(
        self, directory: Path, base_offset: int, interval_bytes: int, index_entries_max: int,
        names: frozenset[str] | set[str] = frozenset(),
    ):
        self.base_offset = base_offset
        # Plain string paths, built once per segment: a restart opens thousands of segments,
        # and pathlib joins cost more there than the system calls (`log_path` is a Path).
        stem = f"{base_offset:0{SEGMENT_NAME_DIGITS}d}"
        prefix = f"{directory}/{stem}"
        self.log_file = prefix + LOG_SUFFIX
        self._fd = -1  # open only while in the OPEN_FILES LRU; `fd` reopens it on demand
        # The lock that guards every file access of this segment (its PartitionLog's); None
        # while it has no owner, and then the LRU never closes its descriptor.
        self.guard: threading.Lock | None = None
        self.offset_index = OffsetIndex(prefix + INDEX_SUFFIX, index_entries_max,
                                        stem + INDEX_SUFFIX in names)
        self.time_index = TimeIndex(prefix + TIME_INDEX_SUFFIX, index_entries_max,
                                    stem + TIME_INDEX_SUFFIX in names)
        self.txn_index = TxnIndex(prefix + TXN_INDEX_SUFFIX)
        self.builder = IndexBuilder(interval_bytes)
        self.size_bytes = 0
        self.next_offset = base_offset  # exclusive end offset of the data in this segment
        self.created_ms: int | None = None  # roll clock: append time of the first batch
        self.data_dirty = False  # written since the last fsync of the .log
        self.index_dirty = False  # indexes final but not yet fsync'd (set when rolled/closed)
        self.closed = False
        self._read_hints: dict[int, int] = {}
        self._max_ts_position: int | None = None  # first batch holding max_timestamp_ms
        # Batches with a producer id that `recover` saw (None: not scanned since opened):
        # lets the open skip the producer-state replay of a log that has none.
        self.producer_batches_scanned: int | None = None

    # -- opening --------------------------------------------------------------------------------

    @classmethod
    def create(
        cls, directory: Path, base_offset: int, interval_bytes: int, index_entries_max: int
    ) -> Segment:
        seg = cls(directory, base_offset, interval_bytes, index_entries_max)
        seg._fd = os.open(seg.log_file, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        OPEN_FILES.touch(seg)
        try:
            os.unlink(seg.txn_index.file)  # an orphan of a deleted segment: stale
        except FileNotFoundError:
            pass
        seg.data_dirty = True
        return seg

    @classmethod
    def open_existing(
        cls, directory: Path, base_offset: int, interval_bytes: int, index_entries_max: int,
        names: frozenset[str] | set[str] | None = None,
    ) -> Segment:
        """The segment's files as they are; the `.log` is opened on first use (`fd`), so an
        empty segment costs no descriptor. `names`: the directory's listing when the caller
        has it (spares a lookup per index file)."""
        seg = cls(directory, base_offset, interval_bytes, index_entries_max, names or frozenset())
        if names is None or f"{base_offset:0{SEGMENT_NAME_DIGITS}d}{TXN_INDEX_SUFFIX}" in names:
            seg.txn_index.load()
        return seg

    @property
    def log_path(self) -> Path:
        return Path(self.log_file)

    @property
    def fd(self) -> int:
        """The `.log` descriptor, reopened if the LRU closed it (caller holds `guard`).
        Raises OSError (EMFILE, ENFILE) when no descriptor can be had."""
        if self._fd < 0:
            if self.closed:
                raise ValueError(f"{self.log_file}: segment is closed")
            self._fd = os.open(self.log_file, os.O_RDWR | os.O_CLOEXEC)
            OPEN_FILES.touch(self, reopened=True)
        else:
            OPEN_FILES.touch(self)
        return self._fd

    def release_fd(self) -> None:
        """Closes the descriptor of an idle segment (OPEN_FILES holds `guard`)."""
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)

    @property
    def max_timestamp_ms(self) -> int:
        return self.builder.max_timestamp_ms

    def file_bytes(self) -> int:
        """The `.log` file's size (a stat of the path when no descriptor is open yet)."""
        if self._fd < 0 and not self.closed:
            return os.stat(self.log_file).st_size
        return os.fstat(self.fd).st_size

    def load_trusted(self, now_ms: int) -> bool:
        """Loads a segment whose data was fsync'd (below the recovery point or after a clean
        shutdown) without CRC checks: loads the indexes, then walks only the headers after the
        last index entries to find the end offset and largest timestamp. False when anything
        does not add up; the caller then runs `recover`."""
        size = self.file_bytes()
        if size == 0:  # nothing to index: its index files are not read, the next persist
            self.offset_index.replace(array("I"), array("I"))  # empties them
            self.time_index.replace(array("q"), array("I"))
            return True
        try:
            self.offset_index.load()
            self.time_index.load()
        except IndexCorrupt:
            return False
        self.offset_index.truncate_to_position(size)
        last_entry = self.offset_index.last()
        # Time entries are only ever added at offset-entry batches, so none may lie past the
        # last offset entry; and every batch before that entry has max timestamp <= the last
        # time entry's. The walk from the last offset entry therefore sees everything else.
        self.time_index.truncate_to_rel_offset(last_entry[0] + 1 if last_entry else 0)
        last_time = self.time_index.last()
        start = last_entry[1] if last_entry else 0
        try:
            walked = list(self._walk(start, size))
        except CorruptLogError:
            return False
        if last_entry is not None:
            if not walked or walked[0][1].base_offset != self.base_offset + last_entry[0]:
                return False
        if walked and walked[0][1].base_offset < self.base_offset:
            return False
        self.size_bytes = size
        self.next_offset = walked[-1][1].last_offset + 1 if walked else self.base_offset
        self.builder.bytes_since_entry = size - start
        self.builder.last_time_entry_ms = last_time[0] if last_time else NO_TIMESTAMP
        walked_max = max((h.max_timestamp for _, h in walked), default=NO_TIMESTAMP)
        self.builder.max_timestamp_ms = max(self.builder.last_time_entry_ms, walked_max)
        if walked_max > self.builder.last_time_entry_ms:
            self._max_ts_position = next(p for p, h in walked if h.max_timestamp == walked_max)
        self.created_ms = self._first_batch_time(now_ms)
        return True

    def _first_batch_time(self, now_ms: int) -> int | None:
        """After a restart the append time of the first batch is unknown; like Kafka, use the
        first batch's max timestamp (clamped to now), or now when it has none."""
        if self.size_bytes == 0:
            return None
        return _creation_time(read_header(os.pread(self.fd, BATCH_HEADER_BYTES, 0)).max_timestamp,
                              now_ms)

    # -- recovery -------------------------------------------------------------------------------

    def recover(self, expected_offset: int, now_ms: int) -> ScanResult:
        """Validates every batch, truncates at the first bad byte, rebuilds both indexes.
        Reads through a descriptor of its own, closed when done, unless the segment has one
        open: a scan at open reads the file once, so it neither enters nor churns the
        OPEN_FILES LRU (the first append or fetch opens the file as usual)."""
        own = self._fd < 0
        fd = os.open(self.log_file, os.O_RDWR | os.O_CLOEXEC) if own else self._fd
        try:
            size = os.fstat(fd).st_size
            result = self._recover_from(fd, size, expected_offset, now_ms)
        finally:
            if own:
                os.close(fd)
        return result

    def _recover_from(self, fd: int, size: int, expected_offset: int, now_ms: int) -> ScanResult:
        builder = IndexBuilder(self.builder.interval_bytes)
        self._max_ts_position = None
        rels, poss, tss, trels = array("I"), array("I"), array("q"), array("I")
        pos, next_offset, batches, problem = 0, max(expected_offset, self.base_offset), 0, None
        first_max_timestamp, producer_batches = NO_TIMESTAMP, 0
        offsets: list[tuple[int, int]] = []
        times: list[tuple[int, int]] = []
        base_offset = self.base_offset
        for item in self._scan(fd, size, next_offset):
            if isinstance(item, str):
                problem = item
                break
            header = item
            if batches == 0:
                first_max_timestamp = header.max_timestamp
            if header.producer_id >= 0:
                producer_batches += 1
            if header.max_timestamp > builder.max_timestamp_ms:
                self._max_ts_position = pos
            builder.observe(header.base_offset - base_offset, pos, header.size_bytes,
                            header.max_timestamp, offsets, times)
            if offsets:
                for r, p in offsets:
                    rels.append(r)
                    poss.append(p)
                offsets.clear()
            if times:
                for t, r in times:
                    tss.append(t)
                    trels.append(r)
                times.clear()
            pos += header.size_bytes
            next_offset = header.last_offset + 1
            batches += 1
        if pos < size:
            os.ftruncate(fd, pos)
        self.offset_index.replace(rels, poss)
        self.time_index.replace(tss, trels)
        self.builder = builder
        self.size_bytes = pos
        if batches == 0:
            self._max_ts_position = None
        self.next_offset = next_offset if batches else self.base_offset
        # As _first_batch_time, from the header the scan already read
        self.created_ms = None if batches == 0 else _creation_time(first_max_timestamp, now_ms)
        self.data_dirty = self.index_dirty = True
        self.producer_batches_scanned = producer_batches
        self._read_hints.clear()
        return ScanResult(size, size - pos, batches, problem)

    def _scan(self, fd: int, size: int, expected_offset: int) -> Iterator[BatchHeader | str]:
        """Yields each valid batch header in file order, then a string saying why the scan
        stopped if it stopped before the end of the file. A file of up to
        RECOVERY_CHUNK_BYTES (every small log after a restart) is read with one pread."""
        pos, chunk, chunk_pos = 0, b"", 0
        while pos < size:
            rel = pos - chunk_pos
            if rel + BATCH_HEADER_BYTES > len(chunk):
                chunk, chunk_pos, rel = (
                    os.pread(fd, min(RECOVERY_CHUNK_BYTES, size - pos), pos),
                    pos,
                    0,
                )
                if len(chunk) < BATCH_HEADER_BYTES:
                    yield f"torn header at position {pos}"
                    return
            header = read_header(chunk, rel)
            problem = header_problem(header, size - pos) or self._offset_problem(
                header, expected_offset
            )
            if problem is None and rel + header.size_bytes > len(chunk):
                want = max(header.size_bytes, min(RECOVERY_CHUNK_BYTES, size - pos))
                chunk, chunk_pos, rel = os.pread(fd, want, pos), pos, 0
                if len(chunk) < header.size_bytes:
                    problem = "short read"
            if problem is None:
                view = memoryview(chunk)[rel + CRC_START : rel + header.size_bytes]
                if crc32c.crc32c(view) != header.crc:
                    problem = f"CRC mismatch in batch at offset {header.base_offset}"
            if problem is not None:
                yield f"{problem} (position {pos})"
                return
            yield header
            pos += header.size_bytes
            expected_offset = header.last_offset + 1

    def _offset_problem(self, header: BatchHeader, expected_offset: int) -> str | None:
        if header.base_offset < expected_offset:
            return f"offset {header.base_offset} after {expected_offset - 1}: not monotonic"
        if header.last_offset - self.base_offset > REL_OFFSET_MAX:
            return f"offset {header.last_offset} too far from segment base {self.base_offset}"
        return None

    # -- appending ------------------------------------------------------------------------------

    def append(self, prepared: PreparedAppend, now_ms: int) -> None:
        """Writes prepared batches at the end; the caller checked `can_hold` (or rolled)."""
        if prepared.first_offset < self.next_offset:
            raise AssertionError(f"append at {prepared.first_offset} below {self.next_offset}")
        position = self.size_bytes
        if position + prepared.total_bytes > POSITION_MAX:
            raise AssertionError(f"segment {self.base_offset} would exceed {POSITION_MAX} bytes")
        offsets: list[tuple[int, int]] = []
        times: list[tuple[int, int]] = []
        pos, max_ts_position = position, self._max_ts_position
        for base_offset, size_bytes, max_ts in prepared.metas:
            if max_ts > self.builder.max_timestamp_ms:
                max_ts_position = pos
            self.builder.observe(
                base_offset - self.base_offset, pos, size_bytes, max_ts, offsets, times
            )
            pos += size_bytes
        _pwritev_fully(self.fd, prepared.buffers, position, prepared.total_bytes)
        if offsets:
            self.offset_index.append(offsets)
        if times:
            self.time_index.append(times)
        if position == 0:
            self.created_ms = now_ms
        if pos != position + prepared.total_bytes:
            raise AssertionError(f"segment end {pos} != {position} + {prepared.total_bytes}")
        self.size_bytes = pos
        self.next_offset = prepared.next_offset
        self._max_ts_position = max_ts_position
        self.data_dirty = True

    def can_hold(self, prepared: PreparedAppend) -> bool:
        """Whether offsets and positions of `prepared` fit this segment's u32 encodings."""
        last_rel = prepared.next_offset - 1 - self.base_offset
        return last_rel <= REL_OFFSET_MAX and self.size_bytes + prepared.total_bytes <= POSITION_MAX

    # -- reading --------------------------------------------------------------------------------

    def _walk(self, start: int, end: int) -> Iterator[tuple[int, BatchHeader]]:
        """(position, header) of each batch in [start, end); `start` must be a batch boundary."""
        pos, window, window_pos = start, b"", start
        while pos < end:
            rel = pos - window_pos
            if rel + BATCH_HEADER_BYTES > len(window):
                want = max(BATCH_HEADER_BYTES, min(WALK_WINDOW_BYTES, end - pos))
                window, window_pos, rel = os.pread(self.fd, want, pos), pos, 0
                if len(window) < BATCH_HEADER_BYTES:
                    raise CorruptLogError(f"{self.log_path}: torn header at {pos}")
            header = read_header(window, rel)
            problem = header_problem(header, end - pos)
            if problem is not None:
                raise CorruptLogError(f"{self.log_path}: {problem} at position {pos}")
            yield pos, header
            pos += header.size_bytes

    def headers(self, offset: int, end: int) -> Iterator[tuple[int, BatchHeader]]:
        """Batches from the one containing `offset` (last_offset >= offset) up to `end` bytes."""
        start = self.start_position(offset)
        return self._walk(start, end) if start is not None else iter(())

    def start_position(self, offset: int) -> int | None:
        """Position of the first batch whose last offset is >= `offset`, None if none."""
        if offset >= self.next_offset or self.size_bytes == 0:
            return None
        hinted = self._read_hints.get(offset)
        if hinted is not None:
            return hinted
        start = (
            self.offset_index.lookup(offset - self.base_offset) if offset > self.base_offset else 0
        )
        for pos, header in self._walk(start, self.size_bytes):
            if header.last_offset >= offset:
                return pos
        raise CorruptLogError(
            f"{self.log_path}: offset {offset} below {self.next_offset} not found"
        )

    def read(
        self, offset: int, budget_bytes: int, upper_offset: int, at_least_one: bool
    ) -> tuple[bytes, int]:
        """(whole batches, file position where they end): from the batch containing `offset`,
        none with base >= upper_offset, at most budget_bytes unless at_least_one and the first
        batch alone is larger (then that batch). (b"", start) when no batch qualifies.

        One pread in the usual case (issue 19): it covers the data that may be returned and the
        headers that decide where to cut, and the cut is found in that buffer. A walk starts at
        the later of the fetch's batch and the index entries below each cut, so a large read of
        small batches walks about one index interval, not every batch; a read of everything up
        to the segment's end walks nothing. The first batch is read again only when it is
        larger than the buffer (at_least_one past the budget).
        """
        size = self.size_bytes
        if offset >= self.next_offset or size == 0:
            return b"", 0
        # At or below the base the first batch holds `offset` (compacted or not): no walk.
        start = 0 if offset <= self.base_offset else self.start_position(offset)
        if start is None:   # only reachable without batches, checked above
            raise AssertionError(f"{self.log_path}: no batch for offset {offset}")
        rest = size - start
        if budget_bytes >= rest and upper_offset >= self.next_offset:
            data = self._pread(rest, start)   # everything to the end: no cut to find
            self._remember(self.next_offset, size)
            return data, size
        limit = min(rest, max(budget_bytes, 0))   # bytes that may be returned
        data = self._pread(min(rest, max(limit, READ_FLOOR_BYTES if at_least_one
                                         else BATCH_HEADER_BYTES)), start)
        cut, cut_offset, first = self._cut(data, start, limit, upper_offset)
        if cut == 0:
            if not at_least_one or first is None:
                return b"", start
            cut, cut_offset = first   # the first batch alone, past the budget
            if cut > len(data):
                data = self._pread(cut, start)
        if cut_offset is not None:
            self._remember(cut_offset, start + cut)
        return (data if cut == len(data) else data[:cut]), start + cut

    def _remember(self, offset: int, position: int) -> None:
        """Where the next read from `offset` starts (a consumer's next fetch asks for it)."""
        if len(self._read_hints) >= READ_HINTS_MAX:
            self._read_hints.clear()
        self._read_hints[offset] = position

    def _cut(
        self, data: bytes, start: int, limit: int, upper_offset: int
    ) -> tuple[int, int | None, tuple[int, int] | None]:
        """(cut, offset at the cut, first) for `data` read at `start`. The cut is the first
        batch boundary (relative to start) of a batch with base >= upper_offset or ending past
        `limit`, or the end of `data`; the offset there is None when its header lies past the
        buffer. `first` is (size, last offset + 1) of the batch at `start` when the cut is
        there and that batch has a base below upper_offset, else None."""
        size = self.size_bytes
        pos = 0
        # Batches below an index entry at or before a cut pass both tests: walk from there.
        position = self.offset_index.floor_position(start + limit)
        if upper_offset < self.next_offset:
            position = min(position, self.offset_index.lookup(upper_offset - self.base_offset))
        if position > start:
            pos = position - start
        end_offset = None
        length = len(data)
        unpack_from = BATCH_HEADER.unpack_from
        while pos < length:
            if pos + BATCH_HEADER_BYTES > length:
                if start + pos + BATCH_HEADER_BYTES <= size:   # past the buffer: past the limit
                    return pos, end_offset, None
                raise CorruptLogError(f"{self.log_path}: torn header at {start + pos}")
            # (base_offset, batch_length, epoch, magic, crc, attributes, last_offset_delta,
            #  ..., records_count): see layout.BATCH_HEADER; the checks of header_problem
            fields = unpack_from(data, pos)
            batch_bytes = fields[1] + LOG_OVERHEAD_BYTES
            if (fields[3] != MAGIC_V2 or fields[1] < BATCH_LENGTH_MIN or fields[6] < 0
                    or fields[12] < 0 or pos + batch_bytes > size - start):
                problem = header_problem(read_header(data, pos), size - start - pos)
                raise CorruptLogError(f"{self.log_path}: {problem} at position {start + pos}")
            base_offset = fields[0]
            if base_offset >= upper_offset or pos + batch_bytes > limit:
                first = None
                if pos == 0 and base_offset < upper_offset:
                    first = (batch_bytes, base_offset + fields[6] + 1)
                return pos, base_offset, first
            pos += batch_bytes
            end_offset = base_offset + fields[6] + 1
        return pos, (self.next_offset if start + pos == size else end_offset), None

    def _pread(self, length: int, position: int) -> bytes:
        """`length` bytes of the `.log` at `position` (caller holds `guard`). When the LRU of
        open files is full and this segment's descriptor is closed, the read opens the file
        for itself and closes it again, leaving the LRU as it was: a Fetch of more partitions
        than the LRU holds would otherwise close one descriptor per partition it opens."""
        if self._fd < 0 and not self.closed and len(OPEN_FILES) >= OPEN_FILES.files_max:
            fd = os.open(self.log_file, os.O_RDONLY | os.O_CLOEXEC)
            try:
                data = os.pread(fd, length, position)
            finally:
                os.close(fd)
        else:
            data = os.pread(self.fd, length, position)
        if len(data) != length:
            raise CorruptLogError(
                f"{self.log_path}: read {len(data)} of {length} bytes at {position}"
            )
        return data

    def read_bytes(self, start: int, end: int) -> bytes:
        if not 0 <= start <= end <= self.size_bytes:
            raise AssertionError(f"read [{start}, {end}) outside [0, {self.size_bytes})")
        return self._pread(end - start, start)

    def find_timestamp(self, timestamp_ms: int, min_offset: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record with timestamp >= timestamp_ms and offset
        >= min_offset, at batch granularity except for uncompressed CreateTime batches."""
        rel = self.time_index.lookup(timestamp_ms)
        start = self.offset_index.lookup(rel) if rel is not None else 0
        for pos, header in self._walk(start, self.size_bytes):
            if header.last_offset < min_offset or header.max_timestamp < timestamp_ms:
                continue
            return self._refine_timestamp(pos, header, timestamp_ms, min_offset)
        return None

    def _refine_timestamp(self, pos: int, header: BatchHeader, timestamp_ms: int, min_offset: int):
        batch_answer = (max(header.base_offset, min_offset), header.max_timestamp)
        if header.attributes & (ATTR_COMPRESSION_MASK | ATTR_LOG_APPEND_TIME):
            return batch_answer  # compressed: records are opaque here; LogAppendTime: all equal
        found = first_record_at_or_after(
            self.read_bytes(pos, pos + header.size_bytes), header, timestamp_ms, min_offset
        )
        return found or batch_answer

    def max_timestamp(self) -> tuple[int, int] | None:
        """(max timestamp, offset of the first record holding it), None without timestamps.
        Record-exact for uncompressed CreateTime batches; else the batch's base offset
        (LogAppendTime: every record has it) or last offset (compressed, records opaque)."""
        top = self.builder.max_timestamp_ms
        if top < 0 or self.size_bytes == 0:
            return None
        if self._max_ts_position is None:
            self._max_ts_position = self._locate_max_timestamp(top)
        pos = self._max_ts_position
        header = read_header(self.read_bytes(pos, pos + BATCH_HEADER_BYTES))
        if header.attributes & ATTR_LOG_APPEND_TIME:
            return top, header.base_offset
        if header.attributes & ATTR_COMPRESSION_MASK:
            return top, header.last_offset
        found = first_record_at_or_after(
            self.read_bytes(pos, pos + header.size_bytes), header, top, 0
        )
        return top, found[0] if found else header.last_offset

    def _locate_max_timestamp(self, top: int) -> int:
        """After a trusted load the max may predate the last time entry (T_i, O_i): the first
        batch holding T_i lies between the previous entry's batch and O_i's."""
        i = bisect_left(self.time_index.timestamps, top)
        start = 0
        if 0 < i <= len(self.time_index):
            start = self.offset_index.lookup(self.time_index.rel_offsets[i - 1])
        for pos, header in self._walk(start, self.size_bytes):
            if header.max_timestamp == top:
                return pos
        raise CorruptLogError(f"{self.log_path}: no batch holds max timestamp {top}")

    # -- durability and lifetime ----------------------------------------------------------------

    def take_dirty_fds(self) -> list[int]:
        """Duplicated fds of the files that need an fsync (the caller closes them), so that the
        flushing thread never races a close of the originals. The indexes' pending entries are
        written first; if that fails (a full disk) the OSError propagates and nothing is
        marked clean, so no later flush can count unsynced data as durable."""
        fds: list[int] = []
        try:
            if self.index_dirty:
                fds.append(self.offset_index.sync_fd())
                fds.append(self.time_index.sync_fd())
            if self.data_dirty:
                fds.append(os.dup(self.fd))
        except OSError:
            for fd in fds:
                os.close(fd)
            raise
        self.index_dirty = self.data_dirty = False
        txn_fd = self.txn_index.take_dirty_fd()
        if txn_fd is not None:
            fds.append(txn_fd)
        return fds

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            OPEN_FILES.forget(self)
            self.release_fd()
            self.offset_index.close()
            self.time_index.close()
            self.txn_index.close()

    def delete(self) -> None:
        """Closes and unlinks the files; the .log goes first so a crash leaves only orphan
        indexes, which the next open removes."""
        self.close()
        for path in (self.log_file, self.offset_index.file, self.time_index.file,
                     self.txn_index.file):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


def _creation_time(first_max_timestamp: int, now_ms: int) -> int:
    """A segment's creation time after a restart, from its first batch's max timestamp."""
    return now_ms if first_max_timestamp < 0 else min(first_max_timestamp, now_ms)
