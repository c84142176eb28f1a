"""The log cleaner of compacted topics: which batches of a partition's closed segments stay.

Theory of operation
-------------------
Kafka's LogCleaner, one partition at a time, without ever holding the log's lock for
more than one read (the log is read through `PartitionLog.read`, a chunk at a time):

1. The *cleanable range* is [log start, upper): `upper` is the base offset of the first
   segment that must not be touched - the active segment, the one holding the first
   unstable offset (an open transaction's records are never removed, and the cleaner
   stops before it), the first one with a record newer than min.compaction.lag.ms - so
   only whole closed segments are cleaned. `first_dirty` is where the previous clean
   stopped; the dirty ratio is dirty bytes / (clean + dirty bytes), and a partition is
   cleaned when it reaches min.cleanable.dirty.ratio, when its dirty part holds a record
   older than max.compaction.lag.ms, or when a kept tombstone or marker has expired.
2. The *key map* (Kafka's SkimpyOffsetMap): for every key in [first_dirty, upper), the
   offset of its newest record, records of aborted transactions left out. Its size is
   bounded by log.cleaner.dedupe.buffer.size (24 bytes an entry: a 16-byte MD5 of the
   key and an offset, at most 90% full). When it fills, `upper` comes down to the base of
   the segment where it filled, and the next round goes on from there.
3. The *rewrite* walks [log start, upper) oldest first and keeps, per batch:
   - a record whose key's newest offset (per the map) is its own or later, or that the
     map does not know (it is already the newest: it lies in the clean part);
   - not a record without key (Kafka's cleaner drops them too);
   - not a tombstone (null value) in a segment whose newest record is older than
     delete.retention.ms: by then readers have had that long to see the deletion;
   - no record of an aborted transaction (the aborted-transaction index says which);
   - a COMMIT or ABORT marker until delete.retention.ms has passed and no record of its
     transaction is left in the log before it (counted before this cleaning, so the
     marker goes at the earliest one cleaning after its records); a removed ABORT
     marker's entry leaves the segment's aborted-transaction index, which is staged and
     swapped in before the .log, so read_committed readers stay exact.
   A batch whose records all stay is kept byte for byte; a partly kept one becomes one
   uncompressed batch per kept record at the record's own offset, with the batch's
   producer id, epoch, sequence and transactional flag, so offsets and producer state
   are what they were. A segment whose batches all stay is not rewritten.

The caller swaps each changed segment in, oldest first (`PartitionLog.replace_segment`,
crash-safe, see rewrite.py): a record dropped from an old segment is always superseded by
one kept in a newer segment, so a crash between two swaps loses no key's newest value.
Producer state does not depend on the removed batches: it is snapshotted at every roll,
at the active segment's base, which the cleaner never reaches.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import time
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from onceflow.protocol.compression import KeyedRecord, batch_keys, batch_records, plain_batch
from onceflow.protocol.errors import CorruptRecord
from onceflow.protocol.records import (
    LOG_OVERHEAD_BYTES,
    BatchHeader,
    Record,
    SimpleRecord,
    TimestampType,
    build_batch,
    end_txn_marker,
    iter_batches,
)
from onceflow.storage.config import LogConfig
from onceflow.storage.layout import LOG_SUFFIX, segment_path
from onceflow.storage.log import PartitionLog, SegmentInfo
from onceflow.storage.recovery import index_entries_max
from onceflow.storage.rewrite import STAGING_DIR, stage_segment
from onceflow.storage.txn_index import AbortedTxn

logger = logging.getLogger(__name__)

KEY_MAP_ENTRY_BYTES = 24  # a 16-byte MD5 of the key and an 8-byte offset, as Kafka sizes it
KEY_MAP_LOAD_FACTOR = 0.9  # log.cleaner.io.buffer.load.factor (Kafka's default)
DEDUPE_BUFFER_BYTES_DEFAULT = 134_217_728  # log.cleaner.dedupe.buffer.size
READ_CHUNK_BYTES = 1024 * 1024  # one read of the log: the lock is held for this much


def _c_readers():
    """aiokafka's C record-batch reader, when installed: it reads records about 25 times
    faster than `protocol.compression`, and the cleaner's Python time is time the
    broker's event loop waits for the GIL. Decompression stays ours (bounded)."""
    try:
        from aiokafka.errors import KafkaError
        from aiokafka.record._crecords.default_records import DefaultRecordBatch
    except ImportError:
        return None, None

    def read(batch: bytes):
        try:
            return list(DefaultRecordBatch(bytearray(plain_batch(batch))))
        except (KafkaError, ValueError, IndexError) as exc:
            raise CorruptRecord(f"record batch does not decode: {exc}") from None

    def keys(batch: bytes) -> list[KeyedRecord]:
        return [KeyedRecord(r.offset, r.key, r.value is not None) for r in read(batch)]

    def records(batch: bytes) -> list[Record]:
        return [Record(r.offset, r.timestamp, r.key, r.value, tuple(r.headers))
                for r in read(batch)]

    return keys, records


