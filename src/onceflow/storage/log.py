"""`PartitionLog`: one partition's segmented log - append, read, flush, retention, recovery.

Theory of operation
-------------------
The log is a list of segments with increasing base offsets; the last one is *active* and is
the only one appended to. Offsets are assigned at append: each batch's base offset is
rewritten, nothing else about it changes (except the optional LogAppendTime stamp and leader
epoch). `log_end_offset` (LEO, exclusive) is the active segment's end offset.

Durability. `append` writes with `pwritev` and does not fsync. `flush` (called by the group
committer's thread) fsyncs every file written since the previous flush and then advances the
*recovery point*: every offset below it is on disk. The recovery point is checkpointed to
`partition.state` every `RECOVERY_CHECKPOINT_BYTES` of flushed data and at close; it is only a
hint of where recovery may start, so a stale checkpoint costs a longer scan, never data.
Index files and the directory are fsync'd when a segment is rolled (by the next flush), so all
segments wholly below the recovery point have durable data *and* indexes.

Recovery (`open`). After `close()` the state file says "clean shutdown" and every segment is
loaded trusting its indexes (only the headers after the last index entry are walked); the
store believes that flag only together with its clean recovery checkpoint, whose entry it
passes as `hint` (checkpoint.py). After an unclean stop, every segment from the one holding
the recovery point onwards is re-validated batch by batch (length bounds, magic 2, CRC-32C,
monotonic offsets); the log is truncated at the first bad byte and later segments are
deleted, so the log is always a valid prefix. Re-validated segments are not fsync'd at open:
the recovery point stays at the first of them until the next flush. The loading itself
lives in recovery.py.

Aborted transactions. Each segment may have a `.txnindex` (storage/txn_index.py): the
aborted transactions whose ABORT marker it holds, for read_committed fetches. The broker
adds entries as markers are appended (`append_aborted_txn`) and queries them with
`aborted_transactions`; `open` drops entries past the log end, and the broker rebuilds the
rest from its producer-state snapshot onward (`truncate_txn_index`, then replay).

Threads. The broker calls append/read/retention from its event-loop thread and `flush` from
the group-commit thread. `_lock` guards all in-memory state and every file access except the
fsyncs themselves: `flush` takes the lock only to snapshot (duplicate the fds of dirty files,
note the LEO) and to publish the new recovery point, and fsyncs outside it, so appends and
reads proceed during an fsync. Reads hold the lock, so they see only whole batches below the
published end of each segment. `_flush_lock` (always taken before `_lock`) serialises flushes
and state-file writes, so a flush never returns before an overlapping one's fsyncs finished.
A failed write or fsync marks the log failed: appends and flushes then raise LogFailedError.
Mutations (append, retention, delete_records_before, close) must all come from one thread.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import threading
from bisect import bisect_right
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from onceflow.storage.config import LogConfig
from onceflow.storage.layout import (
    PARTITION_STATE_FILE,
    BatchHeader,
    CorruptFileError,
    LogClosedError,
    LogFailedError,
    OffsetOutOfRange,
    PartitionState,
    read_partition_state,
    write_partition_state,
)
from onceflow.storage.recovery import (
    RecoveryReport,
    index_entries_max,
    create_log_files,
    list_log_dir,
    load_segments,
    take_dirty_fds,
)
from onceflow.storage.rewrite import install_segment, stage_segment
from onceflow.storage.segment import Segment, prepare_append
from onceflow.storage.txn_index import AbortedTxn

logger = logging.getLogger(__name__)

# Flushed bytes between checkpoints of the recovery point: bounds the re-validation after a
# crash to about this much beyond one segment, at the cost of one small atomic file write.
RECOVERY_CHECKPOINT_BYTES = 64 * 1024 * 1024
# Most bytes one read returns (beyond a single oversized first batch): max_bytes comes from a
# peer's fetch request; this keeps one fetch from pulling a whole segment into memory. Above
# Kafka's broker-side fetch.max.bytes default (55 MiB), so it never binds for sane clients.
READ_BYTES_MAX = 64 * 1024 * 1024



class SegmentInfo(NamedTuple):
    base_offset: int
    next_offset: int          # exclusive end of its records
    size_bytes: int
    max_timestamp_ms: int     # the newest record's timestamp (-1: none yet)

class RetentionResult(NamedTuple):
    segments_deleted: int
    bytes_deleted: int
    log_start_offset: int  # after the deletion


class AppendInfo(NamedTuple):
    first_offset: int
    last_offset: int  # inclusive
    log_append_time_ms: int  # the stamp written for LogAppendTime, else -1 (as in Produce)
    end_position: int  # LEO (exclusive) right after this append: what flush_to() must reach


class PartitionLog:
    """A partition's log (see the module docstring). Build with `PartitionLog.open`."""

    def __init__(
        self,
        directory: Path,
        config: LogConfig,
        segments: list[Segment],
        log_start_offset: int,
        report: RecoveryReport,
    ) -> None:
        self.directory = directory
        self.config = config
        self.recovery = report
        self._segments = segments
        self._bases = [s.base_offset for s in segments]
        self._log_start = log_start_offset
        self._recovery_point = segments[-1].next_offset
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        for seg in segments:
            seg.guard = self._lock  # lets the open-files LRU close idle segments' fds
        self._dir_dirty = False
        self._appended_bytes = 0  # total bytes appended since open
        self._checkpointed_bytes = 0  # _appended_bytes covered by the last state checkpoint
        self._failed: BaseException | None = None
        self._closing = False
        self._closed = False
        self._roll_jitter_ms = roll_jitter_ms(config)  # this active segment's segment.jitter.ms
        # The directory's names as `open` listed them, for the producer-state load that
        # follows the open (no second listing); None otherwise. Stale once the log runs.
        self.opened_listing: list[str] | None = None
        self._closed_cleanly = False
        # From this offset on, the log as opened was re-validated and holds no batch with a
        # producer id (None: unknown); `needs_producer_replay` answers from it.
        self._no_producer_batches_from: int | None = None
        self._opened_end_offset = segments[-1].next_offset

    # -- properties -----------------------------------------------------------------------------

    @property
    def log_start_offset(self) -> int:
        return self._log_start

    @property
    def log_end_offset(self) -> int:
        return self._segments[-1].next_offset

    @property
    def recovery_point_offset(self) -> int:
        """Every offset below this is fsync'd (the "flushed offset")."""
        return self._recovery_point

    @property
    def size_bytes(self) -> int:
        return sum(s.size_bytes for s in self._segments)

    @property
    def segment_base_offsets(self) -> list[int]:
        return list(self._bases)

    def segment_infos(self) -> list[SegmentInfo]:
        """Each segment's offsets, size and newest timestamp, oldest first (for people)."""
        return [SegmentInfo(s.base_offset, s.next_offset, s.size_bytes, s.max_timestamp_ms)
                for s in self._segments]

    def update_config(self, config: LogConfig) -> None:
        """Applies altered topic configs (rolling, retention and stamping use them next time)."""
        self.config = config

    # -- append ---------------------------------------------------------------------------------

    def append(
        self,
        batches: list,
        now_ms: int,
        *,
        log_append_time: bool | None = None,
        partition_leader_epoch: int | None = None,
    ) -> AppendInfo:
        """Appends validated v2 batches, assigning offsets from the LEO; no fsync.
        `log_append_time` (default: the topic's message.timestamp.type) stamps each batch:
        max_timestamp = now_ms, attribute bit 3 set, CRC recomputed. `partition_leader_epoch`,
        when given, is written into each header (outside the CRC)."""
        if not batches:
            raise ValueError("append of no batches")
        stamp = self.config.log_append_time if log_append_time is None else log_append_time
        with self._lock:
            self._check_writable()
            leo = self._segments[-1].next_offset
            prepared = prepare_append(
                batches, leo, now_ms if stamp else None, partition_leader_epoch
            )
            try:
                if self._should_roll(prepared, now_ms):
                    self._roll()
                self._segments[-1].append(prepared, now_ms)
            except OSError as exc:
                self._fail(exc, "append")
                raise LogFailedError(f"{self.directory.name}: append failed: {exc}") from exc
            self._appended_bytes += prepared.total_bytes
            end = self._segments[-1].next_offset
        if end != prepared.next_offset:
            raise AssertionError(f"LEO {end} after append, prepared {prepared.next_offset}")
        return AppendInfo(leo, end - 1, now_ms if stamp else -1, end)

    def _should_roll(self, prepared, now_ms: int) -> bool:
        active, config = self._segments[-1], self.config
        if active.size_bytes == 0:
            return False
        return (
            active.size_bytes + prepared.total_bytes > config.segment_bytes
            or (active.created_ms is not None
                and now_ms - active.created_ms >= config.segment_ms - self._roll_jitter_ms)
            or active.offset_index.is_full
            or active.time_index.is_full
            or not active.can_hold(prepared)
        )

    def _roll(self) -> None:
        """Starts a new active segment at the LEO. The old one's indexes are final: the next
        flush fsyncs them, and the directory, which gained a file."""
        old = self._segments[-1]
        old.index_dirty = True
        # The broker snapshots producer state at the new segment's base and trusts the
        # aborted-transaction entries below a snapshot: make them durable first (rare).
        old.txn_index.sync()
        config = self.config
        new = Segment.create(
            self.directory, old.next_offset, config.index_interval_bytes, index_entries_max(config)
        )
        new.guard = self._lock
        self._segments = self._segments + [new]  # copy-on-write: iterators keep their snapshot
        self._bases = self._bases + [new.base_offset]
        self._dir_dirty = True
        self._roll_jitter_ms = roll_jitter_ms(config)

    def _check_writable(self) -> None:
        if self._closed or self._closing:
            raise LogClosedError(f"{self.directory.name}: closed")
        if self._failed is not None:
            raise LogFailedError(f"{self.directory.name}: failed earlier: {self._failed}")

    def _fail(self, exc: BaseException, what: str) -> None:
        logger.critical("%s: %s failed, log is now failed: %s", self.directory, what, exc)
        self._failed = exc

    # -- read -----------------------------------------------------------------------------------

    def read(self, fetch_offset: int, max_bytes: int, upper_offset: int) -> bytes:
        """Whole batches from the one containing fetch_offset; none with base offset >=
        upper_offset; at most max_bytes except that the first batch is always returned whole
        (KIP-74). b"" at the end, and b"" when fetch_offset >= upper_offset (even if a batch
        starting below upper_offset holds fetch_offset). May span segments.
        Raises OffsetOutOfRange outside [log_start, LEO]."""
        with self._lock:
            if self._closed:
                raise LogClosedError(f"{self.directory.name}: closed")
            segments = self._segments
            leo = segments[-1].next_offset
            if not self._log_start <= fetch_offset <= leo:
                raise OffsetOutOfRange(f"offset {fetch_offset} outside [{self._log_start}, {leo}]")
            upper = min(upper_offset, leo)
            chunks: list[bytes] = []
            budget, offset = min(max_bytes, READ_BYTES_MAX), fetch_offset
            i = max(bisect_right(self._bases, offset) - 1, 0)
            while i < len(segments) and offset < upper:
                seg = segments[i]
                if offset < seg.next_offset:
                    data, end = seg.read(offset, budget, upper, not chunks)
                    if not data:
                        break
                    chunks.append(data)
                    budget -= len(data)
                    if end < seg.size_bytes or budget <= 0:
                        break
                i += 1
                offset = segments[i].base_offset if i < len(segments) else leo
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record with timestamp >= timestamp_ms at or after
        the log start, None if there is none. Exact for uncompressed CreateTime batches and for
        LogAppendTime; for compressed CreateTime batches the answer is the batch's first offset
        and max timestamp (records are not decompressed here)."""
        with self._lock:
            if self._closed:
                raise LogClosedError(f"{self.directory.name}: closed")
            for seg in self._segments:
                if seg.max_timestamp_ms >= timestamp_ms and seg.next_offset > self._log_start:
                    found = seg.find_timestamp(timestamp_ms, self._log_start)
                    if found is not None:
                        return found
        return None

    def max_timestamp(self) -> tuple[int, int] | None:
        """(largest timestamp, offset of the first record holding it) over every segment, as
        Kafka answers ListOffsets MAX_TIMESTAMP; None if no batch has a timestamp."""
        with self._lock:
            if self._closed:
                raise LogClosedError(f"{self.directory.name}: closed")
            best = max(self._segments, key=lambda s: s.max_timestamp_ms)  # first on ties
            return best.max_timestamp()

    def batches_from(self, offset: int) -> Iterator[BatchHeader]:
        """Headers of the batches from the one containing `offset` (or the log start, if later)
        to the LEO as of this call - to replay producer state. Reads happen under the lock, a
        window at a time; consume it on the thread that mutates the log."""
        with self._lock:
            segments, leo = self._segments, self._segments[-1].next_offset
            ends = [s.size_bytes for s in segments]
            offset = max(offset, self._log_start)
        i = max(bisect_right([s.base_offset for s in segments], offset) - 1, 0)
        for seg, end in zip(segments[i:], ends[i:], strict=True):
            walk: Iterator | None = None
            while True:
                with self._lock:
                    if seg.closed:
                        raise LogClosedError(f"{seg.log_path.name} was deleted during replay")
                    walk = walk or seg.headers(offset, end)
                    item = next(walk, None)
                if item is None or item[1].base_offset >= leo:
                    break
                yield item[1]

    # -- aborted transactions (issue 5: read_committed) -----------------------------------------

    def append_aborted_txn(self, txn: AbortedTxn) -> None:
        """Record an aborted transaction in the index of the segment holding its ABORT marker
        (`txn.last_offset`, already appended); no fsync (the next flush covers it)."""
        with self._lock:
            self._check_writable()
            if not self._log_start <= txn.last_offset < self._segments[-1].next_offset:
                raise AssertionError(f"{self.directory.name}: marker {txn.last_offset} not in log")
            seg = self._segments[bisect_right(self._bases, txn.last_offset) - 1]
            try:
                seg.txn_index.append(txn)
            except OSError as exc:
                self._fail(exc, "transaction index append")
                raise LogFailedError(f"{self.directory.name}: txn index write: {exc}") from exc

    def aborted_transactions(self, fetch_offset: int, upper_offset: int) -> list[AbortedTxn]:
        """Aborted transactions overlapping [fetch_offset, upper_offset): last offset (the
        marker) >= fetch_offset and first offset < upper_offset, in marker order."""
        found: list[AbortedTxn] = []
        with self._lock:
            if self._closed:
                raise LogClosedError(f"{self.directory.name}: closed")
            start = max(bisect_right(self._bases, fetch_offset) - 1, 0)
            for seg in self._segments[start:]:
                if seg.txn_index.collect(fetch_offset, upper_offset, found):
                    break
        return found

    def truncate_txn_index(self, offset: int) -> int:
        """Forget aborted transactions whose marker is at or after `offset` (before they are
        rebuilt by replaying the log from there); returns how many went."""
        with self._lock:
            self._check_writable()
            start = max(bisect_right(self._bases, offset) - 1, 0)
            dropped = 0
            try:
                for seg in self._segments[start:]:
                    if len(seg.txn_index):  # most segments never saw an aborted transaction
                        dropped += seg.txn_index.truncate_from(offset)
            except OSError as exc:
                self._fail(exc, "transaction index truncation")
                raise LogFailedError(f"{self.directory.name}: txn index write: {exc}") from exc
            return dropped

    # -- durability -----------------------------------------------------------------------------

    def flush(self) -> None:
        """fsyncs everything appended so far, then advances the recovery point. Safe to call
        from another thread than append's. Raises LogFailedError if an fsync fails."""
        with self._flush_lock:
            self._flush_locked()

    def flush_to(self, end_position: int) -> None:
        """Flushes unless offsets below `end_position` (an AppendInfo's) are already durable."""
        if self._recovery_point < end_position:
            self.flush()

    def checkpoint(self) -> None:
        """Persists the current recovery point now (the broker may call this periodically,
        like Kafka's log.flush.offset.checkpoint.interval.ms); flush does it every
        RECOVERY_CHECKPOINT_BYTES on its own."""
        with self._flush_lock:
            if not self._closed:
                self._write_state(clean=False)

    def _flush_locked(self) -> None:
        with self._lock:
            if self._closed:
                return
            if self._failed is not None:
                raise LogFailedError(f"{self.directory.name}: failed earlier: {self._failed}")
            target, appended = self._segments[-1].next_offset, self._appended_bytes
            try:
                fds = take_dirty_fds(self._segments, self.directory if self._dir_dirty else None)
            except OSError as exc:  # writing an index's pending entries (a full disk)
                self._fail(exc, "index write")
                raise LogFailedError(f"{self.directory.name}: index write failed: {exc}") \
                    from exc
            self._dir_dirty = False
        try:
            for fd in fds:
                os.fsync(fd)
        except OSError as exc:
            with self._lock:
                self._fail(exc, "fsync")
            raise LogFailedError(f"{self.directory.name}: fsync failed: {exc}") from exc
        finally:
            for fd in fds:
                os.close(fd)
        with self._lock:
            self._recovery_point = max(self._recovery_point, target)
        if appended - self._checkpointed_bytes >= RECOVERY_CHECKPOINT_BYTES:
            self._write_state(clean=False)
            self._checkpointed_bytes = appended

    def needs_producer_replay(self, offset: int) -> bool:
        """Whether the batches from `offset` may carry producer state: False only when the
        open re-validated all of them, found no producer id, and nothing was appended."""
        free_from = self._no_producer_batches_from
        return (free_from is None or offset < free_from
                or self.log_end_offset != self._opened_end_offset)

    def checkpoint_state(self) -> PartitionState:
        """Log start, recovery point, end and active segment bytes now, for the recovery
        checkpoint; clean only once `close` flushed everything and wrote its state."""
        return self._state(clean=self._closed_cleanly)

    def _state(self, clean: bool) -> PartitionState:
        with self._lock:
            active = self._segments[-1]
            return PartitionState(
                self._log_start, self._recovery_point, clean, active.next_offset, active.size_bytes
            )

    def _write_state(self, clean: bool, fsync: bool = True) -> None:
        """Persists log start and recovery point (caller holds _flush_lock)."""
        state = self._state(clean)
        try:
            write_partition_state(self.directory, state, fsync)
        except OSError as exc:
            with self._lock:
                self._fail(exc, "state checkpoint")
            raise LogFailedError(f"{self.directory.name}: state write failed: {exc}") from exc

    # -- retention ------------------------------------------------------------------------------

    def delete_records_before(self, offset: int) -> int:
        """Moves the log start to `offset` (DeleteRecords) and deletes the segments wholly
        below it; returns the new log start offset. Durable when it returns."""
        with self._lock:
            self._check_writable()
            leo = self._segments[-1].next_offset
            if offset > leo or offset < 0:
                raise OffsetOutOfRange(f"offset {offset} outside [0, {leo}]")
        self._delete_prefix(offset)
        return self._log_start

    def enforce_retention(self, now_ms: int, high_watermark: int | None = None) -> RetentionResult:
        """Deletes the oldest closed segments that are wholly below the log start, or (with
        cleanup.policy delete) past retention.ms by their largest timestamp or beyond
        retention.bytes, and moves the log start to the first kept segment - never past
        `high_watermark` (default: the LEO). The active segment is never deleted (Kafka
        rolls an expired one first; here the next append rolls it by segment.ms).

        Safe from another thread than append's: the deletion itself recomputes the victims
        under the locks (see `_delete_prefix`), which DeleteRecords shares."""
        with self._lock:
            self._check_writable()
            config, segments = self.config, self._segments
            new_start = self._log_start
            if config.deletes:
                count = max(
                    _expired_prefix(segments, config.retention_ms, now_ms),
                    _oversize_prefix(segments, config.retention_bytes),
                )
                if count > 0:
                    new_start = max(new_start, segments[count].base_offset)
            if high_watermark is not None:
                new_start = min(new_start, max(high_watermark, self._log_start))
        return self._delete_prefix(new_start)

    def _delete_prefix(self, new_log_start: int) -> RetentionResult:
        """Moves the log start to `new_log_start` (never backwards) and deletes the segments
        wholly below it (their successor starts at or below it). Persists the new log start
        first, then deletes: a crash in between leaves segments below the log start, which
        the next open deletes. The victims are computed here, under both locks, so that
        retention (on a worker thread) and DeleteRecords (on the loop) never race."""
        with self._flush_lock:
            with self._lock:
                self._check_writable()
                start = max(self._log_start, new_log_start)
                count = bisect_right(self._bases, start) - 1
                if start == self._log_start and count <= 0:
                    return RetentionResult(0, 0, self._log_start)
                if count >= len(self._segments):
                    raise AssertionError("retention must never delete the active segment")
                victims = self._segments[:max(count, 0)]
                self._segments = self._segments[len(victims):]
                self._bases = self._bases[len(victims):]
                self._log_start = start
            self._write_state(clean=False)
            with self._lock:
                for seg in victims:
                    seg.delete()
                if victims:
                    self._dir_dirty = True
        deleted_bytes = sum(seg.size_bytes for seg in victims)
        if victims:
            logger.info("%s: deleted %d segments (%d bytes) below log start %d",
                        self.directory.name, len(victims), deleted_bytes, start)
        return RetentionResult(len(victims), deleted_bytes, start)

    # -- compaction (issue 4: __consumer_offsets) -----------------------------------------------

    def replace_segment(self, base_offset: int, batches: list, now_ms: int,
                        aborted: list[AbortedTxn] | None = None) -> int:
        """Compaction: the closed segment starting at `base_offset` keeps only `batches` -
        whole v2 batches that keep their offsets (gaps allowed), in the segment's offset
        range, in order. With no batches a segment other than the first is deleted. Writes
        and fsyncs the new files on the calling thread without holding the log's locks
        (appends, reads and flushes go on meanwhile), then swaps them in under the locks;
        crash-safe, see storage/rewrite.py. `aborted`, when given, replaces the segment's
        aborted-transaction index (the cleaner drops entries of removed ABORT markers).
        Returns the segment's new size in bytes. One replacer per log at a time (the
        staging directory is shared)."""
        with self._lock:
            self._check_writable()
            index = self._closed_segment_index(base_offset)
            upper = self._segments[index + 1].base_offset
            delete = not batches and index > 0
        if delete:
            with self._flush_lock, self._lock:
                self._check_writable()
                index = self._closed_segment_index(base_offset)
                victim = self._segments[index]
                self._segments = self._segments[:index] + self._segments[index + 1:]
                self._bases = self._bases[:index] + self._bases[index + 1:]
                victim.delete()
                self._dir_dirty = True
                return 0
        config = self.config
        staging = stage_segment(self.directory, base_offset, upper, batches,
                                config.index_interval_bytes, index_entries_max(config), now_ms,
                                aborted)
        return self.install_staged(base_offset, staging, False, aborted is not None, now_ms)

    def install_staged(self, base_offset: int, staging: Path, empty: bool,
                       replace_txn_index: bool, now_ms: int) -> int:
        """The second half of `replace_segment`, under the locks: swaps in the segment
        `stage_segment` wrote to `staging` for the closed segment at `base_offset`; an
        `empty` one deletes the segment instead unless it is the first. For a staging done
        elsewhere (the log cleaner's child process). Returns the segment's new size."""
        config = self.config
        with self._flush_lock, self._lock:
            self._check_writable()
            index = self._closed_segment_index(base_offset)  # retention may have moved it
            old = self._segments[index]
            if empty and index > 0:
                self._segments = self._segments[:index] + self._segments[index + 1:]
                self._bases = self._bases[:index] + self._bases[index + 1:]
                old.delete()
                self._dir_dirty = True
                shutil.rmtree(staging, ignore_errors=True)
                return 0
            # Entries the old segment has not written yet would land in the installed
            # files when it closes below: write them now, before the rename replaces them.
            old.offset_index.persist()
            old.time_index.persist()
            install_segment(self.directory, staging, base_offset, replace_txn_index)
            new = Segment.open_existing(self.directory, base_offset,
                                        config.index_interval_bytes, index_entries_max(config))
            if not new.load_trusted(now_ms):
                raise AssertionError(f"{new.log_path}: the rewritten segment does not load")
            new.guard = self._lock
            self._segments = self._segments[:index] + [new] + self._segments[index + 1:]
            old.close()
            return new.size_bytes

    def _closed_segment_index(self, base_offset: int) -> int:
        index = bisect_right(self._bases, base_offset) - 1
        if index < 0 or self._bases[index] != base_offset or index == len(self._bases) - 1:
            raise ValueError(f"{self.directory.name}: no closed segment at {base_offset}")
        return index

    # -- lifetime -------------------------------------------------------------------------------

    def close(self, state_file: bool = True) -> None:
        """Flushes everything and writes the clean-shutdown state, so the next open skips the
        scan. A failed log is closed without the clean flag (it will be recovered).
        `state_file=False` (Store.close): the clean state goes only into the store's recovery
        checkpoint (`checkpoint_state`), the one place a store believes a clean flag; the
        state file keeps the log start it was last written with (every move of the log start
        writes it durably), so skipping it changes nothing a restart relies on and saves two
        fsyncs per log (see the "Shutdown" section of docs/logs.md)."""
        with self._flush_lock:
            with self._lock:
                if self._closed:
                    return
                self._closing = True
                self._segments[-1].index_dirty = True
                failed = self._failed is not None
            try:
                if not failed:
                    self._flush_locked()
                    if state_file:
                        self._write_state(clean=True)
                    self._closed_cleanly = True
            finally:
                with self._lock:
                    self._closed = True
                    for seg in self._segments:
                        seg.close()

    def write_closed_state(self) -> None:
        """The clean state file that `close(state_file=False)` left out: Store.close writes
        it when its recovery checkpoint could not be written, so that the next start still
        re-validates no more than each log's last segment."""
        with self._flush_lock:
            if self._closed_cleanly:
                self._write_state(clean=True)

    def discard(self) -> None:
        """Closes without flushing (the partition is being deleted)."""
        with self._flush_lock, self._lock:
            self._closed = True
            for seg in self._segments:
                seg.close()

    @classmethod
    def open(cls, directory: Path, config: LogConfig, now_ms: int,
             hint: PartitionState | None = None, trust_state_clean: bool = True,
             ) -> PartitionLog:
        """Opens (creating if needed) and recovers the log in `directory`.

        `hint`: the log's entry in the data directory's recovery checkpoint (checkpoint.py):
        when it says clean it is the whole state (`partition.state` is not read), else its
        recovery point counts when newer than the state file's. `trust_state_clean=False`:
        a clean flag in `partition.state` is ignored (the store passes it: only its clean
        checkpoint makes a log clean, a state file's flag may be left from an earlier stop)."""
        names = list_log_dir(directory)  # the only listing: segments, snapshots, leftovers
        on_disk = prior = None
        if hint is not None and hint.clean_shutdown and names is not None:
            # written by close() just before the checkpoint: the file says the same
            on_disk = prior = hint
        elif names is not None and PARTITION_STATE_FILE in names:
            try:
                on_disk = prior = read_partition_state(directory)
            except CorruptFileError:
                pass  # load_segments reads it again, logs it and recovers everything
            if prior is not None and prior.clean_shutdown and not trust_state_clean:
                prior = prior._replace(clean_shutdown=False)
            if (prior is not None and not prior.clean_shutdown and hint is not None
                    and hint.recovery_point_offset > prior.recovery_point_offset):
                prior = prior._replace(recovery_point_offset=hint.recovery_point_offset)
        segments, log_start, report = load_segments(directory, config, now_ms, prior, names)
        log = cls(directory, config, segments, log_start, report)
        log.opened_listing = names
        log._no_producer_batches_from = _scanned_without_producer_batches(segments)
        if report.first_scanned is not None:  # re-validated, not yet fsync'd: see recovery.py
            log._recovery_point = min(log._recovery_point, report.first_scanned)
        log.truncate_txn_index(log.log_end_offset)  # entries of a truncated tail
        with log._flush_lock:
            # From here on, a crash means an unclean stop. Only a state file whose clean flag
            # would be believed must be durably overwritten before appends; one that is not
            # believed, with the same log start and recovery point (an idle log after kill
            # -9, one whose tail was re-validated, any log after a clean checkpoint) is left
            # as it is: its end fields count only in a clean state.
            state = log._state(clean=False)
            believed_clean = on_disk is not None and on_disk.clean_shutdown and trust_state_clean
            if (on_disk is None or believed_clean
                    or on_disk[:2] != state[:2]):
                log._write_state(clean=False, fsync=on_disk is None or believed_clean)
        return log

    @classmethod
    def create(cls, directory: Path, config: LogConfig) -> PartitionLog:
        """A new empty log in a new `directory` (which must not exist), without fsyncs:
        see `create_log_files`. The caller fsyncs `directory.parent` before acknowledging
        the creation; the first flush fsyncs `directory`."""
        segments, log_start, report = create_log_files(directory, config)
        log = cls(directory, config, segments, log_start, report)
        log._dir_dirty = True
        try:
            with log._flush_lock:
                log._write_state(clean=False, fsync=False)
        except LogFailedError:
            log.discard()  # gives its descriptor back (the caller removes the directory)
            raise
        return log


