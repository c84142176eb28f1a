"""The aborted-transaction index of one segment: `<base_offset>.txnindex`.

Theory of operation
-------------------
A read_committed consumer must drop the records of aborted transactions. The fetch
response tells it which: `AbortedTransactions` = (producer id, first offset) of every
aborted transaction overlapping the fetched range. This index answers that query without
reading the log. It is Kafka's TransactionIndex, with a CRC per entry:

* When an ABORT marker is appended, the partition's producer state names the transaction
  it completed: (producer id, first offset, last offset = the marker's offset, last stable
  offset once it is complete). That entry goes into the index of the segment holding the
  marker, so entries of one segment are in marker order and a segment's index is deleted
  with it (retention, recovery, compaction of an emptied segment).
* A query for [fetch_offset, upper_offset) walks the segments from the one holding
  fetch_offset and collects entries with last_offset >= fetch_offset and
  first_offset < upper_offset. An aborted transaction overlapping the range has its marker
  at or after fetch_offset, hence in that segment or a later one. The walk stops at the
  first entry whose last_stable_offset >= upper_offset: when that transaction completed no
  transaction starting below upper_offset was still open, so every later marker belongs to
  a transaction starting at or after upper_offset (Kafka's `isComplete`).
* The index is derived data. Its entries are written (not fsync'd) right after the marker,
  and fsync'd with the segment's data by the group committer (and when the segment rolls).
  On open, entries past the log end are dropped; the broker then rebuilds every entry from
  its producer-state snapshot onward by replaying the log (broker/state.py), so a crash that
  lost or tore index writes leaves a correct index.

File layout: a sequence of fixed-size entries, big-endian, created only when the first
entry is written (most segments never see an aborted transaction):

    version i16 (1) | producer_id i64 | first_offset i64 | last_offset i64 |
    last_stable_offset i64 | crc32c u32 of the 34 bytes before it

Loading stops at the first entry that is short, of an unknown version, fails its CRC or
is out of order, and truncates the file there (like log recovery: a valid prefix).
Entries are mirrored in memory (four int64 arrays, 32 bytes per entry).
"""

from __future__ import annotations

import logging
import os
import struct
from array import array
from bisect import bisect_left
from pathlib import Path
from typing import NamedTuple

import crc32c

from onceflow.storage.layout import write_fully

logger = logging.getLogger(__name__)

TXN_INDEX_SUFFIX = ".txnindex"
TXN_INDEX_VERSION = 1  # Kafka's entries are version 0 without a CRC; ours carry one
_FIELDS = struct.Struct(">hqqqq")  # version, producer id, first, last, last stable offset
_CRC = struct.Struct(">I")
ENTRY_BYTES = _FIELDS.size + _CRC.size  # 38


class AbortedTxn(NamedTuple):
    """One aborted transaction; offsets inclusive (last_offset is its ABORT marker)."""

    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int  # the partition's LSO once this transaction was complete


def encode_entry(txn: AbortedTxn) -> bytes:
    fields = _FIELDS.pack(TXN_INDEX_VERSION, *txn)
    return fields + _CRC.pack(crc32c.crc32c(fields))


def decode_entries(data: bytes) -> tuple[list[AbortedTxn], str | None]:
    """The valid prefix of an index file's bytes, and why it stopped early (None: all valid)."""
    entries: list[AbortedTxn] = []
    for position in range(0, len(data), ENTRY_BYTES):
        chunk = data[position:position + ENTRY_BYTES]
        if len(chunk) < ENTRY_BYTES:
            return entries, f"torn entry at byte {position}"
        fields = chunk[:_FIELDS.size]
        (crc,) = _CRC.unpack_from(chunk, _FIELDS.size)
        if crc32c.crc32c(fields) != crc:
            return entries, f"CRC mismatch at byte {position}"
        version, *values = _FIELDS.unpack(fields)
        txn = AbortedTxn(*values)
        problem = _entry_problem(version, txn, entries[-1] if entries else None)
        if problem is not None:
            return entries, f"{problem} at byte {position}"
        entries.append(txn)
    return entries, None


def _entry_problem(version: int, txn: AbortedTxn, previous: AbortedTxn | None) -> str | None:
    if version != TXN_INDEX_VERSION:
        return f"unknown entry version {version}"
    if not 0 <= txn.first_offset <= txn.last_offset:
        return f"bad offsets {txn.first_offset}..{txn.last_offset}"
    if previous is not None and txn.last_offset <= previous.last_offset:
        return f"marker offset {txn.last_offset} not after {previous.last_offset}"
    return None


