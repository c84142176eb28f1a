"""`CoordinatorRuntime`: what the group and transaction runtimes share.

Theory of operation
-------------------
Both coordinators (onceflow.groups, onceflow.txn) are sans-IO state machines that keep
their state in a compacted internal topic (`__consumer_offsets`, `__transaction_state`).
Driving one takes the same machinery, which lives here once:

* The topic: created in the background a second after start (issue 15: the first group
  should not wait for 50 partitions' files), or with `internal_topics_at_start=False` on
  first use (`ensure_topic`, from a FindCoordinator) as Kafka does; or, when it exists at
  startup, every partition is marked loading (requests get COORDINATOR_LOAD_IN_PROGRESS)
  and a background task reads each one on a worker thread and hands its entries to
  `load_partition` on the loop.
* Appends (`write`): one coordinator `Append` becomes one batch, appended *synchronously*
  through the partition's producer state with the coordinator's origin, in the order the
  coordinator produced them (replay keeps the newest record per key, so log order must be
  decision order). `persist`/`submit` then wait in a runtime-owned task until the batches
  are durable (the group committer's fsync), call `coordinator.complete` (which replays
  them) and perform the follow-ups it returns (`follow`). A client that disconnects
  cancels only its wait, never the replay.
* Deadlines: after every interaction the loop timer is re-armed at the coordinator's
  `next_deadline_ms()`; when it fires, `on_timer` runs.
* Compaction: once loaded, a `Compactor` (runtime/compaction.py) keeps the topic
  bounded by the number of live keys, rewriting closed segments.
* Routing: one process presents every node and its coordinators hold every partition, but
  a request is answered only by the node leading the key's partition; the others answer
  NOT_COORDINATOR, so clients exercise the same paths as against Kafka.

Subclasses name the topic and its settings and say what a timer, a completed result's
follow-ups and the end of loading do.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, ClassVar

from kio.schema.errors import ErrorCode

from onceflow.broker.runtime import compaction
from onceflow.broker.runtime.log_io import append_batch, read_entries
from onceflow.broker.state import now_ms
from onceflow.groups import Append, Appended, AppendFailed, AppendOutcome, LogEntry
from onceflow.protocol.records import iter_batches
from onceflow.storage.layout import StorageError
from onceflow.storage.producer_state import AppendOrigin, Duplicate, Rejected

if TYPE_CHECKING:
    from onceflow.broker.state import BrokerState, PartitionState
    from onceflow.storage.log import PartitionLog
    from onceflow.storage.store import TopicInfo

# Kafka's smallest segment.bytes for a topic config; below it the test-only
# internal.segment.bytes override is used (tests shrink segments to show compaction).
SEGMENT_BYTES_CONFIG_MIN = 1024 * 1024
# A loop timer may fire a little before the wall clock reaches the deadline (the two
# clocks differ); re-arming this much later avoids a burst of empty ticks.
TIMER_SLACK_MS = 1

# How long after start the internal topics are created when nothing asked for them yet:
# a broker stopped sooner (a short test) never pays for 2 x 50 partitions' files, and
# the broker's own start is not slowed by them.
INTERNAL_TOPICS_DELAY_S = 1.0


def internal_topic_configs(segment_bytes: int) -> dict[str, str]:
    """Kafka's settings of its internal topics: compacted, the producer's compression."""
    segment_key = ("segment.bytes" if segment_bytes >= SEGMENT_BYTES_CONFIG_MIN
                   else "internal.segment.bytes")
    return {"cleanup.policy": "compact", "compression.type": "producer",
            segment_key: str(segment_bytes)}


class CoordinatorRuntime:
    """Drives `self.coordinator` (set by the subclass) over `topic_name`."""

    topic_name: ClassVar[str]
    log: ClassVar[logging.Logger]
    coordinator: Any

    def __init__(self, state: BrokerState, configured_partitions: int) -> None:
        self._state = state
        self.broker_config = state.config
        info = state.topic(self.topic_name)
        self.num_partitions = info.num_partitions if info else configured_partitions
        if self.num_partitions != configured_partitions:
            self.log.warning("%s has %d partitions, not the configured %d: using %d (keys "
                             "would move otherwise)", self.topic_name, self.num_partitions,
                             configured_partitions, self.num_partitions)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._armed_ms: int | None = None
        self._tasks: set[asyncio.Task] = set()
        self._creating: asyncio.Future[TopicInfo] | None = None
        self._closed = False
        self.appended_bytes = 0  # batches written to the topic (benchmarks, stats)
        self.compactor: compaction.Compactor | None = None

    # ------------------------------------------------------------ subclass hooks

    def topic_configs(self) -> dict[str, str]:
        raise NotImplementedError

    @property
    def tombstone_retention_ms(self) -> int:
        """How long compaction keeps a tombstone (Kafka's delete.retention.ms)."""
        raise NotImplementedError

    def load_partition(self, partition: int, entries: list[LogEntry], now: int) -> None:
        """Replay one partition's entries (an empty list for a just-created partition)."""
        self.coordinator.load_partition(partition, entries, now)

    def loaded(self) -> None:
        """Every partition is loaded (or was just created): timers and compaction start."""
        self.arm()
        if self.compactor is None and not self._closed:
            self.compactor = compaction.Compactor(
                self, self.broker_config.offsets_compaction_interval_ms)
            self.spawn(self.compactor.run())

    def on_timer(self, now: int) -> None:
        """The coordinator's deadline came: tick it and perform what the tick asks."""
        self.follow(self.coordinator.tick(now))

    def follow(self, result: Any) -> None:
        """Perform the effects of a completed result besides its response: its appends
        (whose response nobody waits for)."""
        if result.appends and not self._closed:
            self.submit(type(result)(None, result.appends))

    def before_complete(self, result: Any, outcomes: list[AppendOutcome]) -> None:
        """Called once `result`'s appends are durable (or failed), before `complete`."""

    # ------------------------------------------------------------ lifetime

    def start(self) -> None:
        """On the broker's loop: load an existing topic in the background."""
        self._loop = asyncio.get_running_loop()
        info = self.topic()
        if info is not None:
            for partition in range(info.num_partitions):
                self.coordinator.begin_loading(partition)
            self.spawn(self._load_all(info.num_partitions))
        elif self.broker_config.internal_topics_at_start:
            self.spawn(self._create_in_background())

    async def _create_in_background(self) -> None:
        """Create the topic soon after start (BrokerConfig.internal_topics_at_start), so
        the first FindCoordinator finds it ready. A failure (a full disk) is left to the
        first FindCoordinator, which tries again and answers COORDINATOR_NOT_AVAILABLE."""
        await asyncio.sleep(INTERNAL_TOPICS_DELAY_S)
        try:
            await self.ensure_topic()
        except OSError as exc:
            self.log.warning("could not create %s at start: %s", self.topic_name, exc)

    def close(self) -> None:
        """Stop timers and background work. Appends already written are flushed by the
        store's close; their replay is not needed, the next start replays the log."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        for task in list(self._tasks):
            task.cancel()
        if self.compactor is not None:
            self.compactor.close()

    def topic(self) -> TopicInfo | None:
        return self._state.topic(self.topic_name)

    async def ensure_topic(self) -> TopicInfo:
        """Create the topic on first use. The files are created on a worker thread (50
        partitions take a while); concurrent callers share the one creation."""
        if self._creating is None:
            info = self.topic()
            if info is not None:
                return info
            self._creating = asyncio.ensure_future(self._create_topic())
            # retrieved here too: a failure must not be logged as "never retrieved" when
            # the request that started it was cancelled (its connection closed)
            self._creating.add_done_callback(lambda f: f.cancelled() or f.exception())
        return await asyncio.shield(self._creating)

    async def _create_topic(self) -> TopicInfo:
        try:
            info = await asyncio.to_thread(self._state.store.create_topic, self.topic_name,
                                           self.num_partitions, self.topic_configs())
        except BaseException:
            self._creating = None  # the next FindCoordinator tries again
            raise
        now = now_ms()
        for partition in range(self.num_partitions):
            self.load_partition(partition, [], now)  # new, hence empty
        self.loaded()
        self.log.info("created %s with %d partitions", self.topic_name, self.num_partitions)
        return info

    async def _load_all(self, num_partitions: int) -> None:
        """Replay every partition (read on a worker thread, replayed on the loop)."""
        started_ms, total = now_ms(), 0
        for partition in range(num_partitions):
            entries = await asyncio.to_thread(_entries_of, self.partition_log(partition))
            self.load_partition(partition, entries, now_ms())
            total += len(entries)
        self.log.info("loaded %s: %d partitions, %d entries in %d ms", self.topic_name,
                      num_partitions, total, now_ms() - started_ms)
        self.loaded()

    # ------------------------------------------------------------ routing

    def coordinator_node(self, key: str) -> int | None:
        """The node that coordinates `key` (a group or transactional id), None before the
        topic exists."""
        info = self.topic()
        if info is None:
            return None
        return self._state.leader(info, self.coordinator.partition_for(key))

    def route(self, key: str, node_id: int) -> ErrorCode | None:
        """Kafka's answer for a request about `key` that reached `node_id`, None when it is
        ours to answer."""
        node = self.coordinator_node(key)
        if node is None:
            return ErrorCode.coordinator_not_available
        if node != node_id:
            return ErrorCode.not_coordinator
        return None

    # ------------------------------------------------------------ the coordinator's effects

    async def persist(self, result: Any) -> Any:
        """Write `result`'s appends, wait until durable and replayed; the response to send."""
        self.arm()
        if not result.appends:
            return result.response
        return await asyncio.shield(self.submit(result))

    def submit(self, result: Any) -> asyncio.Task:
        """Write `result`'s appends now, in order; a runtime-owned task completes them."""
        assert self._loop is not None, "start() first"
        writes = [self.write(append) for append in result.appends]
        task = self._loop.create_task(self._settle(result, writes))
        self.track(task)
        return task

    async def _settle(self, result: Any, writes: list[tuple[AppendOutcome, Future | None]]) -> Any:
        outcomes = [await self._durable(outcome, flushed) for outcome, flushed in writes]
        self.before_complete(result, outcomes)
        completed = self.coordinator.complete(result, outcomes, now_ms())
        self.follow(completed)
        self.arm()
        return completed.response

    def write(self, append: Append) -> tuple[AppendOutcome, Future | None]:
        """Append one batch (no fsync); the outcome and the flush to wait for.

        Through `PartitionState.append` with the coordinator's origin, so a transactional
        append (TxnOffsetCommit) is checked and tracked by the partition's producer state
        (a fenced producer epoch fails the append, as in Kafka)."""
        partition = self._state.partition(self.topic_name, append.partition)
        if partition is None:
            return AppendFailed(ErrorCode.unknown_topic_or_partition), None
        now = now_ms()
        batch = append_batch(append, now)
        if len(batch) > partition.log.config.max_message_bytes:
            return AppendFailed(ErrorCode.message_too_large), None
        header, _ = next(iter_batches(batch))
        try:
            appended = partition.append([header], [batch], now, origin=AppendOrigin.COORDINATOR)
            if isinstance(appended, Rejected):
                return AppendFailed(appended.error_code), None
            assert not isinstance(appended, Duplicate), "coordinator appends are never retries"
            flushed = self._state.committer.request_flush(partition.log)
            self.appended_bytes += len(batch)
        except (StorageError, RuntimeError) as exc:  # failed or closed log, closed committer
            self.log.error("append to %s-%d failed: %s", self.topic_name, append.partition, exc)
            return AppendFailed(ErrorCode.kafka_storage_error), None
        return Appended(appended.first_offset, now), flushed

    async def _durable(self, outcome: AppendOutcome, flushed: Future | None) -> AppendOutcome:
        if flushed is None:
            return outcome
        if not await self.flushed(flushed):
            return AppendFailed(ErrorCode.kafka_storage_error)
        return outcome

    async def flushed(self, flush: Future) -> bool:
        """Wait for one flush of the group committer; False when the fsync failed."""
        try:
            await asyncio.wrap_future(flush)
        except Exception as exc:  # noqa: BLE001 - an fsync failure, already logged CRITICAL
            self.log.error("flush of %s failed: %s", self.topic_name, exc)
            return False
        return True

    # ------------------------------------------------------------ deadlines

    def arm(self) -> None:
        """(Re)arm the loop timer at the coordinator's next deadline."""
        if self._closed or self._loop is None:
            return
        deadline_ms = self.coordinator.next_deadline_ms()
        if deadline_ms == self._armed_ms:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._armed_ms = deadline_ms
        if deadline_ms is not None:
            delay_ms = max(deadline_ms - now_ms(), 0) + TIMER_SLACK_MS
            self._timer = self._loop.call_later(delay_ms / 1000, self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._armed_ms = None
        self.on_timer(now_ms())
        self.arm()

    # ------------------------------------------------------------ helpers

    def partition_state(self, index: int) -> PartitionState:
        partition = self._state.partition(self.topic_name, index)
        assert partition is not None, f"{self.topic_name}-{index} is missing"
        return partition

    def partition_log(self, index: int) -> PartitionLog:
        return self.partition_state(index).log

    def spawn(self, coroutine) -> asyncio.Task:
        assert self._loop is not None
        task = self._loop.create_task(coroutine)
        self.track(task)
        return task

    def track(self, task: asyncio.Task) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # our bug (the coordinator or this runtime broke an invariant): loud
            self.log.error("%s runtime task failed", self.topic_name, exc_info=task.exception())


def _entries_of(partition_log: PartitionLog) -> list[LogEntry]:
    return list(read_entries(partition_log, partition_log.log_start_offset,
                             partition_log.log_end_offset))
