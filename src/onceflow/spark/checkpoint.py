"""Reading a Spark streaming checkpoint: which micro-batches are planned, which are done.

Theory of operation. Spark's exactly-once bookkeeping for one streaming query lives in its
checkpoint directory, in two write-ahead logs with one file per micro-batch:

* `offsets/N` is written when batch N is *planned*, before any task runs: a version line
  (`v1`), a JSON line of batch metadata (watermark, timestamp, session settings), then one
  line per source with the end offset of batch N as that source serialises it (`-` for a
  source without one). The onceflow Kafka source writes `{"topic": {"partition": next}}`.
* `commits/N` is written when batch N is *done*: every sink task committed and the driver
  side commit returned.

A batch with `offsets/N` and no `commits/N` is in flight - or was interrupted, and then the
next run of the query replays it with exactly the offsets recorded in `offsets/N`. That is
what makes a replay read the same records, and what the sinks rely on to skip work they
already committed. `metadata` holds the query id, stable across restarts.

Spark writes each file to a temporary name and renames it, so a file we can see is complete;
it also deletes old ones (100 batches are kept by default), so the listings stay bounded.
A driver killed while Spark writes one of these files leaves the temporary file behind
(`.N.<uuid>.tmp` and its checksum `..N.<uuid>.tmp.crc`). Spark ignores such leftovers
except in one place: a query that has no batch yet refuses a checkpoint whose `offsets`
directory is not empty (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY), so a kill during the
very first offsets write would leave the query unable to start again.
`remove_partial_writes` deletes the leftovers; the pipeline runner calls it before it
starts a query, and a hand-written driver should do the same.

Only local directories are read here (a `file:` URI or a path); a cluster's checkpoint on
HDFS or S3 needs Hadoop's tools.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

OFFSETS_DIR = "offsets"
COMMITS_DIR = "commits"
METADATA_FILE = "metadata"
# Spark writes "-" on a source's line when that source has no offset for the batch.
NO_OFFSET = "-"
# Bytes read from one offsets file at most: a few topics' partitions and the session
# settings Spark copies into every file fit easily; anything bigger is not a checkpoint file.
OFFSETS_FILE_BYTES_MAX = 4 * 1024 * 1024


# What Hadoop's rename-based atomic write leaves when it dies before the rename: a hidden
# temporary file named after the target and a random UUID, and its hidden checksum file.
PARTIAL_WRITE = re.compile(r"^\.{1,2}.+\.[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-"
                           r"[0-9a-f]{12}\.tmp(\.crc)?$")


class CheckpointError(Exception):
    """A directory that is not a Spark streaming checkpoint, or a file we cannot read."""


@dataclasses.dataclass(frozen=True)
class BatchOffsets:
    """What `offsets/N` says: the batch id, when it was planned, each source's end offset."""

    batch_id: int
    timestamp_ms: int | None
    source_offsets: tuple[Any, ...]  # parsed JSON per source; None where Spark wrote "-"


@dataclasses.dataclass(frozen=True)
class CheckpointState:
    """One query's checkpoint at one moment."""

    path: Path
    query_id: str | None
    last_planned: int | None  # highest N with offsets/N
    last_committed: int | None  # highest N with commits/N
    in_flight: tuple[int, ...]  # planned, not committed: replayed with the same offsets
    planned_offsets: BatchOffsets | None  # offsets/last_planned
    committed_offsets: BatchOffsets | None  # offsets/last_committed: what the sinks hold


def local_path(checkpoint: str | Path) -> Path:
    """A checkpoint location as a local path (`file:` URIs included)."""
    text = str(checkpoint)
    if text.startswith("file://"):
        return Path(text.removeprefix("file://"))
    if text.startswith("file:"):
        return Path(text.removeprefix("file:"))
    if "://" in text:
        raise CheckpointError(f"{text}: only local checkpoints (a path or a file: URI) can be read "
                              "here; copy the checkpoint to this machine first (for HDFS: "
                              f"hdfs dfs -get {text} DIR) and give DIR")
    return Path(text)


def remove_partial_writes(checkpoint: str | Path) -> list[Path]:
    """Delete the temporary files a killed driver left in a query checkpoint (see the module
    docstring); returns them. Call it only while no query runs on this checkpoint: a live
    query's write in progress would fail. A missing directory has nothing to remove."""
    root = local_path(checkpoint)
    if not root.is_dir():
        return []
    removed = []
    for path in sorted(root.rglob(".*.tmp*")):
        if path.is_file() and PARTIAL_WRITE.match(path.name):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def batches_planned(checkpoint: str | Path) -> set[int]:
    """Batch ids whose offsets Spark has written (planned, running or done)."""
    return _batch_ids(local_path(checkpoint) / OFFSETS_DIR)


