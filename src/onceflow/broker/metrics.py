"""Broker metrics for Prometheus: requests, errors by request and code, duplicates, faults.

Theory of operation. One `BrokerMetrics` per broker, on its own `CollectorRegistry`
(several embedded brokers may live in one process, and each counts only its own
traffic). The request pipeline calls `observe_response(api_key, body)` once per answered
request: it counts the request (Kafka's `RequestsPerSec`) and every `error_code`
found anywhere in the response body, NONE included, labelled by request name and
error name — Kafka's `kafka.network:type=RequestMetrics,name=ErrorsPerSec,
request=...,error=...`, which counts a Produce response's partitions one by one the
same way. Handlers count domain events: `duplicate(topic)` for each retried batch
recognised by the producer state (answered with its original offsets, nothing
appended). Fault injection counts what it did in `fault_injected`.

`render()` is the Prometheus text exposition of the registry, served at the admin
endpoint's `GET /metrics` and read back by `onceflow broker stats`.

Labels stay bounded: request names come from `ApiKey` (about 40), error names from
Kafka's error table, topics from the broker's own topics. Counter children are cached
per label tuple, so counting costs one dict lookup and one increment.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

from kio.schema.errors import ErrorCode
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from onceflow.protocol.apis import ApiKey

__all__ = ["CONTENT_TYPE", "BrokerMetrics", "error_name", "request_name"]

CONTENT_TYPE = CONTENT_TYPE_LATEST
# Response bodies are nested dicts and lists; nothing Kafka sends nests deeper than this,
# and the walk stops there rather than recursing without bound.
ERROR_WALK_DEPTH_MAX = 8
# Request sizes: an incremental fetch is tens of bytes, a full fetch of 1,000 partitions
# tens of kilobytes, a produce up to the frame limit.
REQUEST_BYTES_BUCKETS = (64, 256, 1024, 4096, 16_384, 65_536, 262_144, 1_048_576,
                         16_777_216, float("inf"))


# Cached (once per request otherwise): the keys are API keys and error codes of
# answered requests, both bounded (see "Labels stay bounded").
@functools.cache
def request_name(api_key: int) -> str:
    """Kafka's request name: 22 -> "InitProducerId"."""
    try:
        return "".join(word.capitalize() for word in ApiKey(api_key).name.split("_"))
    except ValueError:
        return str(api_key)


@functools.cache
def error_name(code: int) -> str:
    """Kafka's error name: 45 -> "OUT_OF_ORDER_SEQUENCE_NUMBER"."""
    try:
        return ErrorCode(code).name.upper()
    except ValueError:
        return str(code)


def error_codes(body: Any, depth: int = 0) -> Iterator[int]:
    """Every `error_code` value in a plain response body (dicts and lists)."""
    if depth > ERROR_WALK_DEPTH_MAX:
        return
    if isinstance(body, dict):
        for key, value in body.items():
            if key == "error_code":
                yield int(value)
            elif isinstance(value, (dict, list, tuple)):
                yield from error_codes(value, depth + 1)
    elif isinstance(body, (list, tuple)):
        for item in body:
            if isinstance(item, (dict, list, tuple)):
                yield from error_codes(item, depth + 1)


class BrokerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._requests = Counter("onceflow_requests", "Requests answered, by request (API).",
                                 ["request"], registry=self.registry)
        self._versions = Counter(
            "onceflow_request_versions", "Requests admitted, by request (API) and version "
            "(Kafka's RequestsPerSec{request,version}): which versions clients really use.",
            ["request", "version"], registry=self.registry)
        self._request_bytes = Histogram(
            "onceflow_request_bytes", "Sizes of admitted requests in bytes (frames without "
            "the size prefix), by request (Kafka's RequestBytes).", ["request"],
            buckets=REQUEST_BYTES_BUCKETS, registry=self.registry)
        self._errors = Counter(
            "onceflow_errors", "Error codes returned, by request and error, NONE included "
            "(Kafka's RequestMetrics ErrorsPerSec).", ["request", "error"], registry=self.registry)
        self._duplicates = Counter(
            "onceflow_producer_duplicates", "Retried producer batches recognised as duplicates: "
            "answered with their original offsets, not appended again.", ["topic"],
            registry=self.registry)
        self._faults = Counter("onceflow_faults_injected", "Faults injected, by kind and request.",
                               ["kind", "request"], registry=self.registry)
        self._throttled = Counter(
            "onceflow_quota_throttled", "Answers throttled by a client byte-rate quota, by quota "
            "(producer_byte_rate, consumer_byte_rate).", ["quota"], registry=self.registry)
        self._throttle_ms = Counter(
            "onceflow_quota_throttle_ms", "Throttle time given to clients, in ms, by quota "
            "(Kafka's throttle-time sensors).", ["quota"], registry=self.registry)
        self._retention_segments = Counter(
            "onceflow_log_retention_segments_deleted", "Segments deleted by retention or "
            "DeleteRecords, by topic.", ["topic"], registry=self.registry)
        self._retention_bytes = Counter(
            "onceflow_log_retention_bytes_deleted", "Bytes of segments deleted by retention "
            "or DeleteRecords, by topic.", ["topic"], registry=self.registry)
        self._cleaner_runs = Counter(
            "onceflow_log_cleaner_runs", "Cleanings of a compacted topic's partition, by topic.",
            ["topic"], registry=self.registry)
        self._cleaner_bytes = Counter(
            "onceflow_log_cleaner_bytes_read", "Bytes the log cleaner read (the cleaned range), "
            "by topic.", ["topic"], registry=self.registry)
        self._cleaner_segments = Counter(
            "onceflow_log_cleaner_segments_rewritten", "Segments the log cleaner rewrote, "
            "by topic.", ["topic"], registry=self.registry)
        self._dirty_ratio = Gauge(
            "onceflow_log_cleaner_dirty_ratio", "A compacted partition's dirty ratio when the "
            "cleaner last looked (Kafka's max-dirty-percent, per partition).",
            ["topic", "partition"], registry=self.registry)
        self._uncleanable = Gauge(
            "onceflow_log_cleaner_uncleanable_offset", "The first offset the cleaner may not "
            "touch yet (active segment, open transaction, min.compaction.lag.ms).",
            ["topic", "partition"], registry=self.registry)
        self._storage_errors = Counter(
            "onceflow_log_storage_errors", "Produce answers KAFKA_STORAGE_ERROR: the partition's "
            "log failed to write or fsync (disk full, I/O error) and is offline for writes until "
            "a restart.", ["topic"], registry=self.registry)
        # Connections (issue 19), by listener name: Kafka's connection-count and
        # connection-creation-total (socket-server-metrics, per listener).
        self._connections = Gauge(
            "onceflow_connections", "Open connections, by listener (Kafka's connection-count).",
            ["listener"], registry=self.registry)
        self._connections_created = Counter(
            "onceflow_connections_created", "Connections taken on, by listener (Kafka's "
            "connection-creation-total).", ["listener"], registry=self.registry)
        self._connections_refused = Counter(
            "onceflow_connections_refused", "Connections closed at accept, by reason: "
            "max.connections.per.ip (Kafka's TooManyConnectionsException) or a full wait "
            "queue at max.connections.", ["reason"], registry=self.registry)
        self._connections_waiting = Gauge(
            "onceflow_connections_waiting", "Connections accepted at max.connections and "
            "waiting for a free slot (Kafka's acceptor is blocked meanwhile).",
            registry=self.registry)
        self._children: dict[tuple, Any] = {}

    def _child(self, counter: Counter, *labels: str) -> Any:
        key = (id(counter), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = counter.labels(*labels)
        return child

    def observe_request(self, api_key: int, api_version: int, size_bytes: int) -> None:
        """Count one decoded request: its version and its size."""
        name = request_name(api_key)
        self._child(self._versions, name, str(api_version)).inc()
        self._child(self._request_bytes, name).observe(size_bytes)

    def observe_response(self, api_key: int, body: dict | None) -> None:
        """Count one answered request and the error codes in its body (None: no response)."""
        name = request_name(api_key)
        self._child(self._requests, name).inc()
        if body is None:
            return
        for code in error_codes(body):
            self._child(self._errors, name, error_name(code)).inc()

    def duplicate(self, topic: str) -> None:
        self._child(self._duplicates, topic).inc()

    def fault_injected(self, kind: str, api_key: int | None) -> None:
        self._child(self._faults, kind, "*" if api_key is None else request_name(api_key)).inc()

    def throttled(self, quota: str, throttle_ms: int) -> None:
        self._child(self._throttled, quota).inc()
        self._child(self._throttle_ms, quota).inc(throttle_ms)

    def segments_deleted(self, topic: str, segments: int, size_bytes: int) -> None:
        self._child(self._retention_segments, topic).inc(segments)
        self._child(self._retention_bytes, topic).inc(size_bytes)

    def log_cleaned(self, topic: str, bytes_read: int, segments_rewritten: int) -> None:
        self._child(self._cleaner_runs, topic).inc()
        self._child(self._cleaner_bytes, topic).inc(bytes_read)
        self._child(self._cleaner_segments, topic).inc(segments_rewritten)

    def cleaner_looked(self, topic: str, partition: int, dirty_ratio: float,
                       uncleanable_offset: int) -> None:
        self._child(self._dirty_ratio, topic, str(partition)).set(dirty_ratio)
        self._child(self._uncleanable, topic, str(partition)).set(uncleanable_offset)

    def storage_error(self, topic: str) -> None:
        self._child(self._storage_errors, topic).inc()

    def connection_opened(self, listener: str) -> None:
        self._child(self._connections_created, listener).inc()
        self._child(self._connections, listener).inc()

    def connection_closed(self, listener: str) -> None:
        self._child(self._connections, listener).dec()

    def connection_refused(self, reason: str) -> None:
        self._child(self._connections_refused, reason).inc()

    def connections_waiting(self, count: int) -> None:
        self._connections_waiting.set(count)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
