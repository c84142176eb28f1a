"""Making progress durable: offset commits, transactions, and output delivery.

At-least-once (default): `OffsetCommitter` commits, every commit interval, each
partition's watermark with the offset map as metadata (`consumer.commit`, synchronous).
Outputs of completed records go through `OutputProducer`, an idempotent producer; a
record counts as complete only when all its outputs are acknowledged, so a commit never
passes a record whose outputs could still be lost.

Exactly-once: `TransactionalCommitter` runs one transaction per commit interval,
following the consume-transform-produce loop (spec section 4):

    begin_transaction()
    produce the buffered outputs of every completed record the new offsets cover
    send_offsets_to_transaction(watermarks + offset maps, consumer_group_metadata())
    commit_transaction()

Outputs and offsets become visible atomically; the group metadata carries the
consumer's generation, so a zombie whose partitions moved is fenced (KIP-447). A
record's outputs join a transaction only when the committed position covers the record
(below the watermark or inside the encoded map); the others wait for a later one. On
an abortable error the transaction is aborted and `commit()` returns False: the caller
rewinds every partition to its committed offset, so the aborted outputs are produced
again by re-processing. Fatal errors (fenced producer) raise `ProcessorError`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from onceflow.processor.errors import ProcessorError
from onceflow.processor.partition import CommitPosition, PartitionContext
from onceflow.processor.record import Output

log = logging.getLogger(__name__)

COMMIT_ATTEMPTS_MAX = 3  # commit_transaction() is retried on retriable errors this often
PRODUCE_QUEUE_WAIT_S = 0.05  # on a full producer queue, serve callbacks this long and retry
PRODUCE_BLOCKED_S_MAX = 120.0  # a producer queue full for this long stops the processor

Plan = list[tuple[PartitionContext, CommitPosition]]


def _plan(contexts: Sequence[PartitionContext], offset_map_bytes_max: int, *, eos: bool) -> Plan:
    plan = []
    for ctx in contexts:
        position = ctx.commit_position(offset_map_bytes_max)
        if position is None:
            continue
        if ctx.needs_commit(position) or (eos and any(map(position.covers, ctx.outputs))):
            plan.append((ctx, position))
    return plan


def _offsets(plan: Plan) -> list[TopicPartition]:
    offsets = []
    for ctx, position in plan:
        if position.metadata:
            tp = TopicPartition(ctx.topic, ctx.partition, position.offset, position.metadata)
        else:
            tp = TopicPartition(ctx.topic, ctx.partition, position.offset)
        offsets.append(tp)
    return offsets


def produce_output(producer: Any, output: Output, on_delivery: Callable[..., None] | None) -> None:
    """produce(), waiting (bounded) while the producer's local queue is full."""
    kwargs: dict[str, Any] = {"value": output.value, "key": output.key}
    if output.headers:
        kwargs["headers"] = output.headers
    if output.partition is not None:
        kwargs["partition"] = output.partition
    if on_delivery is not None:
        kwargs["on_delivery"] = on_delivery
    deadline = time.monotonic() + PRODUCE_BLOCKED_S_MAX
    while True:
        try:
            producer.produce(output.topic, **kwargs)
            return
        except BufferError:
            if time.monotonic() > deadline:
                raise ProcessorError("producer queue full for too long") from None
            producer.poll(PRODUCE_QUEUE_WAIT_S)


class OffsetCommitter:
    """At-least-once: commit watermarks and offset maps with the consumer."""

    def __init__(self, consumer: Any, offset_map_bytes_max: int) -> None:
        self._consumer = consumer
        self._bytes_max = offset_map_bytes_max

    def commit(self, contexts: Sequence[PartitionContext]) -> bool:
        """True when every partition's position is committed (or nothing changed)."""
        plan = _plan(contexts, self._bytes_max, eos=False)
        if not plan:
            return True
        try:
            results = self._consumer.commit(offsets=_offsets(plan), asynchronous=False)
        except KafkaException as exc:
            # E.g. a rebalance is in progress: the next interval (or the revoke) retries.
            log.warning("offset commit failed: %s", exc)
            return False
        failed = {(tp.topic, tp.partition) for tp in results or () if tp.error is not None}
        for ctx, position in plan:
            if (ctx.topic, ctx.partition) not in failed:
                ctx.mark_committed(position)
        return not failed


