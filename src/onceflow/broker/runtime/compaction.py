"""`Compactor`: keeps `__consumer_offsets` (and `__transaction_state`) bounded by
rewriting their closed segments; `LogCleaner`: the same for the compacted user topics.

The two share what touches storage: a plan (segment base -> kept batches, the changed
segments) applied by `storage.cleaner.apply_plan` - oldest first, each segment swapped
crash-safely by `PartitionLog.replace_segment`. They differ in what decides the plan:
the coordinators' topics keep what replays to the same coordinator state
(`onceflow.groups.compact`); user topics keep what Kafka's LogCleaner keeps
(storage/cleaner.py: newest value per key, tombstones and markers until
delete.retention.ms, no aborted records, nothing from the first unstable offset on).

Theory of operation
-------------------
Every offset commit appends a record, so without cleaning the topic grows with the number
of commits; what replay needs grows only with the number of live keys (group, topic,
partition) and groups. The pure function `onceflow.groups.compact` says which
entries replay to the same state; this runner applies it to storage:

1. A partition is *dirty* when a segment was closed (the log rolled) since its last
   compaction, or when its last compaction is older than the tombstone retention (so that
   expired tombstones go too). Every `offsets_compaction_interval_ms` the dirty
   partitions are compacted one after the other.
2. `plan_compaction` (on a worker thread; reads only) reads the closed segments - never
   the active one, which is still being appended to - turns their batches into entries,
   and keeps those `compact` keeps. A batch whose entries are all kept is kept byte for
   byte; a partly kept one is rebuilt as one batch per kept record, at the record's own
   offset, with the original producer id, epoch and transactional flag (so transaction
   markers still settle them on replay).
3. On the event loop, each changed segment is swapped for its kept batches
   (`PartitionLog.replace_segment`), oldest first: a record dropped from an old segment
   is always superseded by one kept in a newer segment or in the active one, so a crash
   between two swaps never resurrects a deleted key. Offsets never change, so the
   coordinator's "newest record wins" replay gives the same state.

Compacting only closed segments is correct on its own (the active segment only adds newer
records); the price is at most one extra copy per key.

The transaction runtime runs the same Compactor over `__transaction_state` (issue 5): its
records are plain keyed records (one per transactional id, tombstones when ids expire), so
`compact` keeps the newest per id, which replays to the same coordinator state. So the topic holds at most one
active segment (offsets_topic_segment_bytes) plus about one record per live key.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import multiprocessing
import os
import shutil
import weakref
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from onceflow.broker.runtime.log_io import LOAD_READ_BYTES, OffsetsLogCorrupt, batch_entries
from onceflow.broker.state import INTERNAL_TOPICS, now_ms
from onceflow.groups import LogEntry, LogRecord, compact
from onceflow.protocol.errors import RecordError
from onceflow.protocol.records import BatchHeader, SimpleRecord, build_batch, iter_batches
from onceflow.storage.cleaner import (
    DEDUPE_BUFFER_BYTES_DEFAULT,
    LogFiles,
    apply_plan,
    clean_files,
    cleanable_upper,
    die_with_parent,
    dirty_ratio,
    install_staged,
    needs_cleaning,
)
from onceflow.storage.layout import StorageError
from onceflow.storage.rewrite import STAGING_DIR
from onceflow.storage.log import PartitionLog

if TYPE_CHECKING:
    from onceflow.broker.state import BrokerState, PartitionState
    from onceflow.storage.store import TopicInfo

log = logging.getLogger("onceflow.groups")

# Compactions remembered for `history` (tests, benchmarks): bounded like everything else.
HISTORY_MAX = 1024


@dataclass
class Plan:
    """What each closed segment keeps; only `changed` segments need rewriting."""

    batches: dict[int, list[bytes]] = field(default_factory=dict)  # segment base -> batches
    changed: set[int] = field(default_factory=set)
    entries_before: int = 0
    entries_kept: int = 0


@dataclass(frozen=True, slots=True)
class Compacted:
    partition: int
    segments_rewritten: int
    entries_before: int
    entries_kept: int
    bytes_before: int
    bytes_after: int


def _closed_batches(offsets_log: PartitionLog, end_offset: int):
    """(header, bytes) of every batch below `end_offset` (the active segment's base)."""
    offset = offsets_log.log_start_offset
    while offset < end_offset:
        chunk = offsets_log.read(offset, LOAD_READ_BYTES, end_offset)
        if not chunk:
            return
        for header, batch in iter_batches(chunk):
            yield header, bytes(batch)
            offset = header.base_offset + header.last_offset_delta + 1


def _rebuilt(header: BatchHeader, kept: list[LogEntry]) -> list[bytes]:
    """A partly kept batch: one batch per kept record, at its own offset."""
    return [build_batch([SimpleRecord(e.key, e.value)], base_offset=e.offset,
                        base_timestamp_ms=e.timestamp_ms, producer_id=header.producer_id,
                        producer_epoch=header.producer_epoch,
                        transactional=header.is_transactional)
            for e in kept if isinstance(e, LogRecord)]


def plan_compaction(offsets_log: PartitionLog, segment_bases: list[int], now: int,
                    tombstone_retention_ms: int) -> Plan:
    """(any thread) The compaction of the closed segments among `segment_bases`."""
    closed, active_base = segment_bases[:-1], segment_bases[-1]
    batches = [(header, batch, batch_entries(header, memoryview(batch)))
               for header, batch in _closed_batches(offsets_log, active_base)]
    entries = [entry for _, _, batch_entries_ in batches for entry in batch_entries_]
    kept_offsets = {entry.offset for entry in compact(entries, now, tombstone_retention_ms)}
    plan = Plan({base: [] for base in closed}, set(), len(entries), len(kept_offsets))
    for header, batch, own in batches:
        segment = closed[bisect_right(closed, header.base_offset) - 1]
        kept = [entry for entry in own if entry.offset in kept_offsets]
        if own and len(kept) == len(own):
            plan.batches[segment].append(batch)
            continue
        plan.changed.add(segment)
        plan.batches[segment].extend(_rebuilt(header, kept))
    return plan


class CompactedTopic(Protocol):
    """What the compactor needs of the runtime whose topic it keeps bounded
    (common.CoordinatorRuntime)."""

    topic_name: str

    @property
    def tombstone_retention_ms(self) -> int: ...

    def topic(self) -> TopicInfo | None: ...

    def partition_log(self, index: int) -> PartitionLog: ...


class Compactor:
    def __init__(self, runtime: CompactedTopic, interval_ms: int) -> None:
        self._runtime = runtime
        self._interval_ms = interval_ms  # between compaction rounds (log.cleaner.backoff.ms)
        self._compacted_through: dict[int, int] = {}  # partition -> active base then
        self._last_run_ms: dict[int, int] = {}
        self.history: collections.deque[Compacted] = collections.deque(maxlen=HISTORY_MAX)
        self._closed = False

    async def run(self) -> None:
        interval_s = self._interval_ms / 1000
        while not self._closed:
            await asyncio.sleep(interval_s)
            await self.compact_dirty()

    def close(self) -> None:
        self._closed = True

    def _dirty(self, partition: int, bases: list[int], now: int) -> bool:
        if len(bases) < 2:
            return False
        retention_ms = self._runtime.tombstone_retention_ms
        return (bases[-1] > self._compacted_through.get(partition, 0)
                or now - self._last_run_ms.get(partition, now) >= retention_ms)

    async def compact_dirty(self) -> list[Compacted]:
        """Compact every dirty partition, one after the other."""
        done = []
        info = self._runtime.topic()
        for partition in range(info.num_partitions if info else 0):
            bases = self._runtime.partition_log(partition).segment_base_offsets
            if not self._dirty(partition, bases, now_ms()) or self._closed:
                continue
            try:
                done.append(await self.compact_partition(partition))
            except (OffsetsLogCorrupt, RecordError, StorageError):
                # Something in the log we cannot read (or a failed log): loud, but the other
                # partitions still get compacted; this one is retried after its next roll.
                log.exception("compaction of %s-%d failed", self._runtime.topic_name,
                              partition)
                self._compacted_through[partition] = bases[-1]
        return done

    async def compact_partition(self, partition: int) -> Compacted:
        offsets_log = self._runtime.partition_log(partition)
        bases = offsets_log.segment_base_offsets
        bytes_before = offsets_log.size_bytes
        retention_ms = self._runtime.tombstone_retention_ms
        plan = await asyncio.to_thread(plan_compaction, offsets_log, bases, now_ms(),
                                       retention_ms)
        apply_plan(offsets_log, plan.batches, plan.changed, now_ms())
        self._compacted_through[partition] = bases[-1]
        self._last_run_ms[partition] = now_ms()
        done = Compacted(partition, len(plan.changed), plan.entries_before, plan.entries_kept,
                         bytes_before, offsets_log.size_bytes)
        self.history.append(done)
        log.info("compacted %s-%d: %d segments rewritten, %d of %d entries "
                 "kept, %d -> %d bytes", self._runtime.topic_name, partition,
                 done.segments_rewritten, done.entries_kept,
                 done.entries_before, done.bytes_before, done.bytes_after)
        return done


@dataclass(frozen=True, slots=True)
class Cleaned:
    topic: str
    partition: int
    upper_offset: int  # exclusive end of the cleaned range
    segments_rewritten: int
    records_before: int
    records_kept: int
    bytes_before: int  # of the cleaned range
    bytes_after: int  # of the whole log afterwards


class LogCleaner:
    """Cleans the partitions of compacted user topics (cleanup.policy contains compact)
    every log.cleaner.backoff.ms, one partition after the other. The heavy part - reading
    the segments, the key map, writing and fsyncing the cleaned segments - runs in a
    child process (`storage.cleaner.clean_files`, started when the first compacted
    partition is seen, at a lower CPU priority), so its CPU never holds the broker's GIL; the broker only swaps the staged segments in
    (`install_staged`, on a worker thread) and keeps the bookkeeping. What it remembers
    (where each partition's dirty part starts, when a kept tombstone expires) is a cache:
    after a restart everything counts as dirty once."""

    def __init__(self, state: BrokerState, backoff_ms: int,
                 dedupe_buffer_bytes: int = DEDUPE_BUFFER_BYTES_DEFAULT,
                 io_bytes_per_second: float = float("inf")) -> None:
        self._state = state
        self._backoff_ms = backoff_ms
        self._dedupe_buffer_bytes = dedupe_buffer_bytes
        self._io_bytes_per_second = io_bytes_per_second
        # Per log object, not per name: a topic deleted and created again starts afresh.
        self._first_dirty: weakref.WeakKeyDictionary[PartitionLog, int] = (
            weakref.WeakKeyDictionary())
        self._expiry_ms: weakref.WeakKeyDictionary[PartitionLog, int | None] = (
            weakref.WeakKeyDictionary())
        self.history: collections.deque[Cleaned] = collections.deque(maxlen=HISTORY_MAX)
        self._pool: ProcessPoolExecutor | None = None
        self.child_ready: Future[int] | None = None
        self.cleaning_now: tuple[str, int] | None = None  # (topic, partition) in the child
        self._tokens = itertools.count()
        self._closed = False

    async def run(self) -> None:
        while not self._closed:
            await asyncio.sleep(self._backoff_ms / 1000)
            await self.clean_dirty()

    def close(self) -> None:
        self._closed = True
        self._drop_executor()

    async def clean_dirty(self) -> list[Cleaned]:
        done = []
        for partition in self._state.partitions():
            if self._closed:
                break
            if partition.topic in INTERNAL_TOPICS or not partition.log.config.compacts:
                continue
            self._executor()  # the child starts with the first compacted partition seen
            try:
                cleaned = await self.clean_partition(partition)
            except (RecordError, StorageError, ValueError, OSError) as exc:
                # A failed or closed log, a batch we cannot decode, a segment deleted by
                # retention meanwhile: the old segments stay; retried next round.
                log.warning("cleaning %s-%d failed: %s", partition.topic, partition.index, exc)
                continue
            if cleaned is not None:
                done.append(cleaned)
        return done

    async def clean_partition(self, partition: PartitionState, *,
                              force: bool = False) -> Cleaned | None:
        """Cleans one partition if it needs it (or `force`); None when it did not."""
        partition_log = partition.log
        config, now = partition_log.config, now_ms()
        upper = cleanable_upper(partition_log, partition.producers.first_unstable_offset(),
                                now, config)
        first_dirty = max(self._first_dirty.get(partition_log, 0), partition_log.log_start_offset)
        self._state.metrics.cleaner_looked(
            partition.topic, partition.index,
            dirty_ratio(partition_log.segment_infos(), first_dirty, upper), upper)
        if not force and not needs_cleaning(partition_log, config, first_dirty, upper, now,
                                            self._expiry_ms.get(partition_log)):
            return None
        if upper <= partition_log.log_start_offset:
            return None
        files = LogFiles.of(partition_log, upper)
        # What a killed child staged earlier is never installed: clear it away.
        shutil.rmtree(partition_log.directory / STAGING_DIR, ignore_errors=True)
        token = f"{os.getpid()}-{next(self._tokens)}"
        self.cleaning_now = (partition.topic, partition.index)
        try:
            result = await asyncio.get_running_loop().run_in_executor(
                self._executor(), clean_files, files, config, now, first_dirty, upper,
                self._dedupe_buffer_bytes, self._io_bytes_per_second, token)
        except BrokenProcessPool:
            # The child died (killed, out of memory): nothing it staged is installed, the
            # log is as it was; a new child cleans next round.
            if self._closed:
                return None  # killed by close()
            self._drop_executor()
            shutil.rmtree(partition_log.directory / STAGING_DIR, ignore_errors=True)
            raise StorageError("the cleaner's process died") from None
        finally:
            self.cleaning_now = None
        swapped = await asyncio.to_thread(install_staged, partition_log, result, now)
        self._first_dirty[partition_log] = result.upper_offset
        self._expiry_ms[partition_log] = result.next_expiry_ms
        done = Cleaned(partition.topic, partition.index, result.upper_offset, swapped,
                       result.records_before, result.records_kept, result.bytes_before,
                       partition_log.size_bytes)
        self._state.metrics.log_cleaned(partition.topic, result.bytes_before, swapped)
        self.history.append(done)
        log.info("cleaned %s-%d up to %d: %d segments rewritten, %d of %d records kept",
                 partition.topic, partition.index, result.upper_offset, swapped,
                 result.records_kept, result.records_before)
        return done

    def _executor(self) -> ProcessPoolExecutor:
        """The cleaner's child process, started at the first cleaning (spawned: a fresh
        interpreter, its own GIL, so the broker's event loop never waits on cleaning)."""
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                1, mp_context=multiprocessing.get_context("spawn"),
                initializer=die_with_parent, initargs=(os.getpid(),))
            # Starts it now: its imports (about a second of CPU) are not the first
            # cleaning's wait. Done when the child is ready (benchmarks wait for it).
            self.child_ready = self._pool.submit(os.getpid)
        return self._pool

    def _drop_executor(self) -> None:
        """Stops the child at once, even in the middle of a cleaning: what it staged is
        never installed (and is removed by the next cleaning), so no need to wait."""
        pool, self._pool, self.child_ready = self._pool, None, None
        if pool is None:
            return
        children = list((pool._processes or {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for child in children:
            child.kill()
        for child in children:
            child.join(5)
