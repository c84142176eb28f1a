"""Out-of-order commit control for one partition: a pure sliding window of offsets.

Theory of operation
-------------------
The subscription loop registers every fetched offset of a partition, in increasing
order, before handing the record to a worker. Workers finish records in any order
(different keys run concurrently), and each finished offset is reported with
`complete()`. The window keeps the registered offsets in fetch order together with
the set of those still incomplete:

    registered (deque):  12  13  14  16  17  18        (15 was a control record)
    incomplete (set):        13          17
    watermark:               13

The **watermark** is the offset to commit: the first incomplete offset, or one past
the last registered offset when all are complete (the exclusive end of the contiguous
completed run). Committing it is always safe for at-least-once: every record below it
is done, and it never passes an offset that is still pending, whatever order the
completions arrive in. When the head of the window completes, the window slides: the
retired prefix is dropped, so memory is proportional to the span between the oldest
incomplete offset and the newest fetched one, never to the partition length.

The window is bounded (`capacity`): `register()` refuses an offset when full, which is
how the caller's backpressure (pause the partition) becomes a hard memory bound.

Offsets between two consecutive registered offsets were never delivered to us (control
batches, compacted or aborted records), so a run of consecutive completed *registered*
offsets is reported as one half-open range (`completed_ranges`); that is what the offset
map in the commit metadata encodes.

No Kafka, no threads, no clock: the caller serialises access (the subscription thread
owns every window).
"""

from __future__ import annotations

from collections import deque

FULL = 0  # offer(): the window holds `capacity` offsets
BEHIND = -1  # offer(): the offset is below the next expected one (a re-delivery)


class WindowFull(Exception):
    """`register()` was called on a window that already holds `capacity` offsets."""


class OffsetWindow:
    """Completion state of the fetched-but-not-yet-retired offsets of one partition.

    All offset ranges here are half-open: `[start, end)`.
    """

    __slots__ = ("_capacity", "_incomplete", "_next_offset", "_offsets")

    def __init__(self, capacity: int, start_offset: int | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self._capacity = capacity
        # Registered offsets not yet retired, in increasing order.
        self._offsets: deque[int] = deque()
        # The subset of `_offsets` still waiting for completion.
        self._incomplete: set[int] = set()
        # One past the last registered offset; before the first registration, the
        # position the partition starts from (its committed offset), if known.
        self._next_offset = start_offset

    # -- queries ---------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def watermark(self) -> int | None:
        """Exclusive end of the contiguous completed run: the offset to commit.

        None when nothing was registered and no start offset is known.
        """
        if self._offsets:
            return self._offsets[0]
        return self._next_offset

    @property
    def next_offset(self) -> int | None:
        """One past the last registered offset (or the start offset)."""
        return self._next_offset

    @property
    def size(self) -> int:
        """Offsets held: registered and not yet below the watermark (the pending count)."""
        return len(self._offsets)

    @property
    def incomplete_count(self) -> int:
        return len(self._incomplete)

    @property
    def has_room(self) -> bool:
        return len(self._offsets) < self._capacity

    def is_incomplete(self, offset: int) -> bool:
        return offset in self._incomplete

    def completed_ranges(self) -> list[tuple[int, int]]:
        """Completed offsets above the watermark as sorted, disjoint `[start, end)` ranges.

        Consecutive registered offsets that are all complete form one range, even when
        offsets between them were never registered (they were not records for us).
        """
        ranges: list[tuple[int, int]] = []
        run_start: int | None = None
        previous = 0
        for offset in self._offsets:
            if offset in self._incomplete:
                if run_start is not None:
                    ranges.append((run_start, previous + 1))
                    run_start = None
            elif run_start is None:
                run_start = offset
            previous = offset
        if run_start is not None:
            ranges.append((run_start, previous + 1))
        return ranges

    # -- updates ---------------------------------------------------------------------

    def register(self, offset: int) -> None:
        """Add a fetched offset; offsets must be registered in increasing order."""
        if self._next_offset is not None and offset < self._next_offset:
            raise ValueError(f"offset {offset} registered after {self._next_offset - 1}")
        if len(self._offsets) >= self._capacity:
            raise WindowFull(f"window holds {self._capacity} offsets")
        self._offsets.append(offset)
        self._incomplete.add(offset)
        self._next_offset = offset + 1

    def offer(self, offset: int) -> int:
        """`register()` for the subscription's hot path, without exceptions: returns the
        new size, FULL (nothing registered), or BEHIND (offset already passed)."""
        offsets = self._offsets
        size = len(offsets)
        if size >= self._capacity:
            return FULL
        next_offset = self._next_offset
        if next_offset is not None and offset < next_offset:
            return BEHIND
        offsets.append(offset)
        self._incomplete.add(offset)
        self._next_offset = offset + 1
        return size + 1

    def complete(self, offset: int) -> bool:
        """Mark a registered offset done; returns False if it was not pending."""
        incomplete = self._incomplete
        if offset not in incomplete:
            return False
        incomplete.discard(offset)
        offsets = self._offsets
        if offsets[0] == offset:
            # The head finished: retire the completed prefix.
            offsets.popleft()
            while offsets and offsets[0] not in incomplete:
                offsets.popleft()
        return True