def _scanned_without_producer_batches(segments: list[Segment]) -> int | None:
    """Base offset of the trailing run of segments re-validated at open without a batch
    carrying a producer id; None when the active segment was not re-validated or has one."""
    free_from = None
    for seg in reversed(segments):
        if seg.producer_batches_scanned != 0:
            break
        free_from = seg.base_offset
    return free_from


def roll_jitter_ms(config: LogConfig) -> int:
    """How much earlier than segment.ms the active segment rolls: random in
    [0, min(segment.jitter.ms, segment.ms)), drawn per segment as Kafka does, so that many
    partitions created together do not all roll at the same moment."""
    bound = min(config.segment_jitter_ms, config.segment_ms)
    return random.randrange(bound) if bound > 0 else 0


def _expired_prefix(segments: list[Segment], retention_ms: int, now_ms: int) -> int:
    """How many leading non-active segments have all their data older than retention_ms."""
    if retention_ms < 0:
        return 0
    count = 0
    for seg in segments[:-1]:
        newest_ms = seg.max_timestamp_ms
        if newest_ms < 0:  # no timestamps at all: fall back on the file's age, as Kafka does
            newest_ms = int(os.fstat(seg.fd).st_mtime * 1000)
        if now_ms - newest_ms <= retention_ms:
            break
        count += 1
    return count


def _oversize_prefix(segments: list[Segment], retention_bytes: int) -> int:
    """How many leading non-active segments can go while the log stays >= retention_bytes."""
    if retention_bytes < 0:
        return 0
    excess = sum(s.size_bytes for s in segments) - retention_bytes
    count = 0
    for seg in segments[:-1]:
        if seg.size_bytes > excess:
            break
        excess -= seg.size_bytes
        count += 1
    return count


__all__ = ["AppendInfo", "RetentionResult", "OffsetOutOfRange", "PartitionLog", "RecoveryReport"]