def batches_committed(checkpoint: str | Path) -> set[int]:
    """Batch ids Spark has marked done in its commit log."""
    return _batch_ids(local_path(checkpoint) / COMMITS_DIR)


def batches_in_flight(checkpoint: str | Path) -> list[int]:
    """Planned and not committed, oldest first."""
    return sorted(batches_planned(checkpoint) - batches_committed(checkpoint))


def _batch_ids(directory: Path) -> set[int]:
    # Spark's temporary files start with a dot and its checksums end in .crc: only the
    # bare numbers are log entries.
    try:
        return {int(entry.name) for entry in directory.iterdir() if entry.name.isdigit()}
    except FileNotFoundError:
        return set()


def read_offsets(checkpoint: str | Path, batch_id: int) -> BatchOffsets:
    """Parse `offsets/<batch_id>`."""
    path = local_path(checkpoint) / OFFSETS_DIR / str(batch_id)
    try:
        with open(path, "rb") as file:
            raw = file.read(OFFSETS_FILE_BYTES_MAX + 1)
    except OSError as exc:
        raise CheckpointError(f"{path}: {exc.strerror or exc}") from exc
    if len(raw) > OFFSETS_FILE_BYTES_MAX:
        raise CheckpointError(f"{path}: larger than {OFFSETS_FILE_BYTES_MAX} bytes")
    lines = raw.decode("utf-8", errors="replace").splitlines()
    if len(lines) < 2 or not lines[0].startswith("v"):
        raise CheckpointError(f"{path}: not a Spark offsets file (no version line)")
    metadata = _json_or_text(lines[1])
    timestamp_ms = metadata.get("batchTimestampMs") if isinstance(metadata, dict) else None
    offsets = tuple(None if line == NO_OFFSET else _json_or_text(line) for line in lines[2:])
    return BatchOffsets(batch_id, timestamp_ms, offsets)


def _json_or_text(line: str) -> Any:
    # Spark's own sources write plain numbers or text; Python sources write JSON.
    try:
        return json.loads(line)
    except ValueError:
        return line


def query_id(checkpoint: str | Path) -> str | None:
    path = local_path(checkpoint) / METADATA_FILE
    try:
        return str(json.loads(path.read_text())["id"])
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path}: not a Spark query metadata file ({exc})") from exc


def is_query_checkpoint(path: Path) -> bool:
    return (path / METADATA_FILE).is_file() or (path / OFFSETS_DIR).is_dir()


def query_checkpoints(root: str | Path) -> list[Path]:
    """The query checkpoints at `root`: root itself, or its subdirectories (a pipeline's
    checkpoint holds one per sink), sorted by name."""
    path = local_path(root)
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such directory")
    if is_query_checkpoint(path):
        return [path]
    return sorted(child for child in path.iterdir() if child.is_dir() and is_query_checkpoint(child))


def read_state(checkpoint: str | Path) -> CheckpointState:
    """The query's planned and committed batches and their offsets."""
    path = local_path(checkpoint)
    planned, committed = batches_planned(path), batches_committed(path)
    last_planned = max(planned, default=None)
    last_committed = max(committed, default=None)
    return CheckpointState(
        path=path,
        query_id=query_id(path),
        last_planned=last_planned,
        last_committed=last_committed,
        in_flight=tuple(sorted(planned - committed)),
        planned_offsets=None if last_planned is None else read_offsets(path, last_planned),
        committed_offsets=_committed_offsets(path, last_committed, planned),
    )


def _committed_offsets(path: Path, last_committed: int | None,
                       planned: set[int]) -> BatchOffsets | None:
    # Spark may already have purged offsets files older than its retention window.
    if last_committed is None or last_committed not in planned:
        return None
    return read_offsets(path, last_committed)


def wait_mid_batch(checkpoints: Iterable[str | Path], after_batch: int = -1,
                   timeout_s: float = 120.0, poll_s: float = 0.02) -> tuple[Path, int]:
    """Wait until one of the query checkpoints has a batch later than `after_batch` planned
    and not yet committed; return (that checkpoint, batch id).

    Polled, so a batch shorter than `poll_s` can slip through; a caller that kills the
    driver on return should check `batches_committed` afterwards to know what it hit.
    """
    paths: Sequence[Path] = [local_path(c) for c in checkpoints]
    deadline = time.monotonic() + timeout_s
    while True:
        for path in paths:
            later = [b for b in batches_in_flight(path) if b > after_batch]
            if later:
                return path, later[0]
        if time.monotonic() >= deadline:
            raise TimeoutError(f"no micro-batch after {after_batch} in flight under "
                               f"{', '.join(map(str, paths))} within {timeout_s:.0f} s")
        time.sleep(poll_s)
