"""Rewriting one closed segment in place (log compaction), crash-safe at every step.

Theory of operation
-------------------
A compacted topic's cleaner (here: the group runtime's compactor for __consumer_offsets)
decides which batches of a closed segment survive; `PartitionLog.replace_segment` hands
them to this module, which never changes an offset:

1. `stage_segment` writes the kept batches (offsets as they are, gaps allowed) as a
   complete segment - .log and both indexes built by the same `Segment.append` as live
   appends - in the staging directory `<partition>/.cleaned/`, and fsyncs the files.
2. `install_segment` swaps it in: the old segment's indexes are unlinked, the new .log
   is renamed over the old one (atomic), then the new .timeindex and .index are renamed
   into place, and the directory is fsync'd.

Every state a crash can leave is a valid log: a segment without indexes is loaded by
walking its batches (indexes are rebuilt), a time index without an offset index is
truncated by the load, and the old and the new .log each hold valid batches for the same
offset range. The cleaner must rewrite segments oldest first (a record it drops from an
old segment is superseded by one it keeps in a newer segment, so a crash between two
segments never resurrects a deleted key). The staging directory is wiped before each use,
so a crash during staging leaves nothing that matters (recovery ignores directories).
The log cleaner of user topics stages in its own process (storage/cleaner.py
`clean_files`), one directory per segment under `.cleaned/` named by a token of that
cleaning, and the broker installs them; a staged segment is only ever installed by the
cleaning that wrote it, so a child killed mid-write leaves nothing anyone installs.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from onceflow.storage.layout import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    fsync_dir,
    read_header,
    segment_path,
)
from onceflow.storage.segment import Segment, prepare_append
from onceflow.storage.txn_index import TXN_INDEX_SUFFIX, AbortedTxn

STAGING_DIR = ".cleaned"


def stage_segment(directory: Path, base_offset: int, upper_offset: int, batches: list,
                  interval_bytes: int, index_entries_max: int, now_ms: int,
                  aborted: list[AbortedTxn] | None = None, staging: Path | None = None) -> Path:
    """Write `batches` as a fsync'd segment at `base_offset` in the staging directory
    (`staging`, by default `<partition>/.cleaned/`), with `aborted` as its
    aborted-transaction index when given.

    Every batch must lie in [base_offset, upper_offset) (the next segment's base) and
    offsets must increase; they are kept exactly. Returns the staging directory."""
    staging = staging or directory / STAGING_DIR
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    segment = Segment.create(staging, base_offset, interval_bytes, index_entries_max)
    try:
        next_offset = base_offset
        for batch in batches:
            header = read_header(batch)
            if not next_offset <= header.base_offset <= header.last_offset < upper_offset:
                raise ValueError(f"batch {header.base_offset}..{header.last_offset} outside "
                                 f"[{next_offset}, {upper_offset}) of segment {base_offset}")
            segment.append(prepare_append([batch], header.base_offset, None, None), now_ms)
            next_offset = header.last_offset + 1
        for txn in aborted or ():
            segment.txn_index.append(txn)
        segment.txn_index.sync()
        segment.index_dirty = True
        fds = segment.take_dirty_fds()
        try:
            for fd in fds:
                os.fsync(fd)
        finally:
            for fd in fds:
                os.close(fd)
    finally:
        segment.close()
    return staging


def install_segment(directory: Path, staging: Path, base_offset: int,
                    replace_txn_index: bool = False) -> None:
    """Swap the staged segment for the one at `base_offset` (see the module docstring).
    With `replace_txn_index` the staged aborted-transaction index (or none) replaces the
    old one first: it only ever drops entries whose ABORT marker and records are already
    gone from the old .log, so a crash right after leaves a consistent pair."""
    if replace_txn_index:
        staged = segment_path(staging, base_offset, TXN_INDEX_SUFFIX)
        target = segment_path(directory, base_offset, TXN_INDEX_SUFFIX)
        if staged.exists():
            os.replace(staged, target)
        else:
            target.unlink(missing_ok=True)
    for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX):
        try:
            os.unlink(segment_path(directory, base_offset, suffix))
        except FileNotFoundError:
            pass
    for suffix in (LOG_SUFFIX, TIME_INDEX_SUFFIX, INDEX_SUFFIX):
        os.replace(segment_path(staging, base_offset, suffix),
                   segment_path(directory, base_offset, suffix))
    fsync_dir(directory)
    shutil.rmtree(staging, ignore_errors=True)
