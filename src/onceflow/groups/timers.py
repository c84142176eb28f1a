"""Deadlines without threads: the coordinator's purgatory.

Kafka keeps delayed operations (heartbeat expiry, join and sync timeouts) in purgatories
driven by a timer thread. Here a deadline is a key in a heap; `GroupCoordinator.tick`
asks for the keys that are due at `now_ms` and fires them. Rescheduling a key simply
replaces its deadline; stale heap entries are skipped when popped (lazy deletion), and
`claim` makes sure a key fires at most once per scheduling even if another event of
the same tick rescheduled or cancelled it.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable

# When this many stale entries pile up (frequent heartbeats reschedule session
# deadlines), the heap is rebuilt from the live deadlines so memory stays bounded.
STALE_ENTRIES_MAX = 4096


class Timers:
    def __init__(self) -> None:
        self._live: dict[Hashable, tuple[int, int]] = {}  # key -> (deadline_ms, seq)
        self._heap: list[tuple[int, int, Hashable]] = []
        self._seq = itertools.count()

    def schedule(self, key: Hashable, deadline_ms: int) -> None:
        seq = next(self._seq)
        self._live[key] = (deadline_ms, seq)
        heapq.heappush(self._heap, (deadline_ms, seq, key))
        if len(self._heap) > 2 * len(self._live) + STALE_ENTRIES_MAX:
            self._rebuild()

    def cancel(self, key: Hashable) -> None:
        self._live.pop(key, None)

    def deadline_ms(self, key: Hashable) -> int | None:
        entry = self._live.get(key)
        return None if entry is None else entry[0]

    def next_deadline_ms(self) -> int | None:
        while self._heap:
            deadline_ms, seq, key = self._heap[0]
            if self._live.get(key) == (deadline_ms, seq):
                return deadline_ms
            heapq.heappop(self._heap)
        return None

    def due(self, now_ms: int) -> list[tuple[Hashable, int]]:
        """(key, seq) of every live deadline <= now_ms, earliest first; `claim` each
        before firing it."""
        fired: list[tuple[Hashable, int]] = []
        while self._heap and self._heap[0][0] <= now_ms:
            deadline_ms, seq, key = heapq.heappop(self._heap)
            if self._live.get(key) == (deadline_ms, seq):
                fired.append((key, seq))
        return fired

    def claim(self, key: Hashable, seq: int) -> bool:
        """True (and forget the deadline) if `key` is still scheduled as `seq`."""
        entry = self._live.get(key)
        if entry is None or entry[1] != seq:
            return False
        del self._live[key]
        return True

    def __len__(self) -> int:
        return len(self._live)

    def _rebuild(self) -> None:
        self._heap = [(d, s, k) for k, (d, s) in self._live.items()]
        heapq.heapify(self._heap)
