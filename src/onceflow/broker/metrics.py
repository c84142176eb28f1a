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

The per-request metrics (requests, versions, sizes, errors) are counted on every request,
thousands a second, so they are not prometheus_client children (a lock, a label lookup
and a method call per update: about a sixth of the broker's CPU for a one-record Produce,
issue 19). `_RequestCounts` keeps them in plain dicts keyed by API key (and version or
error code), updated on the event loop; it is a collector of the same registry, so the
families, names, labels and values exposed at scrape time are what the children gave.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Iterator
from typing import Any

from kio.schema.errors import ErrorCode
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

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


def error_codes(body: Any) -> list[int]:
    """Every `error_code` value in a plain response body (dicts, lists and tuples), in no
    particular order; nothing deeper than ERROR_WALK_DEPTH_MAX levels is looked at."""
    found: list[int] = []
    stack: list[tuple[Any, int]] = [(body, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "error_code":
                    found.append(int(value))
                elif depth < ERROR_WALK_DEPTH_MAX and isinstance(value, _CONTAINERS):
                    stack.append((value, depth + 1))
        elif depth < ERROR_WALK_DEPTH_MAX:
            stack.extend((item, depth + 1) for item in node if isinstance(item, _CONTAINERS))
    return found


_CONTAINERS = (dict, list, tuple)


def _produce_error_codes(body: dict) -> list[int]:
    return [int(p["error_code"]) for t in body["responses"] for p in t["partition_responses"]]


def _fetch_error_codes(body: dict) -> list[int]:
    codes = [int(body["error_code"])] if "error_code" in body else []
    codes += [int(p["error_code"]) for t in body["responses"] for p in t["partitions"]]
    return codes


def _metadata_error_codes(body: dict) -> list[int]:
    codes = [int(body["error_code"])] if "error_code" in body else []
    for topic in body["topics"]:
        codes.append(int(topic["error_code"]))
        codes += [int(p["error_code"]) for p in topic["partitions"]]
    return codes


# Where the error codes of the hot answers are (the handlers' dicts): a direct read instead
# of the walk, about 10 us of a one-record Produce or Fetch, and a third of the walk's cost
# for a Metadata answer of 10,000 partitions (issue 19). An answer of another shape falls
# back to the walk; tests/broker/test_metrics.py checks both agree.
_ERROR_CODES_OF = {ApiKey.PRODUCE: _produce_error_codes, ApiKey.FETCH: _fetch_error_codes,
                   ApiKey.METADATA: _metadata_error_codes}


def answer_error_codes(api_key: int, body: dict) -> list[int]:
    """Every `error_code` of an answer of `api_key` (see error_codes)."""
    direct = _ERROR_CODES_OF.get(api_key)
    if direct is not None:
        try:
            return direct(body)
        except (KeyError, TypeError):
            pass
    return error_codes(body)


class _RequestCounts(Collector):
    """Requests, versions, sizes and error codes in plain dicts (see the module's theory
    of operation), exposed as the Counter and Histogram families they stand for."""

    def __init__(self) -> None:
        self.answered: dict[int, int] = {}
        self.versions: dict[tuple[int, int], int] = {}
        # API key -> [count per bucket (not cumulative)..., sum of sizes]
        self.sizes: dict[int, list[float]] = {}
        self.errors: dict[tuple[int, int], int] = {}

    def admitted(self, api_key: int, api_version: int, size_bytes: int) -> None:
        key = (api_key, api_version)
        self.versions[key] = self.versions.get(key, 0) + 1
        sizes = self.sizes.get(api_key)
        if sizes is None:
            sizes = self.sizes[api_key] = [0] * (len(REQUEST_BYTES_BUCKETS) + 1)
        sizes[bisect.bisect_left(REQUEST_BYTES_BUCKETS, size_bytes)] += 1
        sizes[-1] += size_bytes

    def answer(self, api_key: int, codes: list[int]) -> None:
        self.answered[api_key] = self.answered.get(api_key, 0) + 1
        errors = self.errors
        for code in codes:
            key = (api_key, code)
            errors[key] = errors.get(key, 0) + 1

    def collect(self) -> Iterator[Any]:
        # dict() copies in one C call: a scrape from another thread sees a consistent dict.
        requests = CounterMetricFamily("onceflow_requests", "Requests answered, by request "
                                       "(API).", labels=["request"])
        for api_key, count in sorted(dict(self.answered).items()):
            requests.add_metric([request_name(api_key)], count)
        versions = CounterMetricFamily(
            "onceflow_request_versions", "Requests admitted, by request (API) and version "
            "(Kafka's RequestsPerSec{request,version}): which versions clients really use.",
            labels=["request", "version"])
        for (api_key, api_version), count in sorted(dict(self.versions).items()):
            versions.add_metric([request_name(api_key), str(api_version)], count)
        sizes = HistogramMetricFamily(
            "onceflow_request_bytes", "Sizes of admitted requests in bytes (frames without "
            "the size prefix), by request (Kafka's RequestBytes).", labels=["request"])
        for api_key, counts in sorted(dict(self.sizes).items()):
            counts = list(counts)
            cumulative, buckets = 0, []
            for bound, count in zip(REQUEST_BYTES_BUCKETS, counts, strict=False):
                cumulative += count
                buckets.append((floatToGoString(bound), cumulative))
            sizes.add_metric([request_name(api_key)], buckets, counts[-1])
        errors = CounterMetricFamily(
            "onceflow_errors", "Error codes returned, by request and error, NONE included "
            "(Kafka's RequestMetrics ErrorsPerSec).", labels=["request", "error"])
        for (api_key, code), count in sorted(dict(self.errors).items()):
            errors.add_metric([request_name(api_key), error_name(code)], count)
        return iter((requests, versions, sizes, errors))


class BrokerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._counts = _RequestCounts()
        self.registry.register(self._counts)
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
        self._counts.admitted(api_key, api_version, size_bytes)

    def observe_response(self, api_key: int, body: dict | None) -> None:
        """Count one answered request and the error codes in its body (None: no response)."""
        self._counts.answer(api_key, [] if body is None else answer_error_codes(api_key, body))

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