class TxnIndex:
    """The aborted transactions whose ABORT marker lies in one segment. Not thread-safe:
    `PartitionLog` serialises access with its lock."""

    def __init__(self, path: str | Path) -> None:
        self.file = os.fspath(path)  # a str: segments build it without pathlib (segment.py)
        self.fd = -1  # opened when the file exists or the first entry is written
        self.dirty = False  # written since the last fsync
        # The four columns; the empty tuple until the first entry (most segments never get
        # one, and a restart creates thousands of these: no arrays for the collector to walk).
        self._producer_ids: array | tuple = ()
        self._first_offsets: array | tuple = ()
        self._last_offsets: array | tuple = ()
        self._stable_offsets: array | tuple = ()

    def __len__(self) -> int:
        return len(self._last_offsets)

    @property
    def path(self) -> Path:
        return Path(self.file)

    def entries(self) -> list[AbortedTxn]:
        return [AbortedTxn(*fields) for fields in zip(
            self._producer_ids, self._first_offsets, self._last_offsets, self._stable_offsets,
            strict=True)]

    # -- lifetime ---------------------------------------------------------------------------

    def load(self) -> None:
        """Read the file if it exists, keeping its valid prefix (the rest is truncated)."""
        try:
            self.fd = os.open(self.file, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        size = os.fstat(self.fd).st_size
        data = os.pread(self.fd, size, 0)
        entries, problem = decode_entries(data)
        if problem is not None:
            logger.warning("%s: %s; keeping %d entries", self.file, problem, len(entries))
            os.ftruncate(self.fd, len(entries) * ENTRY_BYTES)
            self.dirty = True
        self._replace(entries)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def delete(self) -> None:
        self.close()
        try:
            os.unlink(self.file)
        except FileNotFoundError:
            pass

    # -- writing ----------------------------------------------------------------------------

    def append(self, txn: AbortedTxn) -> None:
        """Add one entry (no fsync). Raises OSError; the in-memory entries change only
        once the bytes are written."""
        previous = self._last_offsets[-1] if self._last_offsets else None
        assert previous is None or txn.last_offset > previous, (
            f"{os.path.basename(self.file)}: aborted transaction at {txn.last_offset} "
            f"after {previous}")
        if self.fd < 0:
            self.fd = os.open(self.file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        write_fully(self.fd, encode_entry(txn), len(self) * ENTRY_BYTES)
        self.dirty = True
        self._add(txn)

    def truncate_from(self, offset: int) -> int:
        """Drop the entries whose marker is at or after `offset`; returns how many went."""
        keep = bisect_left(self._last_offsets, offset)
        dropped = len(self) - keep
        if dropped:
            self._replace(self.entries()[:keep])
            os.ftruncate(self.fd, keep * ENTRY_BYTES)
            self.dirty = True
        return dropped

    def take_dirty_fd(self) -> int | None:
        """A duplicated fd to fsync (the caller closes it), or None when nothing changed."""
        if not self.dirty or self.fd < 0:
            return None
        self.dirty = False
        return os.dup(self.fd)

    def sync(self) -> None:
        """fsync now if anything was written since the last fsync."""
        if self.dirty and self.fd >= 0:
            os.fsync(self.fd)
            self.dirty = False

    # -- reading ----------------------------------------------------------------------------

    def collect(self, fetch_offset: int, upper_offset: int,
                found: list[AbortedTxn]) -> bool:
        """Append to `found` the entries overlapping [fetch_offset, upper_offset); True when
        no later segment can hold another (see the module docstring)."""
        for i in range(bisect_left(self._last_offsets, fetch_offset), len(self)):
            if self._first_offsets[i] < upper_offset:
                found.append(AbortedTxn(self._producer_ids[i], self._first_offsets[i],
                                        self._last_offsets[i], self._stable_offsets[i]))
            if self._stable_offsets[i] >= upper_offset:
                return True
        return False

    # -- internals --------------------------------------------------------------------------

    def _add(self, txn: AbortedTxn) -> None:
        if not self._last_offsets:
            self._producer_ids, self._first_offsets = array("q"), array("q")
            self._last_offsets, self._stable_offsets = array("q"), array("q")
        self._producer_ids.append(txn.producer_id)
        self._first_offsets.append(txn.first_offset)
        self._last_offsets.append(txn.last_offset)
        self._stable_offsets.append(txn.last_stable_offset)

    def _replace(self, entries: list[AbortedTxn]) -> None:
        self._producer_ids = self._first_offsets = self._last_offsets = ()
        self._stable_offsets = ()
        for txn in entries:
            self._add(txn)


__all__ = ["ENTRY_BYTES", "TXN_INDEX_SUFFIX", "AbortedTxn", "TxnIndex", "decode_entries",
           "encode_entry"]
