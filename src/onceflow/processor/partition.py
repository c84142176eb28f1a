"""Everything the processor holds for one assigned partition: `PartitionContext`.

Theory of operation
-------------------
A fetched record goes through three stages, all owned by the subscription thread
except the lanes:

    accept()     registers its offset in the OffsetWindow (refused when the window is
                 full: the caller pauses the partition and seeks back), or completes it
                 at once if the offset map says an earlier owner already did it;
    ready queue  FIFO of accepted records not yet handed to a lane; dispatch() moves
                 them on, in order, while the head is due (retry back-off), the rate
                 limit has a token and no lane resize is in progress; records with a
                 blocked key are completed without running;
    lanes        per-key FIFOs run by the engine (lanes.py).

`complete()` marks a finished record in the window; the watermark then gives the
commit position, and the offset map (offset_map.py) the completed offsets above it.
Ranges from the map we were assigned with, not yet reached by the fetch position, are
carried into every new map (as `required` ranges), so a commit never forgets what an
earlier commit promised.

`stopping` tells the lanes to start nothing more (revoke, lost, rewind). `outstanding`
is the number of started records not yet complete: the revoke path waits for it to
reach zero. No Kafka client is used here; times are parameters.
"""

from __future__ import annotations

from collections import deque

from onceflow.processor import offset_map
from onceflow.processor.lanes import Lane, Mailbox
from onceflow.processor.metrics import LatencyHistogram, PartitionCounters
from onceflow.processor.ratelimit import TokenBucket
from onceflow.processor.record import Output, Record
from onceflow.processor.routing import RoundRobin, lane_for_key
from onceflow.processor.window import BEHIND, OffsetWindow

Range = tuple[int, int]
NO_WAKE = None
RESIZE_CHECK_MS = 5  # while lanes drain for a resize, look again this soon


class CommitPosition:
    """What to commit for one partition: offset, metadata, and the ranges it covers."""

    __slots__ = ("covered", "metadata", "offset")

    def __init__(self, offset: int, metadata: str, covered: list[Range]) -> None:
        self.offset = offset
        self.metadata = metadata
        self.covered = covered

    def covers(self, position: int) -> bool:
        if position < self.offset:
            return True
        return any(start <= position < end for start, end in self.covered)


