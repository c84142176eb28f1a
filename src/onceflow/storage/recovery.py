"""Opening a partition log: load trusted segments, re-validate the rest, repair the directory.

Theory of operation
-------------------
`load_segments` is the whole of recovery. It first removes leftovers (temp files, indexes
whose .log is gone), then reads `partition.state`:

* clean shutdown (written by `PartitionLog.close` after a final flush): every segment is
  loaded trusting its indexes - only the batch headers after each segment's last index entry
  are walked - and the active segment must match the size and end offset recorded at close,
  else it is re-validated;
* otherwise, segments ending at or before the recovery point are trusted the same way, and
  from the segment that holds the recovery point onwards every batch is re-validated
  (length bounds, magic 2, CRC-32C, offsets monotonic). The first bad byte truncates its
  segment and deletes every later segment, so the log stays a valid prefix. A trusted
  segment whose indexes fail their checks is re-validated (and its indexes rebuilt) too.

Then segments wholly below the persisted log start are deleted (a crash may have
interrupted retention), and the caller writes a fresh state file (clean flag off) before
accepting appends. Re-validated segments are not fsync'd here: they stay dirty, the log's
recovery point stays at the first of them, and the log's next flush syncs them.
"""

from __future__ import annotations

import logging
import os
from bisect import bisect_left
from pathlib import Path
from typing import NamedTuple

from onceflow.storage.config import LogConfig
from onceflow.storage.index import OFFSET_ENTRY_BYTES, TIME_ENTRY_BYTES
from onceflow.storage.layout import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    TMP_SUFFIX,
    PARTITION_STATE_FILE,
    CorruptFileError,
    PartitionState,
    fsync_dir,
    parse_segment_name,
    read_partition_state,
    segment_path,
)
from onceflow.storage.segment import Segment
from onceflow.storage.txn_index import TXN_INDEX_SUFFIX

# Files that belong to a segment besides its .log: removed with it, orphans without it.
_SEGMENT_INDEX_SUFFIXES = (INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX)

logger = logging.getLogger(__name__)


class RecoveryReport(NamedTuple):
    clean_shutdown: bool  # the state file said so, and the files matched it
    segments_scanned: int  # segments re-validated batch by batch
    bytes_scanned: int
    bytes_truncated: int  # invalid tail bytes removed
    segments_dropped: int  # whole segments deleted after a truncation (or inconsistent)
    problem: str | None  # the first problem found, for the log
    # Base offset of the first re-validated segment still in the log: everything below it
    # is durable; from it on the files may hold bytes that reached only the page cache.
    first_scanned: int | None = None


