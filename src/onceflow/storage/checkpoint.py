"""The data directory's recovery checkpoint: every log's recovery point in one file, and the
clean-shutdown marker (Kafka: `recovery-point-offset-checkpoint` plus `.kafka_cleanshutdown`).

Theory of operation
-------------------
`recovery-point-offset-checkpoint` is a checked file (layout.py: magic, version, length,
CRC-32C, replaced atomically with fsyncs) holding a `clean` flag and, per log, the topic id,
partition, log start, recovery point, log end and active segment bytes (a `PartitionState`).

* `Store.close` writes it with `clean` set after every log closed (flushed): the next start
  takes each log's state from it, trusts every segment whose files match it, and reads
  nothing else per log before loading the segments (no `partition.state` read, no rewrite).
  The logs' state files are not rewritten at that close (this file is their clean state;
  docs/logs.md "Shutdown" says why nothing a restart needs is lost), unless writing this
  file fails.
* The broker writes it every `RECOVERY_CHECKPOINT_INTERVAL_MS` with `clean` unset: after a
  crash each log re-validates only from the newer of its own `partition.state` recovery point
  and the checkpoint's, so a log with nothing past its recovery point needs no scan beyond
  its last segment.
* At start, a checkpoint that says `clean` is rewritten without the flag before any log can
  change (one write for the whole directory, where each log's state file had to be rewritten
  and fsync'd before), so a crash later in the run is never taken for a clean stop.

Only a checkpoint that says `clean` makes a log clean: with it missing, corrupt or unclean a
`partition.state` clean flag is not trusted (it may be left from an earlier clean stop), so
a damaged checkpoint costs a re-validation of each log's tail, never data. Entries are keyed
by topic id, so a topic deleted and created again under the same name ignores the old ones.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from onceflow.storage.layout import (
    CorruptFileError,
    PartitionState,
    read_checked_file,
    write_checked_file,
)

RECOVERY_CHECKPOINT_FILE = "recovery-point-offset-checkpoint"  # Kafka's name
RECOVERY_CHECKPOINT_MAGIC = b"OFRC"
RECOVERY_CHECKPOINT_VERSION = 1
# Kafka's default log.flush.offset.checkpoint.interval.ms.
RECOVERY_CHECKPOINT_INTERVAL_MS = 60_000

_HEAD = struct.Struct(
    ">B"  # clean: 1 when written by Store.close after every log closed
    "I"  # entry count
)
_ENTRY = struct.Struct(
    ">16s"  # topic id
    "i"  # partition
    "q"  # log_start_offset
    "q"  # recovery_point_offset: every offset below it was fsync'd
    "B"  # this log closed cleanly (counts only when the file is clean)
    "q"  # log_end_offset at the time of writing
    "q"  # bytes of the active segment at the time of writing
)


class CheckpointEntry(NamedTuple):
    topic_id: uuid.UUID
    partition: int
    state: PartitionState


class RecoveryCheckpoint(NamedTuple):
    clean: bool
    entries: list[CheckpointEntry]


def write_recovery_checkpoint(data_dir: Path, clean: bool, entries: Iterable[CheckpointEntry],
                              fsync: bool = True) -> None:
    """Replaces the checkpoint atomically (temp file, fsync, rename, fsync of the directory)."""
    body = [_ENTRY.pack(e.topic_id.bytes, e.partition, e.state.log_start_offset,
                        e.state.recovery_point_offset, 1 if e.state.clean_shutdown else 0,
                        e.state.log_end_offset, e.state.active_segment_bytes)
            for e in entries]
    payload = _HEAD.pack(1 if clean else 0, len(body)) + b"".join(body)
    write_checked_file(data_dir / RECOVERY_CHECKPOINT_FILE, RECOVERY_CHECKPOINT_MAGIC,
                       RECOVERY_CHECKPOINT_VERSION, payload, fsync)


def read_recovery_checkpoint(data_dir: Path) -> RecoveryCheckpoint | None:
    """The checkpoint, None when there is none. Raises CorruptFileError."""
    path = data_dir / RECOVERY_CHECKPOINT_FILE
    try:
        _, payload = read_checked_file(path, RECOVERY_CHECKPOINT_MAGIC,
                                       (RECOVERY_CHECKPOINT_VERSION,))
    except FileNotFoundError:
        return None
    if len(payload) < _HEAD.size:
        raise CorruptFileError(f"{path}: payload of {len(payload)} bytes")
    clean, count = _HEAD.unpack_from(payload, 0)
    if clean not in (0, 1) or len(payload) != _HEAD.size + count * _ENTRY.size:
        raise CorruptFileError(f"{path}: header does not match the payload")
    entries = []
    for fields in _ENTRY.iter_unpack(memoryview(payload)[_HEAD.size:]):
        topic_id, partition, start, recovery, entry_clean, end, active_bytes = fields
        if (partition < 0 or start < 0 or recovery < 0 or end < 0 or active_bytes < 0
                or entry_clean not in (0, 1)):
            raise CorruptFileError(f"{path}: field out of range")
        entries.append(CheckpointEntry(uuid.UUID(bytes=topic_id), partition, PartitionState(
            start, recovery, entry_clean == 1, end, active_bytes)))
    return RecoveryCheckpoint(clean == 1, entries)


__all__ = ["RECOVERY_CHECKPOINT_FILE", "RECOVERY_CHECKPOINT_INTERVAL_MS", "CheckpointEntry",
           "RecoveryCheckpoint", "read_recovery_checkpoint", "write_recovery_checkpoint"]
