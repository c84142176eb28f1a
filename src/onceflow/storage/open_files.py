"""`OpenFiles`: a process-wide LRU of open segment files, so that the broker's open
descriptors are bounded by `log.max.open.files` (onceflow's own setting; Kafka has none and
keeps every segment open) rather than by the partition count.

Theory of operation
-------------------
A `Segment` opens its `.log` lazily through `Segment.fd` and registers it here; each use
moves it to the front. When more than `files_max` are open, the least recently used segments
are closed; their next use reopens the file (same path, same flags, no state lost: a
segment's valid size, indexes and offsets live in memory, and an fsync through a new
descriptor flushes the same inode).

Closing a descriptor while another thread uses it would let the number be reused by an
unrelated file, so a segment is evicted only when its owner's lock (the `PartitionLog` lock
that guards every file access of that log) can be taken without waiting; a segment whose log
is busy, or that has no owner yet (recovery, staging), stays open and is tried again at the
next eviction. The cap is therefore soft by at most the segments in use at that moment.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Protocol

# Default cap on open segment files. The soft RLIMIT_NOFILE is raised to the hard limit at
# broker start; this leaves room under a typical 1024..65536 limit for sockets, producer-state
# files and transaction indexes.
OPEN_FILES_MAX_DEFAULT = 1000


class Evictable(Protocol):
    guard: threading.Lock | None

    def release_fd(self) -> None: ...


class OpenFiles:
    def __init__(self, files_max: int = OPEN_FILES_MAX_DEFAULT) -> None:
        if files_max < 1:
            raise ValueError("log.max.open.files must be at least 1")
        self.files_max = files_max
        self._lock = threading.Lock()
        self._open: OrderedDict[int, Evictable] = OrderedDict()  # id(segment) -> segment
        self.reopens = 0  # descriptors opened again after an eviction (statistics)

    def __len__(self) -> int:
        return len(self._open)

    def touch(self, seg: Evictable, reopened: bool = False) -> None:
        """Marks `seg` (whose descriptor is open) as the most recently used; evicts others
        past the cap. The caller holds `seg`'s guard, if it has one."""
        with self._lock:
            key = id(seg)
            if key in self._open:
                self._open.move_to_end(key)
                return
            self._open[key] = seg
            if reopened:
                self.reopens += 1
            if len(self._open) > self.files_max:
                self._evict_locked(seg)

    def forget(self, seg: Evictable) -> None:
        """The segment closed its descriptor itself."""
        with self._lock:
            self._open.pop(id(seg), None)

    def _evict_locked(self, keep: Evictable) -> None:
        excess = len(self._open) - self.files_max
        victims: list[int] = []
        for key, seg in self._open.items():  # oldest first; stops once enough are closed
            if len(victims) >= excess:
                break
            guard = seg.guard
            if seg is keep or guard is None or not guard.acquire(blocking=False):
                continue
            try:
                seg.release_fd()
            finally:
                guard.release()
            victims.append(key)
        for key in victims:
            del self._open[key]

    def set_files_max(self, files_max: int) -> None:
        if files_max < 1:
            raise ValueError("log.max.open.files must be at least 1")
        with self._lock:
            self.files_max = files_max


OPEN_FILES = OpenFiles()
