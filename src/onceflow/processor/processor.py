"""`Processor`: the public face: builds the clients, runs the subscription loop.

    with Processor(bootstrap_servers=..., group_id="g", topics=["in"], handler=handle,
                   config=ProcessorConfig(concurrency=64)) as processor:
        processor.run_forever()          # or processor.start(); ...; processor.stop()

`run_forever()` runs the loop in the calling thread until `stop()` (from another thread
or a signal handler) or Ctrl-C; `start()` runs it in a background thread. Either way,
leaving the loop drains fetched records (bounded), commits, and closes the clients.
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Self

from confluent_kafka import Consumer, Producer
from prometheus_client import CollectorRegistry

from onceflow.processor.commit import OffsetCommitter, OutputProducer, TransactionalCommitter
from onceflow.processor.config import ProcessorConfig, Properties
from onceflow.processor.errors import ProcessorError
from onceflow.processor.lanes import AsyncEngine, Mailbox, ThreadEngine
from onceflow.processor.metrics import ProcessorMetrics
from onceflow.processor.subscription import Clock, PropertiesBox, Subscription

log = logging.getLogger(__name__)

STOP_JOIN_SLACK_S = 10.0  # stop() waits for the shutdown timeout plus this


@dataclass(frozen=True, slots=True)
class PartitionStatistics:
    topic: str
    partition: int
    assigned: bool
    pending: int  # records fetched and not below the watermark (the window size)
    pending_max: int  # the largest `pending` seen since the processor started
    paused: bool
    committed_offset: int | None
    processed: int
    failed: int
    retried: int
    dead_lettered: int
    skipped: int
    deferred_timeouts: int


@dataclass(frozen=True, slots=True)
class ProcessorStatistics:
    partitions: dict[tuple[str, int], PartitionStatistics]

    @property
    def assigned(self) -> list[tuple[str, int]]:
        return sorted(key for key, stats in self.partitions.items() if stats.assigned)

    def total(self, field: str) -> int:
        return sum(getattr(stats, field) for stats in self.partitions.values())


def _is_async(handler: Callable[..., Any]) -> bool:
    call = getattr(handler, "__call__", None)  # noqa: B004 - callable objects too
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call)


class Processor:
    """Consumes `topics` in group `group_id` and runs `handler` on every record,
    concurrently across keys, in order per key."""

    def __init__(
        self,
        *,
        bootstrap_servers: str,
        group_id: str,
        topics: Iterable[str],
        handler: Callable[..., Any],
        config: ProcessorConfig | None = None,
        consumer_config: dict[str, Any] | None = None,
        producer_config: dict[str, Any] | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.config = config or ProcessorConfig()
        self.group_id = group_id
        self.topics = list(topics)
        if not self.topics:
            raise ValueError("topics must not be empty")
        self._handler = handler
        self._bootstrap_servers = bootstrap_servers
        self._consumer_config = dict(consumer_config or {})
        self._producer_config = dict(producer_config or {})
        self._properties = PropertiesBox(self.config.initial_properties())
        self.metrics = ProcessorMetrics(group_id, registry)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop_thread: threading.Thread | None = None
        self._subscription: Subscription | None = None
        self._failure: BaseException | None = None
        self._started = False

    # -- life cycle ------------------------------------------------------------------

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop(raise_failure=exc_info[0] is None)

    def run_forever(self) -> None:
        """Run the loop in this thread until stop() or KeyboardInterrupt."""
        subscription = self._prepare()
        self._loop_thread = threading.current_thread()
        try:
            subscription.run()
        except KeyboardInterrupt:
            log.info("interrupted; shut down")
        finally:
            self.metrics.close()

    def start(self) -> None:
        """Run the loop in a background thread."""
        subscription = self._prepare()
        self._thread = threading.Thread(
            target=self._run_background,
            args=(subscription,),
            name=f"processor-{self.group_id}",
            daemon=True,
        )
        self._loop_thread = self._thread
        self._thread.start()

    def _run_background(self, subscription: Subscription) -> None:
        try:
            subscription.run()
        except BaseException as exc:
            log.exception("processor stopped by an error")
            self._failure = exc
        finally:
            self.metrics.close()

    def stop(self, timeout_s: float | None = None, *, raise_failure: bool = True) -> None:
        """Ask the loop to drain, commit and close; wait for it unless called from it."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            if timeout_s is None:
                timeout_s = self.config.shutdown_timeout_ms / 1000.0 + STOP_JOIN_SLACK_S
            thread.join(timeout_s)
            if thread.is_alive():
                raise ProcessorError("processor did not stop in time")
        if raise_failure and self._failure is not None:
            raise ProcessorError("processor failed") from self._failure

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def failure(self) -> BaseException | None:
        return self._failure

    # -- run-time properties and statistics ------------------------------------------

    @property
    def properties(self) -> Properties:
        return self._properties.get()

    def update_properties(self, **changes: Any) -> Properties:
        """Change concurrency, rate_limit_per_s or blocked_keys while running."""
        if "blocked_keys" in changes:
            changes["blocked_keys"] = frozenset(changes["blocked_keys"])
        return self._properties.update(**changes)

    def statistics(self) -> ProcessorStatistics:
        subscription = self._subscription
        contexts = dict(subscription.contexts) if subscription is not None else {}
        partitions = {}
        for (topic, partition), counters in list(self.metrics.partitions.items()):
            ctx = contexts.get((topic, partition))
            committed = ctx.committed[0] if ctx is not None and ctx.committed else None
            partitions[(topic, partition)] = PartitionStatistics(
                topic=topic,
                partition=partition,
                assigned=ctx is not None,
                pending=ctx.window.size if ctx is not None else 0,
                pending_max=counters.pending_max,
                paused=bool(ctx and ctx.paused),
                committed_offset=committed,
                processed=counters.processed,
                failed=counters.failed,
                retried=counters.retried,
                dead_lettered=counters.dead_lettered,
                skipped=counters.skipped,
                deferred_timeouts=counters.deferred_timeouts,
            )
        return ProcessorStatistics(partitions)

    # -- construction ----------------------------------------------------------------

    def _prepare(self) -> Subscription:
        if self._started:
            raise RuntimeError("a Processor runs once; create a new one")
        self._started = True
        mailbox = Mailbox()
        consumer_config = self._consumer_settings()
        consumer = Consumer(consumer_config)
        strategy = str(consumer_config.get("partition.assignment.strategy", ""))
        # the consumer protocol assigns incrementally, like cooperative-sticky
        incremental = "cooperative" in strategy or self.config.group_protocol == "consumer"
        self._subscription = Subscription(
            consumer=consumer,
            topics=self.topics,
            group_id=self.group_id,
            engine=self._engine(mailbox),
            mailbox=mailbox,
            config=self.config,
            properties=self._properties,
            metrics=self.metrics,
            committer=self._committer(consumer),
            outputs=None if self.config.exactly_once else OutputProducer(self._output_producer),
            cooperative=incremental,
            clock=Clock(),
            stop=self._stop,
        )
        return self._subscription

    def _engine(self, mailbox: Mailbox) -> ThreadEngine | AsyncEngine:
        kind = self.config.handler_kind
        if kind == "auto":
            kind = "asyncio" if _is_async(self._handler) else "thread"
        name = f"processor-{self.group_id}"
        if kind == "asyncio":
            return AsyncEngine(self._handler, mailbox, name)
        return ThreadEngine(self._handler, mailbox, name)

    def _committer(self, consumer: Consumer) -> OffsetCommitter | TransactionalCommitter:
        if not self.config.exactly_once:
            return OffsetCommitter(consumer, self.config.offset_map_bytes_max)
        producer = Producer(
            {
                "bootstrap.servers": self._bootstrap_servers,
                "transactional.id": self.config.transactional_id,
                "transaction.timeout.ms": self.config.transaction_timeout_ms,
                "linger.ms": 5,
                **self._producer_config,
            }
        )
        timeout_s = self.config.transaction_timeout_ms / 1000.0
        return TransactionalCommitter(
            producer, consumer, self.config.offset_map_bytes_max, timeout_s
        )

    def _consumer_settings(self) -> dict[str, Any]:
        # The consumer protocol has no client-side assignor (librdkafka refuses one):
        # the broker's `uniform` assignor does what cooperative-sticky does here.
        protocol: dict[str, Any] = (
            {"group.protocol": "consumer"} if self.config.group_protocol == "consumer"
            else {"partition.assignment.strategy": "cooperative-sticky"})
        return {
            "bootstrap.servers": self._bootstrap_servers,
            "group.id": self.group_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": self.config.auto_offset_reset,
            **protocol,
            "isolation.level": "read_committed",
            **self._consumer_config,
        }

    def _output_producer(self) -> Producer:
        return Producer(
            {
                "bootstrap.servers": self._bootstrap_servers,
                "enable.idempotence": True,
                "linger.ms": 5,
                **self._producer_config,
            }
        )