class TransactionalCommitter:
    """Exactly-once: one transaction per commit with the outputs and the offsets."""

    def __init__(
        self, producer: Any, consumer: Any, offset_map_bytes_max: int, timeout_s: float
    ) -> None:
        self._producer = producer
        self._consumer = consumer
        self._bytes_max = offset_map_bytes_max
        self._timeout_s = timeout_s
        self.committed = 0
        self.aborted = 0
        producer.init_transactions(timeout_s)

    def poll(self) -> None:
        self._producer.poll(0)

    def commit(self, contexts: Sequence[PartitionContext]) -> bool:
        """True when committed (or nothing to do); False after an abort: the caller must
        rewind before committing again, since the aborted outputs are gone."""
        plan = _plan(contexts, self._bytes_max, eos=True)
        if not plan:
            return True
        outputs = [output for ctx, position in plan for output in ctx.take_outputs(position)]
        try:
            self._producer.begin_transaction()
            for output in outputs:
                produce_output(self._producer, output, None)
            self._producer.send_offsets_to_transaction(
                _offsets(plan), self._consumer.consumer_group_metadata(), self._timeout_s
            )
        except KafkaException as exc:
            return self._abort(exc)
        if not self._commit_transaction():
            return False
        for ctx, position in plan:
            ctx.mark_committed(position)
        self.committed += 1
        return True

    def _commit_transaction(self) -> bool:
        for _ in range(COMMIT_ATTEMPTS_MAX):
            try:
                self._producer.commit_transaction(self._timeout_s)
                return True
            except KafkaException as exc:
                error: KafkaError = exc.args[0]
                if error.retriable():
                    continue
                return self._abort(exc)
        return self._abort(KafkaException(KafkaError(KafkaError._TIMED_OUT)))

    def _abort(self, exc: KafkaException) -> bool:
        error: KafkaError = exc.args[0]
        if error.fatal():
            raise ProcessorError(f"transactional producer failed: {error}") from exc
        log.warning("transaction failed, aborting and rewinding: %s", error)
        try:
            self._producer.abort_transaction(self._timeout_s)
        except KafkaException as abort_exc:
            raise ProcessorError(f"could not abort the transaction: {abort_exc}") from exc
        self.aborted += 1
        return False

    def close(self) -> None:
        self._producer.flush(self._timeout_s)


class OutputProducer:
    """At-least-once outputs: a record completes when all its outputs are acknowledged.

    Created lazily: a processor whose handler returns nothing never opens a producer.
    Delivery callbacks run in `poll()`, on the subscription thread.
    """

    def __init__(self, factory: Callable[[], Any]) -> None:
        self._factory = factory
        self._producer: Any = None
        self.failure: KafkaError | None = None

    def send(self, outputs: list[Output], on_delivered: Callable[[], None]) -> None:
        if self._producer is None:
            self._producer = self._factory()
        remaining = [len(outputs)]

        def delivered(error: KafkaError | None, _message: object) -> None:
            if error is not None:
                self.failure = error  # the subscription stops the processor
                return
            remaining[0] -= 1
            if remaining[0] == 0:
                on_delivered()

        for output in outputs:
            produce_output(self._producer, output, delivered)

    def poll(self) -> None:
        if self._producer is not None:
            self._producer.poll(0)

    def close(self, timeout_s: float) -> None:
        if self._producer is not None:
            remaining = self._producer.flush(timeout_s)
            if remaining:
                log.warning("%d outputs not delivered at shutdown", remaining)
