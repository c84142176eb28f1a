"""Incremental fetch sessions (KIP-227): the broker remembers what a client fetches, so
that a fetch of many partitions can name only what changed, and be answered with only
what changed.

Theory of operation, as Kafka's FetchSession.scala decides (facts, not its code):

- The request's (session_id, session_epoch) say what it is. Epoch -1 (FINAL) is a full
  fetch without a session, and closes the session named by a non-zero id. Epoch 0
  (INITIAL) is a full fetch asking for a new session (closing the one named, if any):
  the answer carries the new session's id when the cache has room, else id 0 (the client
  keeps sending full fetches). Any other epoch is an incremental fetch of session
  `session_id`: an unknown id answers FETCH_SESSION_ID_NOT_FOUND, an epoch other than
  the session's next one INVALID_FETCH_SESSION_EPOCH (top-level errors, no partitions).
  A session created by a full fetch expects epoch 1 next; each incremental fetch moves
  it on by one (wrapping from 2^31-1 to 1).
- An incremental request lists only partitions that are new or whose fetch position
  changed (they are added or updated in the session) and `forgotten_topics_data` for
  partitions to drop; all others keep their last fetch offset and limits.
- An incremental answer carries only partitions with something to say: records, an
  error, or a high watermark, last stable offset or log start offset different from
  what the session last answered. A full answer carries every partition.
- A session holds its partitions in request order; one that answered with records moves
  to the end, so that a partition with much data cannot starve the others in the
  shared `max_bytes` (Kafka does the same).
- The cache holds at most `max.incremental.fetch.session.cache.slots` sessions (Kafka's
  default 1000). A new session takes the slot of a session idle for longer than the
  eviction time (2 minutes), else of the smallest session when that one is smaller than
  the new session; otherwise no session is created.
- Sessions named by topic id (Fetch v13+) and by name (v7-12) do not mix: a request whose
  version names topics differently from its session answers FETCH_SESSION_TOPIC_ID_ERROR.
- A session named by topic id remembers each partition's topic name from the first
  request that resolved it (Kafka's CachedPartition keeps the name). After the topic is
  deleted and created again under the same name, an incremental fetch still names the
  old id: the handler finds the name here and answers INCONSISTENT_TOPIC_ID (the log's
  id is not the session's), or UNKNOWN_TOPIC_OR_PARTITION once no topic has the name.

Everything runs on the broker's event loop; nothing here blocks or awaits.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections import OrderedDict
from collections.abc import Hashable, Iterable

__all__ = ("FINAL_EPOCH", "INITIAL_EPOCH", "CachedPartition", "FetchSession",
           "FetchSessionCache", "next_epoch")

INITIAL_EPOCH, FINAL_EPOCH = 0, -1
EVICTION_MS = 120_000      # Kafka: a session unused for 2 minutes may be evicted
SESSION_ID_MAX = 2**31 - 1


def next_epoch(epoch: int) -> int:
    return 1 if epoch >= SESSION_ID_MAX else epoch + 1


# (topic name or topic id, partition index)
PartitionKey = tuple[Hashable, int]


@dataclasses.dataclass(slots=True)
class CachedPartition:
    fetch_offset: int
    partition_max_bytes: int
    # What the session last answered for this partition (-1: never answered).
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    topic_name: str | None = None   # by-id sessions: the name the id was resolved to


@dataclasses.dataclass(slots=True)
class FetchSession:
    session_id: int
    by_id: bool
    node_id: int
    partitions: OrderedDict[PartitionKey, CachedPartition]
    epoch: int = 1                 # the epoch the next incremental request must carry
    last_used_ms: float = 0.0

    def update(self, changed: Iterable[tuple[PartitionKey, int, int]],
               forgotten: Iterable[PartitionKey]) -> None:
        """Apply an incremental request: (key, fetch offset, max bytes) added or updated,
        forgotten partitions dropped."""
        for key, fetch_offset, max_bytes in changed:
            cached = self.partitions.get(key)
            if cached is None:
                self.partitions[key] = CachedPartition(fetch_offset, max_bytes)
            else:
                cached.fetch_offset, cached.partition_max_bytes = fetch_offset, max_bytes
        for key in forgotten:
            self.partitions.pop(key, None)

    def topic_name(self, key: PartitionKey) -> str | None:
        """The topic name `key` was first resolved to (by-id sessions); None if never."""
        cached = self.partitions.get(key)
        return None if cached is None else cached.topic_name

    def resolved(self, key: PartitionKey, topic_name: str) -> None:
        """Remember the name `key` resolved to, unless it already has one (Kafka's
        maybeResolveUnknownName: a cached name is never replaced)."""
        cached = self.partitions.get(key)
        if cached is not None and cached.topic_name is None:
            cached.topic_name = topic_name

    def must_answer(self, key: PartitionKey, *, error: bool, has_records: bool,
                    high_watermark: int, last_stable_offset: int,
                    log_start_offset: int) -> bool:
        """Remember what is answered for `key`; whether an incremental answer includes it."""
        cached = self.partitions[key]
        changed = (cached.high_watermark != high_watermark
                   or cached.last_stable_offset != last_stable_offset
                   or cached.log_start_offset != log_start_offset)
        cached.high_watermark = high_watermark
        cached.last_stable_offset = last_stable_offset
        cached.log_start_offset = log_start_offset
        if has_records:
            self.partitions.move_to_end(key)
        return error or has_records or changed


class FetchSessionCache:
    """The bounded set of live fetch sessions of one broker process."""

    def __init__(self, slots: int, eviction_ms: int = EVICTION_MS) -> None:
        self.slots = slots
        self.eviction_ms = eviction_ms
        self._sessions: dict[int, FetchSession] = {}
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, session_id: int, node_id: int) -> FetchSession | None:
        session = self._sessions.get(session_id)
        if session is None or session.node_id != node_id:
            return None
        session.last_used_ms = _now_ms()
        return session

    def remove(self, session_id: int) -> None:
        self._sessions.pop(session_id, None)

    def create(self, node_id: int, by_id: bool,
               partitions: Iterable[tuple[PartitionKey, int, int]]) -> FetchSession | None:
        """A new session over `partitions`, or None when the cache has no slot for it."""
        cached = OrderedDict((key, CachedPartition(offset, max_bytes))
                             for key, offset, max_bytes in partitions)
        if self.slots <= 0 or (len(self._sessions) >= self.slots and not self._evict(len(cached))):
            return None
        session_id = random.randint(1, SESSION_ID_MAX)
        while session_id in self._sessions:
            session_id = random.randint(1, SESSION_ID_MAX)
        session = FetchSession(session_id, by_id, node_id, cached, last_used_ms=_now_ms())
        self._sessions[session_id] = session
        return session

    def _evict(self, new_size: int) -> bool:
        now = _now_ms()
        stale = [s for s in self._sessions.values() if now - s.last_used_ms > self.eviction_ms]
        if stale:
            victim = min(stale, key=lambda s: s.last_used_ms)
        else:
            victim = min(self._sessions.values(), key=lambda s: (len(s.partitions), s.last_used_ms))
            if len(victim.partitions) >= new_size:
                return False
        del self._sessions[victim.session_id]
        self.evictions += 1
        return True


def _now_ms() -> float:
    return time.monotonic() * 1000
