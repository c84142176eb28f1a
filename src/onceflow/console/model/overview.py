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

from onceflow.client.cluster import Partition
from onceflow.client.groups import committed_offsets, list_groups
from onceflow.console.backend import Backend

SAMPLE_INTERVAL_S = 2.0
# A sample costs two ListOffsets over every partition (about 50 ms per 1,000 partitions
# on onceflow): the console and the cluster spend at most 1/SAMPLE_DUTY_DIVISOR of their
# time on it, so with many partitions samples come less often than every 2 s.
SAMPLE_DUTY_DIVISOR = 10
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


def sample_pause_s(sample_s: float) -> float:
    """How long to wait after a sample that took `sample_s` (see SAMPLE_DUTY_DIVISOR)."""
    return max(SAMPLE_INTERVAL_S - sample_s, sample_s * (SAMPLE_DUTY_DIVISOR - 1))


def take_sample(backend: Backend, now_ms: int) -> Sample:
    cluster = backend.cluster()
    metadata = cluster.metadata
    partitions: list[Partition] = [(t, p) for t, topic in metadata.topics.items()
                                   for p in topic.partitions]
    ends = cluster.latest_offsets(partitions, IsolationLevel.READ_UNCOMMITTED)
    stable = cluster.latest_offsets(partitions, IsolationLevel.READ_COMMITTED)
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