def index_entries_max(config: LogConfig) -> int:
    return max(config.segment_index_bytes // max(OFFSET_ENTRY_BYTES, TIME_ENTRY_BYTES), 1)


def take_dirty_fds(segments: list[Segment], directory: Path | None) -> list[int]:
    fds: list[int] = []
    try:
        for seg in segments:
            fds.extend(seg.take_dirty_fds())
        if directory is not None:
            fds.append(os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
    except OSError:
        for fd in fds:
            os.close(fd)
        raise
    return fds


def list_log_dir(directory: Path) -> list[str] | None:
    """The names in a partition directory, None when it does not exist: the one listing
    that opening a log makes (segments, indexes, snapshots, leftovers all come from it)."""
    try:
        return os.listdir(directory)
    except FileNotFoundError:
        return None


def load_segments(
    directory: Path, config: LogConfig, now_ms: int, state: PartitionState | None = None,
    names: list[str] | None = None,
) -> tuple[list[Segment], int, RecoveryReport]:
    """Opens (creating if needed) and recovers the segments in `directory`: returns them
    (at least one), the log start offset and what recovery did. `state`: the partition
    state file as the caller read it (else read here; a corrupt one means "recover all").
    `names`: the directory's listing if the caller made it (`list_log_dir`)."""
    if names is None:
        names = list_log_dir(directory)
    created = names is None
    if created:
        directory.mkdir(parents=True, exist_ok=True)
        fsync_dir(directory.parent)
        names = []
    bases, names = _clean_directory(directory, names)
    if state is None and not created:
        try:
            state = read_partition_state(directory)
        except CorruptFileError as exc:
            logger.error("%s: %s; recovering the whole log", directory, exc)
    return _load(directory, config, bases, state, now_ms, frozenset(names))


def create_log_files(directory: Path, config: LogConfig) -> tuple[list[Segment], int, RecoveryReport]:
    """A new, empty log in a new `directory`, with no fsync at all (bulk creation): nothing
    in it is acknowledged yet, a crash that loses it leaves a missing or empty log that the
    next open recreates, and the log's first flush fsyncs the directory (the caller sets
    it dirty); the caller fsyncs the parent once for all the logs it created."""
    directory.mkdir(parents=True)
    segment = Segment.create(directory, 0, config.index_interval_bytes, index_entries_max(config))
    return [segment], 0, RecoveryReport(False, 0, 0, 0, 0, None)


def _clean_directory(directory: Path, names: list[str]) -> tuple[list[int], list[str]]:
    """Removes temp files and indexes without a .log; returns the segment base offsets and
    the names left. One pass over the listing: the common names (.log, partition.state)
    cost one suffix test each, only the others are parsed."""
    bases: list[int] = []
    indexes: list[tuple[int, str]] = []  # (base, name) of every segment index file
    removed: list[str] = []
    for name in names:
        if name.endswith(LOG_SUFFIX):
            base = parse_segment_name(name, LOG_SUFFIX)
            if base is not None:
                bases.append(base)
        elif name == PARTITION_STATE_FILE:
            continue
        elif name.endswith(TMP_SUFFIX):
            removed.append(name)
        else:
            for suffix in _SEGMENT_INDEX_SUFFIXES:
                base = parse_segment_name(name, suffix)
                if base is not None:
                    indexes.append((base, name))
                    break
    if indexes:
        have = set(bases)
        removed.extend(name for base, name in indexes if base not in have)
    bases.sort()
    if removed:
        for name in removed:
            os.unlink(os.path.join(directory, name))
        fsync_dir(directory)
        gone = set(removed)
        names = [n for n in names if n not in gone]
    return bases, names


def _load(
    directory: Path, config: LogConfig, bases: list[int], state: PartitionState | None,
    now_ms: int, names: frozenset[str],
) -> tuple[list[Segment], int, RecoveryReport]:
    clean = state is not None and state.clean_shutdown
    recovery_point = state.recovery_point_offset if state is not None else 0
    # Trust segments that end at or before the recovery point: those starting before it,
    # except the last such one (it may extend past the point).
    first_scan = len(bases) if clean else max(bisect_left(bases, recovery_point) - 1, 0)
    segments, scanned, report = _load_segments(directory, config, bases, first_scan, now_ms,
                                               names)
    if (
        clean
        and segments
        and segments[-1] not in scanned
        and not _matches_close(segments[-1], state)
    ):
        logger.warning("%s: files differ from the clean-shutdown state; re-validating", directory)
        extra = _recover_segment(
            segments[-1], segments[-2].next_offset if len(segments) > 1 else 0, now_ms
        )
        scanned.append(segments[-1])
        report = _merge(report, extra)
    clean = clean and not scanned
    log_start = state.log_start_offset if state is not None else (bases[0] if bases else 0)
    segments, dropped = _apply_log_start(directory, config, segments, log_start)
    live = [s for s in scanned if not s.closed]
    # Re-validated segments are not fsync'd here: they stay dirty (Segment.recover), the log's
    # recovery point stays at the first of them (PartitionLog.open), and its next flush
    # syncs them; a crash before that re-validates them again. Kafka does the same.
    first_scanned = min((s.base_offset for s in live), default=None)
    if report.bytes_truncated or report.segments_dropped:
        logger.warning(
            "%s: recovery truncated %d bytes, dropped %d segments: %s",
            directory,
            report.bytes_truncated,
            report.segments_dropped,
            report.problem,
        )
    if dropped:
        logger.info("%s: deleted %d segments below the log start %d", directory, dropped, log_start)
    report = RecoveryReport(  # built directly: NamedTuple._replace costs more (per log)
        clean, report.segments_scanned, report.bytes_scanned, report.bytes_truncated,
        report.segments_dropped + dropped, report.problem, first_scanned,
    )
    return segments, max(log_start, segments[0].base_offset), report


def _load_segments(directory, config, bases, first_scan, now_ms, names):
    segments: list[Segment] = []
    scanned: list[Segment] = []
    report = RecoveryReport(False, 0, 0, 0, 0, None)
    interval, entries_max = config.index_interval_bytes, index_entries_max(config)
    for i, base in enumerate(bases):
        expected = segments[-1].next_offset if segments else 0
        if base < expected:  # overlaps its predecessor: cannot be a valid continuation
            report = report._replace(problem=report.problem or f"segment {base} overlaps")
            report = report._replace(
                segments_dropped=report.segments_dropped + _delete_bases(directory, bases[i:])
            )
            break
        seg = Segment.open_existing(directory, base, interval, entries_max, names)
        segments.append(seg)
        if i < first_scan and seg.load_trusted(now_ms):
            continue
        result = _recover_segment(seg, expected, now_ms)
        scanned.append(seg)
        report = result if len(scanned) == 1 else _merge(report, result)  # first: report is empty
        if result.bytes_truncated:  # later segments would not continue a valid prefix
            dropped = _delete_bases(directory, bases[i + 1 :])
            report = report._replace(segments_dropped=report.segments_dropped + dropped)
            break
    return segments, scanned, report


def _recover_segment(seg: Segment, expected: int, now_ms: int) -> RecoveryReport:
    result = seg.recover(expected, now_ms)
    return RecoveryReport(False, 1, result.bytes_scanned, result.bytes_truncated, 0, result.problem)


def _merge(a: RecoveryReport, b: RecoveryReport) -> RecoveryReport:
    return RecoveryReport(
        False,
        a.segments_scanned + b.segments_scanned,
        a.bytes_scanned + b.bytes_scanned,
        a.bytes_truncated + b.bytes_truncated,
        a.segments_dropped + b.segments_dropped,
        a.problem or b.problem,
    )


def _matches_close(active: Segment, state: PartitionState) -> bool:
    return (
        active.next_offset == state.log_end_offset
        and active.size_bytes == state.active_segment_bytes
    )


def _delete_bases(directory: Path, bases: list[int]) -> int:
    for base in bases:
        for suffix in (LOG_SUFFIX, *_SEGMENT_INDEX_SUFFIXES):
            try:
                os.unlink(segment_path(directory, base, suffix))
            except FileNotFoundError:
                pass
    if bases:
        fsync_dir(directory)
    return len(bases)


def _apply_log_start(
    directory: Path, config: LogConfig, segments: list[Segment], log_start: int
) -> tuple[list[Segment], int]:
    """Deletes segments wholly below the log start (left by a crash during retention), and
    makes sure an active segment exists (a new one at the log start if all data is below it)."""
    dropped = 0
    while segments and (
        (len(segments) > 1 and segments[1].base_offset <= log_start)
        or (len(segments) == 1 and segments[0].next_offset < log_start)
    ):
        segments.pop(0).delete()
        dropped += 1
    if not segments:
        segments.append(
            Segment.create(
                directory, log_start, config.index_interval_bytes, index_entries_max(config)
            )
        )
        fsync_dir(directory)
    if dropped:
        fsync_dir(directory)
    return segments, dropped