class PartitionContext:
    def __init__(
        self,
        topic: str,
        partition: int,
        *,
        max_pending_records: int,
        start_offset: int | None,
        done_ranges: list[Range] | None,
        concurrency: int,
        mailbox: Mailbox,
        counters: PartitionCounters,
        latency: LatencyHistogram,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.window = OffsetWindow(max_pending_records, start_offset)
        self.start_offset = start_offset
        self.first_position: int | None = None  # the first offset ever registered
        self.committed: tuple[int, str] | None = (
            (start_offset, "") if start_offset is not None else None
        )
        self.ready: deque[Record] = deque()
        self.lanes = [Lane(self) for _ in range(concurrency)]
        self.mailbox = mailbox
        self.counters = counters
        self.latency = latency
        self.bucket: TokenBucket | None = None
        self._rate_per_s: float | None = None
        self.stopping = False  # lanes start nothing more
        self.closed = False  # results are ignored
        self.paused = False
        self.finished = 0  # started records that completed
        # Exactly-once mode: outputs of completed records, by position, until the
        # transaction that commits their offsets.
        self.outputs: dict[int, list[Output]] = {}
        self._done_ranges: deque[Range] = deque(done_ranges or ())
        self._round_robin = RoundRobin()
        self._resize_to: int | None = None
        self._retired_started = 0

    def __repr__(self) -> str:
        return f"PartitionContext({self.topic}[{self.partition}])"

    # -- intake ----------------------------------------------------------------------

    def accept(self, record: Record) -> bool:
        """Register a fetched record; False when the window is full (not registered)."""
        position = record._position
        size = self.window.offer(position)
        if size <= 0:
            return size == BEHIND  # a re-delivery of a registered offset: nothing to do
        if self.first_position is None:
            self.first_position = position
        counters = self.counters
        counters.pending_max = max(counters.pending_max, size)
        if self._done_ranges and self._already_done(position):
            self.window.complete(position)
            counters.skipped += 1
            return True
        record._ctx = self
        self.ready.append(record)
        return True

    def _already_done(self, position: int) -> bool:
        ranges = self._done_ranges
        while ranges and ranges[0][1] <= position:
            ranges.popleft()
        return bool(ranges) and ranges[0][0] <= position

    # -- dispatch --------------------------------------------------------------------

    def dispatch(
        self, now_ms: int, blocked_keys: frozenset[bytes], batches: list[tuple[Lane, list[Record]]]
    ) -> int | None:
        """Move due records from the ready queue to lanes (appending to `batches`).

        Returns the monotonic time at which more records become due, if the queue is
        held back by a back-off or the rate limit, else None.
        """
        if self.stopping or not self.ready or not self._lanes_ready():
            return now_ms + RESIZE_CHECK_MS if self._resize_to is not None else NO_WAKE
        ready, lanes, bucket = self.ready, self.lanes, self.bucket
        count = len(lanes)
        per_lane: dict[int, list[Record]] = {}
        wake_ms = NO_WAKE
        while ready:
            record = ready[0]
            if record._not_before_ms > now_ms:
                wake_ms = record._not_before_ms
                break
            key = record.key
            if key is not None and key in blocked_keys:
                ready.popleft()
                self.window.complete(record._position)
                self.counters.skipped += 1
                continue
            if bucket is not None and not bucket.try_take(now_ms):
                wake_ms = now_ms + bucket.wait_ms(now_ms)
                break
            ready.popleft()
            index = lane_for_key(key, count) if key is not None else self._round_robin.lane(count)
            lane_records = per_lane.get(index)
            if lane_records is None:
                per_lane[index] = [record]
            else:
                lane_records.append(record)
        batches.extend((lanes[index], records) for index, records in per_lane.items())
        return wake_ms

    def set_concurrency(self, concurrency: int) -> None:
        """Takes effect once every current lane is idle, so no key runs in two lanes."""
        if concurrency != len(self.lanes) or self._resize_to is not None:
            self._resize_to = concurrency

    def _lanes_ready(self) -> bool:
        if self._resize_to is None:
            return True
        if not all(lane.idle for lane in self.lanes):
            return False
        if self._resize_to != len(self.lanes):
            self._retired_started += sum(lane.started for lane in self.lanes)
            self.lanes = [Lane(self) for _ in range(self._resize_to)]
        self._resize_to = None
        return True

    def set_rate_limit(self, rate_per_s: float | None, now_ms: int) -> None:
        if rate_per_s == self._rate_per_s and (self.bucket is not None) == bool(rate_per_s):
            return  # unchanged: keep the bucket's state
        self._rate_per_s = rate_per_s
        self.bucket = TokenBucket(rate_per_s, now_ms) if rate_per_s else None

    # -- completion ------------------------------------------------------------------

    def complete(self, record: Record) -> None:
        """A started record is done (its outputs delivered or buffered)."""
        if self.window.complete(record._position):
            self.finished += 1

    def force_complete(self, position: int) -> None:
        """Complete an offset that never ran (e.g. could not be retried)."""
        self.window.complete(position)

    @property
    def outstanding(self) -> int:
        """Started records not complete yet (running, deferred, awaiting delivery)."""
        started = self._retired_started + sum(lane.started for lane in self.lanes)
        return started - self.finished

    # -- commit ----------------------------------------------------------------------

    def commit_position(self, offset_map_bytes_max: int) -> CommitPosition | None:
        watermark = self.window.watermark
        if watermark is None:
            return None
        if offset_map_bytes_max <= 0:
            return CommitPosition(watermark, "", [])
        metadata, covered = offset_map.encode(
            watermark,
            self.window.completed_ranges(),
            offset_map_bytes_max,
            required=self._carried_ranges(),
        )
        return CommitPosition(watermark, metadata, covered)

    def _carried_ranges(self) -> list[Range]:
        """Ranges of the assigned map that the fetch position has not reached yet."""
        next_offset = self.window.next_offset
        carried = []
        for start, end in self._done_ranges:
            if next_offset is not None:
                start = max(start, next_offset)
            if start < end:
                carried.append((start, end))
        return carried

    def needs_commit(self, position: CommitPosition) -> bool:
        return self.committed != (position.offset, position.metadata)

    def mark_committed(self, position: CommitPosition) -> None:
        self.committed = (position.offset, position.metadata)

    def take_outputs(self, position: CommitPosition) -> list[Output]:
        """Exactly-once: remove and return the buffered outputs `position` covers."""
        taken: list[Output] = []
        for offset in [o for o in self.outputs if position.covers(o)]:
            taken.extend(self.outputs.pop(offset))
        return taken

    def refresh_gauges(self) -> None:
        counters = self.counters
        counters.pending = self.window.size
        counters.paused = int(self.paused)
        next_offset = self.window.next_offset
        if next_offset is not None and self.committed is not None:
            counters.commit_lag = next_offset - self.committed[0]
