"""The subscription loop: one consumer feeding every assigned partition's context.

Theory of operation
-------------------
One thread owns the consumer and every `PartitionContext`. Each tick it:

1. applies changed run-time properties (concurrency, rate limit, blocked keys);
2. drains the mailbox: finished records are completed in their partition's window
   (after their outputs are acknowledged, or buffered for the next transaction);
   failures become retry or dead-letter outputs; deferred records get a deadline;
3. force-completes deferred records whose deadline passed;
4. hands due records to lanes (`dispatch`);
5. pauses partitions whose window is full and resumes drained ones (backpressure);
6. polls a batch with `consume()` and registers each record with its partition
   (`accept`). A record that does not fit stops that partition for this batch: the
   partition is paused and seeked back to that record, so nothing is buffered beyond
   the window and nothing is skipped;
7. every `commit_interval_ms`, commits (offsets, or one transaction).

Rebalances arrive as callbacks inside `consume()`, on this same thread:

- assigned: read the committed offsets *with their metadata*, decode the offset maps,
  create contexts, then assign (incrementally under cooperative-sticky);
- revoked: stop the lanes of those partitions, wait (bounded) for their in-flight
  records, commit, and forget them; the client releases them after the callback;
- lost: forget them at once, without committing (another member may own them).

Shutdown drains every fetched record (bounded by `shutdown_timeout_ms`), commits,
and closes the consumer. In exactly-once mode an aborted transaction triggers a
rewind: all partitions stop, wait for in-flight records, then restart from their
committed offsets (and maps) with fresh contexts.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from typing import Any

from confluent_kafka import OFFSET_INVALID, KafkaError, KafkaException, TopicPartition

from onceflow.processor import offset_map
from onceflow.processor.commit import OffsetCommitter, OutputProducer, TransactionalCommitter
from onceflow.processor.config import ProcessorConfig, Properties
from onceflow.processor.errors import ProcessorError
from onceflow.processor.lanes import Lane, Mailbox
from onceflow.processor.metrics import ProcessorMetrics
from onceflow.processor.partition import PartitionContext
from onceflow.processor.record import Completion, Output, Record
from onceflow.processor.retry import failure_output, parse_retry_headers, retry_topic_for

log = logging.getLogger(__name__)

PAUSED_POLL_TIMEOUT_MS = 10  # while a partition is paused, look at completions this often
DRAIN_TICK_S = 0.005  # while draining, look at completions this often
COMMITTED_FETCH_TIMEOUT_S = 10.0  # reading committed offsets on assignment
COMMITTED_FETCH_ATTEMPTS = 3
FINAL_COMMIT_TIMEOUT_MS = 10_000  # shutdown: retry the last commit through a rebalance
FINAL_COMMIT_POLL_S = 0.1
PartitionKey = tuple[str, int]


class Clock:
    """Monotonic time for intervals and deadlines; wall time for retry headers."""

    def now_ms(self) -> int:
        return time.monotonic_ns() // 1_000_000

    def wall_ms(self) -> int:
        return time.time_ns() // 1_000_000


class PropertiesBox:
    """The current run-time properties, swapped atomically by other threads."""

    def __init__(self, initial: Properties) -> None:
        self._lock = threading.Lock()
        self._value = initial
        self.version = 0

    def get(self) -> Properties:
        return self._value

    def update(self, **changes: Any) -> Properties:
        with self._lock:
            self._value = self._value.replace(**changes)
            self.version += 1
            return self._value


class Subscription:
    def __init__(
        self,
        *,
        consumer: Any,
        topics: list[str],
        group_id: str,
        engine: Any,
        mailbox: Mailbox,
        config: ProcessorConfig,
        properties: PropertiesBox,
        metrics: ProcessorMetrics,
        committer: OffsetCommitter | TransactionalCommitter,
        outputs: OutputProducer | None,
        cooperative: bool,
        clock: Clock,
        stop: threading.Event,
    ) -> None:
        self._consumer = consumer
        self._group_id = group_id
        self._engine = engine
        self._mailbox = mailbox
        self._config = config
        self._properties = properties
        self._properties_version = properties.version
        self._metrics = metrics
        self._committer = committer
        self._outputs = outputs
        self._cooperative = cooperative
        self._clock = clock
        self._stop = stop
        self._eos = isinstance(committer, TransactionalCommitter)
        self._retry_topic = retry_topic_for(config.retry, group_id) if config.retry else None
        self._topics = [*topics, self._retry_topic] if self._retry_topic else list(topics)
        self.contexts: dict[PartitionKey, PartitionContext] = {}
        self._deadlines: list[tuple[int, int, Completion]] = []
        self._sequence = itertools.count()
        self._last_commit_ms = clock.now_ms()
        self._rewind_needed = False
        self._shutting_down = False
        self._closing = False

    # -- the loop --------------------------------------------------------------------

    def run(self) -> None:
        self._consumer.subscribe(
            self._topics,
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )
        try:
            while not self._stop.is_set():
                self._tick()
        finally:
            self._shutdown()

    def _tick(self) -> None:
        now_ms = self._clock.now_ms()
        self._check_failures()
        self._apply_properties(now_ms)
        self._service(now_ms)
        wake_ms = self._dispatch(now_ms)
        self._backpressure()
        messages = self._consumer.consume(
            self._config.poll_batch_records, self._poll_timeout_s(now_ms, wake_ms)
        )
        now_ms = self._clock.now_ms()
        if messages:
            self._accept(messages, now_ms)
            self._dispatch(now_ms)
        if self._rewind_needed:
            self._rewind()
        if now_ms - self._last_commit_ms >= self._config.commit_interval_ms:
            self._commit_all(now_ms)

    def _poll_timeout_s(self, now_ms: int, wake_ms: int | None) -> float:
        timeout_ms = self._config.poll_timeout_ms
        if any(ctx.paused for ctx in self.contexts.values()):
            timeout_ms = min(timeout_ms, PAUSED_POLL_TIMEOUT_MS)
        if wake_ms is not None:
            timeout_ms = min(timeout_ms, wake_ms - now_ms)
        if self._deadlines:
            timeout_ms = min(timeout_ms, self._deadlines[0][0] - now_ms)
        return max(0, timeout_ms) / 1000.0

    def _check_failures(self) -> None:
        if self._engine.failure is not None:
            raise ProcessorError("a worker crashed") from self._engine.failure
        if self._outputs is not None and self._outputs.failure is not None:
            raise ProcessorError(f"output delivery failed: {self._outputs.failure}")

    def _apply_properties(self, now_ms: int) -> None:
        if self._properties.version == self._properties_version:
            return
        self._properties_version = self._properties.version
        properties = self._properties.get()
        for ctx in self.contexts.values():
            ctx.set_concurrency(properties.concurrency)
            ctx.set_rate_limit(properties.rate_limit_per_s, now_ms)
        self._resize_threads()

    def _resize_threads(self) -> None:
        wanted = self._properties.get().concurrency * max(1, len(self.contexts))
        self._engine.set_threads(max(1, min(self._config.threads_max, wanted)))

    # -- intake ----------------------------------------------------------------------

    def _accept(self, messages: list[Any], now_ms: int) -> None:
        overflow: dict[PartitionContext, int] = {}
        contexts = self.contexts
        last_key: PartitionKey | None = None
        ctx: PartitionContext | None = None
        for message in messages:
            if message.error() is not None:
                self._on_message_error(message.error())
                continue
            key = (message.topic(), message.partition())
            if key != last_key:
                last_key, ctx = key, contexts.get(key)
            if ctx is None or ctx.stopping or (overflow and ctx in overflow):
                continue
            record = self._record_for(message, key, now_ms)
            if not ctx.accept(record):
                overflow[ctx] = message.offset()
        for ctx, offset in overflow.items():
            self._pause(ctx, seek_to=offset)

    def _record_for(self, message: Any, key: PartitionKey, now_ms: int) -> Record:
        topic, partition = key
        offset = message.offset()
        if topic != self._retry_topic:
            return Record(topic, partition, offset, message.key(), message=message)
        info = parse_retry_headers(message.headers())
        if info is None:  # not written by us: process it as a plain record
            return Record(topic, partition, offset, message.key(), message=message)
        record = Record(
            info.topic,
            info.partition,
            info.offset,
            message.key(),
            attempt=info.attempt + 1,
            message=message,
        )
        record._position = offset
        record._not_before_ms = now_ms + max(0, info.not_before_ms - self._clock.wall_ms())
        return record

    def _on_message_error(self, error: KafkaError) -> None:
        if error.code() == KafkaError._PARTITION_EOF:
            return
        if error.fatal():
            raise ProcessorError(f"consumer failed: {error}")
        log.warning("consumer error: %s", error)

    def _pause(self, ctx: PartitionContext, seek_to: int | None) -> None:
        partition = TopicPartition(ctx.topic, ctx.partition)
        if not ctx.paused:
            self._consumer.pause([partition])
            ctx.paused = True
        if seek_to is not None:
            self._consumer.seek(TopicPartition(ctx.topic, ctx.partition, seek_to))

    def _backpressure(self) -> None:
        resume_at = self._config.resume_pending_records
        for ctx in self.contexts.values():
            size = ctx.window.size
            if not ctx.paused and size >= self._config.max_pending_records:
                self._pause(ctx, seek_to=None)
            elif ctx.paused and size <= resume_at:
                self._consumer.resume([TopicPartition(ctx.topic, ctx.partition)])
                ctx.paused = False
            ctx.refresh_gauges()

    # -- dispatch and results --------------------------------------------------------

    def _dispatch(self, now_ms: int) -> int | None:
        batches: list[tuple[Lane, list[Record]]] = []
        blocked = self._properties.get().blocked_keys
        wake_ms: int | None = None
        for ctx in self.contexts.values():
            ctx_wake_ms = ctx.dispatch(now_ms, blocked, batches)
            if ctx_wake_ms is not None and (wake_ms is None or ctx_wake_ms < wake_ms):
                wake_ms = ctx_wake_ms
        if batches:
            self._engine.dispatch(batches)
        return wake_ms

    def _service(self, now_ms: int) -> None:
        finished, deferred = self._mailbox.finished, self._mailbox.deferred
        while finished:
            for record in finished.popleft():
                self._on_finished(record)
        while deferred:
            self._on_deferred(deferred.popleft(), now_ms)
        self._expire_deferred(now_ms)
        if self._outputs is not None:
            self._outputs.poll()
        elif self._eos:
            self._committer.poll()  # type: ignore[union-attr]

    def _on_finished(self, record: Record) -> None:
        ctx = record._ctx
        if ctx is None or ctx.closed:
            return
        ctx.latency.observe(record._elapsed_s)
        error = record._error
        if error is not None:
            ctx.counters.failed += 1
            self._on_failure(ctx, record, error)
            return
        ctx.counters.processed += 1
        if record._outputs is None:
            ctx.complete(record)
        else:
            self._emit(ctx, record, record._outputs)

    def _emit(self, ctx: PartitionContext, record: Record, outputs: list[Output]) -> None:
        if self._eos:
            ctx.outputs[record._position] = outputs
            ctx.complete(record)
            return

        def delivered() -> None:
            if not ctx.closed:
                ctx.complete(record)

        self._outputs.send(outputs, delivered)  # type: ignore[union-attr]

    def _on_failure(self, ctx: PartitionContext, record: Record, error: BaseException) -> None:
        policy = self._config.retry
        if policy is None:
            log.warning("handler failed for %r; skipped", record, exc_info=error)
            ctx.complete(record)
            return
        output, is_retry = failure_output(
            record, error, policy, self._group_id, self._clock.wall_ms()
        )
        if is_retry:
            ctx.counters.retried += 1
        else:
            ctx.counters.dead_lettered += 1
            log.warning("%r dead-lettered after %d attempts: %r", record, record.attempt, error)
        self._emit(ctx, record, [output])

    def _on_deferred(self, completion: Completion, now_ms: int) -> None:
        timeout_ms = completion.timeout_ms or self._config.deferred_timeout_ms
        if completion.done or not timeout_ms:
            return
        entry = (now_ms + timeout_ms, next(self._sequence), completion)
        heapq.heappush(self._deadlines, entry)

    def _expire_deferred(self, now_ms: int) -> None:
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now_ms:
            completion = heapq.heappop(deadlines)[2]
            record = completion.record
            ctx = record._ctx
            if not completion._claim() or ctx is None or ctx.closed:
                continue
            ctx.counters.deferred_timeouts += 1
            log.warning("deferred %r timed out; force-completed", record)
            ctx.complete(record)

    # -- commits ---------------------------------------------------------------------

    def _commit_all(self, now_ms: int) -> None:
        self._last_commit_ms = now_ms
        self._commit(list(self.contexts.values()))

    def _commit(self, contexts: list[PartitionContext]) -> bool:
        """True when the positions of `contexts` are durable."""
        if not self._eos:
            return self._committer.commit(contexts)
        if self._rewind_needed:
            # An aborted transaction took buffered outputs with it: committing offsets
            # now would skip records whose outputs are gone. Rewind first.
            return False
        committer: TransactionalCommitter = self._committer  # type: ignore[assignment]
        if committer.commit(contexts):
            self._metrics.transactions["committed"] = committer.committed
            return True
        self._metrics.transactions["aborted"] = committer.aborted
        self._rewind_needed = True
        return False

    def _rewind(self) -> None:
        """After an aborted transaction: restart every partition from its commit."""
        self._rewind_needed = False
        contexts = list(self.contexts.values())
        self._drain(contexts, self._config.revoke_timeout_ms, finish_queued=False)
        for ctx in contexts:
            ctx.closed = True
        # Without a commit, a partition restarts from the first record it ever fetched.
        firsts = {key: ctx.first_position for key, ctx in self.contexts.items()}
        committed = self._read_committed([TopicPartition(t, p) for t, p in self.contexts])
        self.contexts.clear()
        for tp in committed:
            ctx = self._new_context(tp)
            target = ctx.start_offset
            if target is None:
                target = firsts[(tp.topic, tp.partition)]
            self._consumer.resume([TopicPartition(tp.topic, tp.partition)])
            if target is not None:
                self._consumer.seek(TopicPartition(tp.topic, tp.partition, target))
        log.warning("rewound %d partitions to their committed offsets", len(committed))

    # -- rebalance -------------------------------------------------------------------

    def _read_committed(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        for attempt in range(1, COMMITTED_FETCH_ATTEMPTS + 1):
            try:
                return self._consumer.committed(partitions, timeout=COMMITTED_FETCH_TIMEOUT_S)
            except KafkaException as exc:
                log.warning("reading committed offsets failed (attempt %d): %s", attempt, exc)
        raise ProcessorError("could not read the committed offsets of assigned partitions")

    def _new_context(self, committed: TopicPartition) -> PartitionContext:
        start = committed.offset if committed.offset >= 0 else None
        done_ranges = None
        if start is not None and self._config.offset_map_bytes_max > 0:
            done_ranges = offset_map.decode(committed.metadata, start)
        properties = self._properties.get()
        counters = self._metrics.partition(committed.topic, committed.partition)
        counters.assigned = True
        ctx = PartitionContext(
            committed.topic,
            committed.partition,
            max_pending_records=self._config.max_pending_records,
            start_offset=start,
            done_ranges=done_ranges,
            concurrency=properties.concurrency,
            mailbox=self._mailbox,
            counters=counters,
            latency=self._metrics.latency_for(committed.topic),
        )
        ctx.set_rate_limit(properties.rate_limit_per_s, self._clock.now_ms())
        self.contexts[(committed.topic, committed.partition)] = ctx
        return ctx

    def _on_assign(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        committed = self._read_committed(partitions) if partitions else []
        for tp in committed:
            self._new_context(tp)
        start_at = [
            TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_INVALID)
            for tp in committed
        ]
        if self._cooperative:
            consumer.incremental_assign(start_at)
        else:
            consumer.assign(start_at)
        if self._shutting_down:  # assigned while leaving: fetch nothing more
            self._pause_all([self.contexts[(tp.topic, tp.partition)] for tp in committed])
        self._resize_threads()
        log.info("assigned %s", [(tp.topic, tp.partition) for tp in committed])

    def _on_revoke(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        contexts = self._pop_contexts(partitions)
        timeout_ms = 0 if self._closing else self._config.revoke_timeout_ms
        self._drain(contexts, timeout_ms, finish_queued=False)
        self._commit(contexts if not self._eos else [*contexts, *self.contexts.values()])
        self._forget(contexts)
        self._unassign(consumer, partitions)
        log.info("revoked %s", [(c.topic, c.partition) for c in contexts])

    def _on_lost(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        contexts = self._pop_contexts(partitions)
        self._forget(contexts)
        self._unassign(consumer, partitions)
        log.warning("lost %s without committing", [(c.topic, c.partition) for c in contexts])

    def _unassign(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        if self._cooperative:
            consumer.incremental_unassign(partitions)
        else:
            consumer.unassign()
        self._resize_threads()

    def _pop_contexts(self, partitions: list[TopicPartition]) -> list[PartitionContext]:
        contexts = [self.contexts.pop((tp.topic, tp.partition), None) for tp in partitions]
        return [ctx for ctx in contexts if ctx is not None]

    def _forget(self, contexts: list[PartitionContext]) -> None:
        for ctx in contexts:
            ctx.stopping = True
            ctx.closed = True
            ctx.counters.assigned = False

    def _drain(
        self, contexts: list[PartitionContext], timeout_ms: int, *, finish_queued: bool
    ) -> bool:
        """Wait until the contexts have no started record left (and, if finish_queued,
        no fetched record left at all), serving results meanwhile. Bounded."""
        if not finish_queued:
            for ctx in contexts:
                ctx.stopping = True
        deadline_ms = self._clock.now_ms() + timeout_ms
        while True:
            now_ms = self._clock.now_ms()
            self._check_failures()
            self._service(now_ms)
            if finish_queued:
                self._dispatch(now_ms)
            if all(self._drained(ctx, finish_queued) for ctx in contexts):
                return True
            if now_ms >= deadline_ms:
                pending = sum(ctx.outstanding for ctx in contexts)
                log.warning(
                    "gave up waiting for %d in-flight records after %d ms", pending, timeout_ms
                )
                return False
            time.sleep(DRAIN_TICK_S)

    @staticmethod
    def _drained(ctx: PartitionContext, finish_queued: bool) -> bool:
        if ctx.outstanding:
            return False
        return not finish_queued or ctx.window.incomplete_count == 0

    # -- shutdown --------------------------------------------------------------------

    def _shutdown(self) -> None:
        self._shutting_down = True
        try:
            contexts = list(self.contexts.values())
            self._pause_all(contexts)
            self._drain(contexts, self._config.shutdown_timeout_ms, finish_queued=True)
            self._final_commit()
            for ctx in self.contexts.values():
                ctx.stopping = True
        finally:
            self._closing = True
            self._close_clients()

    def _pause_all(self, contexts: list[PartitionContext]) -> None:
        if contexts:
            self._consumer.pause([TopicPartition(c.topic, c.partition) for c in contexts])

    def _final_commit(self) -> None:
        """Commit, retrying while the group rebalances (e.g. another member is leaving
        too): polling lets the rebalance finish; a revoke commits by itself."""
        deadline_ms = self._clock.now_ms() + FINAL_COMMIT_TIMEOUT_MS
        while not self._commit(list(self.contexts.values())):
            if self._clock.now_ms() >= deadline_ms or (self._eos and self._rewind_needed):
                log.warning("final commit failed; uncommitted records will run again")
                return
            self._consumer.consume(1, FINAL_COMMIT_POLL_S)  # all partitions are paused

    def _close_clients(self) -> None:
        try:
            self._consumer.close()  # runs _on_revoke for what is left, without waiting
        except (KafkaException, RuntimeError) as exc:
            log.warning("closing the consumer failed: %s", exc)
        self._engine.close()
        if self._outputs is not None:
            self._outputs.close(self._config.shutdown_timeout_ms / 1000.0)
        elif self._eos:
            self._committer.close()  # type: ignore[union-attr]