@functools.cache
def readers() -> tuple:
    """(keys, records) readers: aiokafka's when installed, else ours - the same answers
    either way (tests/storage/test_cleaner.py checks). Chosen on the first cleaning, not at
    import: importing aiokafka costs a broker start about 60 ms."""
    keys, records = _c_readers()
    return keys or batch_keys, records or batch_records


def record_keys(batch: bytes) -> list[KeyedRecord]:
    return readers()[0](batch)


def record_list(batch: bytes) -> list[Record]:
    return readers()[1](batch)


class Throttler:
    """Holds the cleaner to `bytes_per_second` of reads and writes, like Kafka's
    log.cleaner.io.max.bytes.per.second (default: no limit). Sleeps on the cleaner's
    thread; time is a parameter for tests."""

    def __init__(self, bytes_per_second: float, clock=time.monotonic, sleep=time.sleep) -> None:
        self.bytes_per_second = bytes_per_second
        self._clock, self._sleep = clock, sleep
        self._start = clock()
        self._bytes = 0

    def __call__(self, size_bytes: int) -> None:
        if self.bytes_per_second == float("inf"):
            return
        self._bytes += size_bytes
        ahead_s = self._bytes / self.bytes_per_second - (self._clock() - self._start)
        if ahead_s > 0:
            self._sleep(ahead_s)


UNTHROTTLED = Throttler(float("inf"))


