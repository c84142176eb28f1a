"""Prometheus metrics of processors, exported by one collector per registry.

The subscription thread counts into plain Python objects (`PartitionCounters`,
`LatencyHistogram`) at the cost of an attribute increment per record; a custom
collector turns them into metric families only when Prometheus scrapes. This keeps the
per-record cost out of prometheus_client's locks, and lets several processors share a
registry: one collector per registry reports every live processor, labelled by group.

Exported (labels `group`, `topic`, `partition` unless said otherwise):

| metric | type | meaning |
|---|---|---|
| onceflow_processor_records_processed_total | counter | handler returned (or completed) without error |
| onceflow_processor_records_failed_total | counter | handler raised or failed its completion |
| onceflow_processor_records_retried_total | counter | failures sent to the retry topic |
| onceflow_processor_records_dead_lettered_total | counter | failures sent to the dead-letter topic |
| onceflow_processor_records_skipped_total | counter | blocked keys and records already done per the offset map |
| onceflow_processor_deferred_timeouts_total | counter | deferred records force-completed by their timeout |
| onceflow_processor_pending_records | gauge | records fetched and not below the committed watermark |
| onceflow_processor_commit_lag_records | gauge | fetched offsets not covered by the last commit |
| onceflow_processor_paused | gauge | 1 while the partition is paused by backpressure |
| onceflow_processor_processing_seconds | histogram | handler latency (labels group, topic) |
| onceflow_processor_transactions_total | counter | exactly-once transactions, label `outcome` (group only) |
"""

from __future__ import annotations

import threading
import weakref
from bisect import bisect_left
from collections.abc import Iterator

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
PREFIX = "onceflow_processor_"

_COUNTERS = {
    "processed": "records_processed",
    "failed": "records_failed",
    "retried": "records_retried",
    "dead_lettered": "records_dead_lettered",
    "skipped": "records_skipped",
    "deferred_timeouts": "deferred_timeouts",
}
_GAUGES = {"pending": "pending_records", "commit_lag": "commit_lag_records", "paused": "paused"}


class PartitionCounters:
    """Counters of one partition; they outlive its assignments (counters never reset)."""

    __slots__ = (*_COUNTERS, *_GAUGES, "assigned", "pending_max")

    def __init__(self) -> None:
        for name in (*_COUNTERS, *_GAUGES):
            setattr(self, name, 0)
        self.assigned = False
        self.pending_max = 0  # the largest window seen (statistics, not exported)


class LatencyHistogram:
    __slots__ = ("counts", "sum_s")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS_S) + 1)  # the last one is +Inf
        self.sum_s = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(LATENCY_BUCKETS_S, seconds)] += 1
        self.sum_s += seconds


class ProcessorMetrics:
    def __init__(self, group_id: str, registry: CollectorRegistry | None = None) -> None:
        self.group_id = group_id
        self.partitions: dict[tuple[str, int], PartitionCounters] = {}
        self.latency: dict[str, LatencyHistogram] = {}
        self.transactions = {"committed": 0, "aborted": 0}
        self._collector = _collector_for(registry if registry is not None else REGISTRY)
        self._collector.add(self)

    def partition(self, topic: str, partition: int) -> PartitionCounters:
        counters = self.partitions.get((topic, partition))
        if counters is None:
            counters = self.partitions[(topic, partition)] = PartitionCounters()
        return counters

    def latency_for(self, topic: str) -> LatencyHistogram:
        histogram = self.latency.get(topic)
        if histogram is None:
            histogram = self.latency[topic] = LatencyHistogram()
        return histogram

    def close(self) -> None:
        self._collector.discard(self)

    def families(self) -> Iterator[object]:
        labels = ["group", "topic", "partition"]
        for attribute, name in _COUNTERS.items():
            family = CounterMetricFamily(PREFIX + name, name.replace("_", " "), labels=labels)
            for (topic, partition), counters in list(self.partitions.items()):
                family.add_metric(
                    [self.group_id, topic, str(partition)], getattr(counters, attribute)
                )
            yield family
        for attribute, name in _GAUGES.items():
            family = GaugeMetricFamily(PREFIX + name, name.replace("_", " "), labels=labels)
            for (topic, partition), counters in list(self.partitions.items()):
                if counters.assigned:
                    family.add_metric(
                        [self.group_id, topic, str(partition)], getattr(counters, attribute)
                    )
            yield family
        yield self._latency_family()
        transactions = CounterMetricFamily(
            PREFIX + "transactions", "exactly-once transactions", labels=["group", "outcome"]
        )
        for outcome, count in self.transactions.items():
            transactions.add_metric([self.group_id, outcome], count)
        yield transactions

    def _latency_family(self) -> HistogramMetricFamily:
        family = HistogramMetricFamily(
            PREFIX + "processing_seconds", "handler latency", labels=["group", "topic"]
        )
        for topic, histogram in list(self.latency.items()):
            cumulative, buckets = 0, []
            for bound, count in zip((*LATENCY_BUCKETS_S, float("inf")), histogram.counts):
                cumulative += count
                buckets.append((_bound_label(bound), cumulative))
            family.add_metric([self.group_id, topic], buckets, histogram.sum_s)
        return family


def _bound_label(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


class _RegistryCollector(Collector):
    """Reports every live ProcessorMetrics of one registry, merged per metric name."""

    def __init__(self) -> None:
        self._members: weakref.WeakSet[ProcessorMetrics] = weakref.WeakSet()

    def add(self, metrics: ProcessorMetrics) -> None:
        self._members.add(metrics)

    def discard(self, metrics: ProcessorMetrics) -> None:
        self._members.discard(metrics)

    def collect(self) -> Iterator[object]:
        merged: dict[str, object] = {}
        for metrics in list(self._members):
            for family in metrics.families():
                existing = merged.get(family.name)  # type: ignore[attr-defined]
                if existing is None:
                    merged[family.name] = family  # type: ignore[attr-defined]
                else:
                    existing.samples.extend(family.samples)  # type: ignore[attr-defined]
        yield from merged.values()


_collectors: weakref.WeakKeyDictionary[CollectorRegistry, _RegistryCollector] = (
    weakref.WeakKeyDictionary()
)
_collectors_lock = threading.Lock()


def _collector_for(registry: CollectorRegistry) -> _RegistryCollector:
    with _collectors_lock:
        collector = _collectors.get(registry)
        if collector is None:
            collector = _collectors[registry] = _RegistryCollector()
            registry.register(collector)
        return collector
