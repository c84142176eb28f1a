"""The overview: nodes, topics, partitions, and throughput and LSO lag over the last minutes.

Theory of operation: nothing in the Kafka protocol reports throughput, so the console
measures it. A `Sample` (taken every `SAMPLE_INTERVAL_S` by the app's sampler, off the
event loop) sums over every partition the high watermark (records appended so far), the
gap between high watermark and last stable offset (records that read_committed
consumers cannot read yet: the LSO lag) and, over the consumer groups, their committed
offsets (records consumed and committed so far). `Series` keeps the samples of the last
`SERIES_SECONDS` and turns neighbours into rates: records in per second (high
watermarks), records consumed per second (committed offsets). Retention and deleted
topics make the sums drop; a rate is never shown below zero.

Pages never wait for a sample: the overview renders the newest one, so its cost does not
grow with the number of partitions.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools

from confluent_kafka import IsolationLevel
from confluent_kafka.admin import OffsetSpec

from onceflow.client.cluster import Partition, list_offsets
from onceflow.client.groups import committed_offsets, list_groups
from onceflow.console.backend import Backend

SAMPLE_INTERVAL_S = 2.0
# The charts show this much history; the bound on the samples kept.
SERIES_SECONDS = 600
SAMPLES_MAX = int(SERIES_SECONDS / SAMPLE_INTERVAL_S)
# Groups whose offsets are summed per sample (one OffsetFetch each): bounds a sample's cost.
GROUPS_SAMPLED_MAX = 50
# Partitions listed as holding their LSO back, largest gap first.
HELD_SHOWN_MAX = 20


@dataclasses.dataclass(frozen=True, slots=True)
class Sample:
    at_ms: int
    topics: int
    partitions: int
    log_end_total: int
    held_total: int                               # sum of HW - LSO
    committed_total: int                          # sum of committed offsets of the groups
    held: tuple[tuple[str, int, int], ...]        # (topic, partition, HW - LSO), largest first
    groups: int


@dataclasses.dataclass(frozen=True, slots=True)
class Point:
    at_ms: int
    in_per_s: float
    out_per_s: float
    held: int


class Series:
    """The last SAMPLES_MAX samples and the rates between them (pure; no I/O)."""

    def __init__(self, samples_max: int = SAMPLES_MAX) -> None:
        self._samples: collections.deque[Sample] = collections.deque(maxlen=samples_max)

    def add(self, sample: Sample) -> None:
        self._samples.append(sample)

    def latest(self) -> Sample | None:
        return self._samples[-1] if self._samples else None

    def points(self) -> list[Point]:
        samples = list(self._samples)
        points = []
        for before, after in itertools.pairwise(samples):
            seconds = (after.at_ms - before.at_ms) / 1000
            if seconds <= 0:
                continue
            points.append(Point(after.at_ms,
                                max(after.log_end_total - before.log_end_total, 0) / seconds,
                                max(after.committed_total - before.committed_total, 0) / seconds,
                                after.held_total))
        return points


def take_sample(backend: Backend, now_ms: int) -> Sample:
    cluster = backend.cluster()
    metadata = cluster.metadata
    partitions: list[Partition] = [(t, p) for t, topic in metadata.topics.items()
                                   for p in topic.partitions]
    ends = list_offsets(cluster.admin, partitions, OffsetSpec.latest())
    stable = list_offsets(cluster.admin, partitions, OffsetSpec.latest(),
                          IsolationLevel.READ_COMMITTED)
    held = sorted(((t, p, ends[(t, p)] - stable[(t, p)]) for t, p in partitions
                   if (t, p) in ends and (t, p) in stable and ends[(t, p)] > stable[(t, p)]),
                  key=lambda h: (-h[2], h[0], h[1]))
    groups = list_groups(cluster.admin)
    committed = 0
    for group in groups[:GROUPS_SAMPLED_MAX]:
        committed += sum(offset for offset, _metadata in
                         committed_offsets(cluster.admin, group.group_id).values() if offset > 0)
    return Sample(now_ms, len(metadata.topics), len(partitions), sum(ends.values()),
                  sum(h[2] for h in held), committed, tuple(held[:HELD_SHOWN_MAX]), len(groups))