class KeyMap:
    """Key -> newest offset, at most `capacity` keys (Kafka's SkimpyOffsetMap, by digest)."""

    def __init__(self, memory_bytes: int) -> None:
        self.capacity = max(1, int(memory_bytes * KEY_MAP_LOAD_FACTOR) // KEY_MAP_ENTRY_BYTES)
        self._offsets: dict[bytes, int] = {}

    def __len__(self) -> int:
        return len(self._offsets)

    def put(self, key: bytes, offset: int) -> bool:
        """False (nothing stored) when the key is new and the map is full."""
        digest = hashlib.md5(key, usedforsecurity=False).digest()
        if digest not in self._offsets and len(self._offsets) >= self.capacity:
            return False
        self._offsets[digest] = offset
        return True

    def get(self, key: bytes) -> int | None:
        return self._offsets.get(hashlib.md5(key, usedforsecurity=False).digest())


@dataclass
class CleanPlan:
    """What each segment in [log start, upper) keeps; only `changed` ones are rewritten."""

    upper_offset: int  # exclusive end of the cleaned range (a segment base)
    batches: dict[int, list[bytes]] = field(default_factory=dict)  # segment base -> batches
    changed: set[int] = field(default_factory=set)
    records_before: int = 0
    records_kept: int = 0
    bytes_before: int = 0
    # The earliest time a tombstone or marker kept now may go (None: none kept).
    next_expiry_ms: int | None = None
    # Segments whose aborted-transaction index changes (ABORT markers removed): the
    # entries they keep.
    aborted: dict[int, list[AbortedTxn]] = field(default_factory=dict)


def cleanable_upper(log: PartitionLog, first_unstable_offset: int | None, now_ms: int,
                    config: LogConfig) -> int:
    """The base offset of the first segment the cleaner must not touch (step 1)."""
    infos = log.segment_infos()
    bases = [info.base_offset for info in infos]
    upper = infos[-1].base_offset
    if first_unstable_offset is not None:
        upper = min(upper, first_unstable_offset)
    for info in infos[:-1]:
        if info.max_timestamp_ms > now_ms - config.min_compaction_lag_ms:
            upper = min(upper, info.base_offset)
            break
    return bases[max(bisect_right(bases, upper) - 1, 0)]


def dirty_ratio(infos: list[SegmentInfo], first_dirty: int, upper: int) -> float:
    clean = sum(i.size_bytes for i in infos if i.next_offset <= first_dirty)
    dirty = sum(i.size_bytes for i in infos
                if i.base_offset >= first_dirty and i.next_offset <= upper)
    total = clean + dirty
    return dirty / total if total else 0.0


def needs_cleaning(log: PartitionLog, config: LogConfig, first_dirty: int, upper: int,
                   now_ms: int, expiry_ms: int | None) -> bool:
    """Step 1's rule: dirty ratio, max.compaction.lag.ms, or an expired tombstone."""
    infos = log.segment_infos()
    if upper <= log.log_start_offset:
        return False
    if expiry_ms is not None and now_ms >= expiry_ms:
        return True
    dirty = [i for i in infos if i.base_offset >= first_dirty and i.next_offset <= upper]
    if not dirty:
        return False
    if dirty_ratio(infos, first_dirty, upper) >= config.min_cleanable_dirty_ratio:
        return True
    oldest_ms = dirty[0].max_timestamp_ms
    return 0 <= oldest_ms < now_ms - config.max_compaction_lag_ms


class LogFiles:
    """What a cleaning reads of a partition, as plain data another process can take: the
    directory, the log start, every segment's `SegmentInfo` and the aborted transactions
    of the cleaned range, taken by the broker (`of`) when the cleaning starts. Offers the
    part of `PartitionLog` that `plan_clean` reads; the closed segments below the cleaned
    range's end do not change while their files are read (only this cleaning rewrites
    them, appends go to the active segment, and a segment retention deletes meanwhile
    fails the cleaning, which is retried next round)."""

    def __init__(self, directory: Path, log_start_offset: int, infos: list[SegmentInfo],
                 aborted: list[AbortedTxn]) -> None:
        self.directory = directory
        self.log_start_offset = log_start_offset
        self._infos = infos
        self._aborted = aborted

    @classmethod
    def of(cls, log: PartitionLog, upper: int) -> LogFiles:
        infos = log.segment_infos()
        start = log.log_start_offset
        return cls(log.directory, start, infos, log.aborted_transactions(start, upper))

    @property
    def segment_base_offsets(self) -> list[int]:
        return [info.base_offset for info in self._infos]

    def segment_infos(self) -> list[SegmentInfo]:
        return list(self._infos)

    def aborted_transactions(self, fetch_offset: int, upper_offset: int) -> list[AbortedTxn]:
        return [txn for txn in self._aborted
                if txn.last_offset >= fetch_offset and txn.first_offset < upper_offset]

    def batches(self, start: int, upper: int, throttle: Throttler
                ) -> Iterator[tuple[BatchHeader, bytes]]:
        """(header, bytes) of every batch in [start, upper), read from the segment files
        a chunk at a time (never past a segment's size when the broker looked)."""
        for info in self._infos:
            if info.base_offset >= upper:
                return
            if info.next_offset <= start:
                continue
            path = segment_path(self.directory, info.base_offset, LOG_SUFFIX)
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                raise ValueError(f"{path.name}: deleted while the cleaner read it") from None
            try:
                position = 0
                while position < info.size_bytes:
                    chunk = os.pread(fd, min(READ_CHUNK_BYTES, info.size_bytes - position),
                                     position)
                    whole = _whole_batches(chunk)
                    if whole == 0 and len(chunk) >= LOG_OVERHEAD_BYTES:  # one large batch
                        whole = LOG_OVERHEAD_BYTES + int.from_bytes(chunk[8:12], "big")
                        if whole > info.size_bytes - position:
                            raise CorruptRecord(f"{path.name}: batch at {position} runs "
                                                f"past the segment's end")
                        chunk = os.pread(fd, whole, position)
                    if whole == 0 or len(chunk) < whole:
                        raise CorruptRecord(f"{path.name}: short read at {position}")
                    throttle(whole)
                    for header, batch in iter_batches(memoryview(chunk)[:whole]):
                        if header.base_offset >= upper:
                            return
                        if header.last_offset >= start:
                            yield header, bytes(batch)
                    position += whole
            finally:
                os.close(fd)


def _whole_batches(chunk: bytes) -> int:
    """How many leading bytes of `chunk` are whole batches (by their length fields)."""
    position = 0
    while position + LOG_OVERHEAD_BYTES <= len(chunk):
        end = (position + LOG_OVERHEAD_BYTES
               + int.from_bytes(chunk[position + 8:position + 12], "big"))
        if end > len(chunk) or end <= position + LOG_OVERHEAD_BYTES:
            break
        position = end
    return position


def _batches(log: PartitionLog | LogFiles, start: int, upper: int,
             throttle: Throttler = UNTHROTTLED) -> Iterator[tuple[BatchHeader, bytes]]:
    """(header, bytes) of every batch in [start, upper), a chunk at a time."""
    if isinstance(log, LogFiles):
        yield from log.batches(max(start, log.log_start_offset), upper, throttle)
        return
    offset = max(start, log.log_start_offset)
    while offset < upper:
        chunk = log.read(offset, READ_CHUNK_BYTES, upper)
        if not chunk:
            return
        throttle(len(chunk))
        time.sleep(0)  # hand the GIL to the event loop between chunks: it never waits long
        for header, batch in iter_batches(chunk):
            if header.last_offset >= offset:
                yield header, bytes(batch)
            offset = header.last_offset + 1


class _Aborted:
    """Whether a transactional batch belongs to an aborted transaction."""

    def __init__(self, txns: list[AbortedTxn]) -> None:
        self._ranges: dict[int, list[tuple[int, int]]] = {}
        for txn in txns:
            self._ranges.setdefault(txn.producer_id, []).append(
                (txn.first_offset, txn.last_offset))

    def __call__(self, header: BatchHeader) -> bool:
        return any(first <= header.base_offset <= last
                   for first, last in self._ranges.get(header.producer_id, ()))


def build_key_map(log: PartitionLog | LogFiles, first_dirty: int, upper: int, memory_bytes: int,
                  aborted: _Aborted, throttle: Throttler = UNTHROTTLED) -> tuple[KeyMap, int]:
    """Step 2: the key map of [first_dirty, upper) and the upper bound it covers."""
    key_map = KeyMap(memory_bytes)
    bases = log.segment_base_offsets
    for header, batch in _batches(log, first_dirty, upper, throttle):
        if header.is_control or (header.is_transactional and aborted(header)):
            continue
        for record in record_keys(batch):
            if record.key is not None and not key_map.put(record.key, record.offset):
                full_at = bases[bisect_right(bases, header.base_offset) - 1]
                if full_at <= first_dirty:
                    # Kafka's cleaner gives up on such a partition the same way.
                    logger.warning("%s: the key map (%d keys, log.cleaner.dedupe.buffer.size) "
                                   "cannot hold the keys of one segment; not cleaned",
                                   log.directory.name, len(key_map))
                else:
                    logger.info("%s: key map full (%d keys) at offset %d; cleaning up to %d",
                                log.directory.name, len(key_map), record.offset, full_at)
                return key_map, full_at
    return key_map, upper


def _rebuilt(header: BatchHeader, records: list[Record]) -> list[bytes]:
    """A partly kept batch: one batch per kept record, at its own offset."""
    timestamp_type = header.timestamp_type
    out = []
    for record in records:
        sequence = (-1 if header.base_sequence < 0
                    else header.base_sequence + record.offset - header.base_offset)
        out.append(build_batch(
            [SimpleRecord(record.key, record.value, record.headers)],
            base_offset=record.offset, base_timestamp_ms=record.timestamp_ms,
            producer_id=header.producer_id, producer_epoch=header.producer_epoch,
            base_sequence=sequence, transactional=header.is_transactional,
            timestamp_type=(TimestampType.LOG_APPEND_TIME
                            if timestamp_type == TimestampType.LOG_APPEND_TIME
                            else TimestampType.CREATE_TIME)))
    return out


def plan_clean(log: PartitionLog | LogFiles, config: LogConfig, now_ms: int, first_dirty: int,
               upper: int, memory_bytes: int = DEDUPE_BUFFER_BYTES_DEFAULT,
               throttle: Throttler = UNTHROTTLED) -> CleanPlan:
    """(any thread; reads only) Steps 2 and 3 over [log start, upper)."""
    start = log.log_start_offset
    aborted_txns = log.aborted_transactions(start, upper)
    aborted = _Aborted(aborted_txns)
    key_map, upper = build_key_map(log, max(first_dirty, start), upper, memory_bytes, aborted,
                                   throttle)
    infos = [i for i in log.segment_infos() if i.base_offset < upper]
    bases = [i.base_offset for i in infos]
    expired = {i.base_offset: 0 <= i.max_timestamp_ms < now_ms - config.delete_retention_ms
               for i in infos}
    plan = CleanPlan(upper, {base: [] for base in bases})
    open_txn_records: set[int] = set()  # producers whose current transaction has records
    removed_aborts: set[int] = set()  # offsets of ABORT markers removed

    def expiry(base: int) -> None:
        info = next(i for i in infos if i.base_offset == base)
        when = max(info.max_timestamp_ms, 0) + config.delete_retention_ms + 1
        plan.next_expiry_ms = when if plan.next_expiry_ms is None else min(
            plan.next_expiry_ms, when)

    for header, batch in _batches(log, start, upper, throttle):
        segment = bases[bisect_right(bases, header.base_offset) - 1]
        plan.bytes_before += len(batch)
        if header.is_control:
            had_records = header.producer_id in open_txn_records
            open_txn_records.discard(header.producer_id)
            marker = end_txn_marker(batch)
            if marker is not None and not had_records and expired[segment]:
                plan.changed.add(segment)
                if not marker.commit:
                    removed_aborts.add(header.base_offset)
                continue
            if marker is not None and not had_records:
                expiry(segment)
            plan.batches[segment].append(batch)
            continue
        records = record_keys(batch)
        plan.records_before += len(records)
        if header.is_transactional:
            # Counted on what was in the log, kept or not: a marker goes only in a later
            # cleaning than its transaction's records, so a crash between the swap of the
            # aborted-transaction index and of the .log never exposes aborted records.
            open_txn_records.add(header.producer_id)
            if aborted(header):
                plan.changed.add(segment)
                continue
        kept = set()
        for record in records:
            if record.key is None:
                continue
            newest = key_map.get(record.key)
            if newest is not None and record.offset < newest:
                continue
            if not record.has_value:
                if expired[segment]:
                    continue
                expiry(segment)
            kept.add(record.offset)
        plan.records_kept += len(kept)
        if len(kept) == len(records):
            plan.batches[segment].append(batch)
        else:
            plan.changed.add(segment)
            plan.batches[segment].extend(
                _rebuilt(header, [r for r in record_list(batch) if r.offset in kept]))
    for txn in aborted_txns:
        if txn.last_offset in removed_aborts:
            segment = bases[bisect_right(bases, txn.last_offset) - 1]
            plan.aborted.setdefault(segment, [])
    for txn in aborted_txns:
        if txn.last_offset >= upper:
            continue  # its marker lies past the cleaned range
        segment = bases[bisect_right(bases, txn.last_offset) - 1]
        if segment in plan.aborted and txn.last_offset not in removed_aborts:
            plan.aborted[segment].append(txn)
    return plan


def apply_plan(log: PartitionLog, batches: dict[int, list[bytes]], changed: set[int],
               now_ms: int, aborted: dict[int, list[AbortedTxn]] | None = None,
               throttle: Throttler = UNTHROTTLED) -> int:
    """Swaps each changed segment for its kept batches, oldest first (see the module
    docstring); a segment retention deleted meanwhile is skipped. Returns how many were
    swapped. Shared by the coordinator topics' compactor."""
    swapped = 0
    for base in sorted(changed):
        if base not in log.segment_base_offsets:
            continue  # deleted by retention since the plan was made
        throttle(log.replace_segment(base, batches[base], now_ms, (aborted or {}).get(base)))
        swapped += 1
    return swapped


@dataclass(frozen=True)
class StagedClean:
    """What `clean_files` did, as plain data: the plan's figures and, for each changed
    segment, where its cleaned copy is staged."""

    upper_offset: int
    records_before: int
    records_kept: int
    bytes_before: int
    next_expiry_ms: int | None
    # (segment base, staging directory, no batches left, its aborted-txn index replaced)
    staged: list[tuple[int, str, bool, bool]]


def clean_files(files: LogFiles, config: LogConfig, now_ms: int, first_dirty: int,
                upper: int, memory_bytes: int, io_bytes_per_second: float,
                token: str) -> StagedClean:
    """(the cleaner's child process) Steps 2 and 3 over the files, then every changed
    segment staged (written and fsync'd) under `.cleaned/<token>-<base>/`, oldest first.
    Touches nothing the broker reads: the broker installs the staged segments
    (`install_staged`)."""
    throttle = Throttler(io_bytes_per_second)
    plan = plan_clean(files, config, now_ms, first_dirty, upper, memory_bytes, throttle)
    bases = files.segment_base_offsets
    staged = []
    for base in sorted(plan.changed):
        next_base = bases[bases.index(base) + 1]
        staging = files.directory / STAGING_DIR / f"{token}-{base}"
        batches = plan.batches[base]
        stage_segment(files.directory, base, next_base, batches, config.index_interval_bytes,
                      index_entries_max(config), now_ms, plan.aborted.get(base), staging)
        throttle(sum(map(len, batches)))
        staged.append((base, str(staging), not batches, base in plan.aborted))
    return StagedClean(plan.upper_offset, plan.records_before, plan.records_kept,
                       plan.bytes_before, plan.next_expiry_ms, staged)


def install_staged(log: PartitionLog, done: StagedClean, now_ms: int) -> int:
    """(broker) Swaps `clean_files`' staged segments in, oldest first (a segment retention
    deleted meanwhile is skipped); whatever is left staged is removed. Returns how many
    segments were swapped."""
    swapped = 0
    try:
        for base, staging, empty, replace_txn_index in done.staged:
            if base not in log.segment_base_offsets:
                continue
            log.install_staged(base, Path(staging), empty, replace_txn_index, now_ms)
            swapped += 1
    finally:
        for _, staging, _, _ in done.staged:
            shutil.rmtree(staging, ignore_errors=True)
    return swapped


CHILD_NICE = 10  # the cleaner's process yields the CPU to the broker's (Unix nice)


def die_with_parent(broker_pid: int) -> None:
    """(child process initializer, Linux) SIGKILL this process when the broker that
    started it dies, so a killed broker leaves no cleaner writing behind it; and lower
    its CPU priority: cleaning is background work, produce and fetch come first when the
    cores are busy (a starved cleaner only cleans later)."""
    try:
        os.nice(CHILD_NICE)
    except OSError:
        pass
    try:
        import ctypes
        import signal
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != broker_pid:  # already orphaned before the prctl
        os._exit(1)
