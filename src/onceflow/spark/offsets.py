"""Offsets of the `onceflow-kafka` source: the checkpointed form, option parsing, admission
control, and the driver's queries of partitions and offsets.

Theory of operation. A position of the source is "the next offset to read" of every
topic-partition it has seen. Inside this module a position is a `Positions` map
{(topic, partition): next_offset}; in Spark's checkpoint it is the JSON-ready dict
{topic: {"partition": next_offset}} (string keys, int values, like Spark's own Kafka
source), converted by `to_offsets` / `from_offsets`. Every range planned from two
positions is [start, end): start inclusive, end exclusive.

`startingOffsets` / `endingOffsets` are "earliest", "latest" or JSON with -2 (earliest)
and -1 (latest) per partition; `parse_offset_option` checks them without touching Kafka
and `resolve` turns them into numbers once the partitions and their offsets are known.

`rate_limit` spreads a row budget over partitions in proportion to their backlog. The
budget counts offsets, not rows: control markers and aborted records take offsets too, so
a batch never holds more rows than the budget.

`OffsetReader` (driver side only) asks Kafka for partitions and for earliest/latest
offsets with one AdminClient. "Latest" is the last stable offset under read_committed and
the high watermark under read_uncommitted (ListOffsets with the isolation level).
"""

from __future__ import annotations

import json
from collections.abc import Iterable

Positions = dict[tuple[str, int], int]

# Spark's special offsets inside startingOffsets / endingOffsets JSON.
EARLIEST = -2
LATEST = -1

# How long one metadata or ListOffsets request of the driver may take before the
# micro-batch fails with a clear error (Kafka's default request timeout is 30 s).
ADMIN_TIMEOUT_S = 30.0


class SourceOptionError(ValueError):
    """An option of the onceflow-kafka source is missing or malformed."""


class DataLossError(RuntimeError):
    """Offsets the query needs are gone (retention, DeleteRecords, a recreated topic)."""


def to_offsets(positions: Positions) -> dict[str, dict[str, int]]:
    """The checkpoint form: {topic: {"partition": next_offset}}, sorted for stable JSON."""
    result: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(positions.items()):
        result.setdefault(topic, {})[str(partition)] = int(offset)
    return result


def from_offsets(offsets: dict | None) -> Positions:
    """Inverse of `to_offsets`; accepts what Spark hands back from its checkpoint."""
    positions: Positions = {}
    for topic, partitions in (offsets or {}).items():
        for partition, offset in partitions.items():
            positions[(topic, int(partition))] = int(offset)
    return positions


def parse_offset_option(option: str, text: str, topics: Iterable[str], *,
                        allow_earliest: bool, allow_latest: bool) -> str | Positions:
    """Check a startingOffsets/endingOffsets value: "earliest", "latest" or a JSON map.

    Returns the keyword, or {(topic, partition): offset} with -2/-1 kept symbolic.
    """
    keyword = text.strip().lower()
    if keyword in ("earliest", "latest"):
        if keyword == "earliest" and not allow_earliest:
            raise SourceOptionError(f"option {option}: 'earliest' is not allowed here")
        if keyword == "latest" and not allow_latest:
            raise SourceOptionError(f"option {option}: 'latest' is not allowed here"
                                    " (Spark's Kafka source refuses it too)")
        return keyword
    try:
        parsed = json.loads(text)
    except ValueError as error:
        raise SourceOptionError(f"option {option}: expected 'earliest', 'latest' or JSON like "
                                f'{{"topic": {{"0": 23, "1": -2}}}}, got {text!r} ({error})') from None
    if not isinstance(parsed, dict) or not parsed:
        raise SourceOptionError(f"option {option}: the JSON must be a non-empty object "
                                f"{{topic: {{partition: offset}}}}, got {text!r}")
    return _json_positions(option, parsed, set(topics), allow_earliest, allow_latest)


def _json_positions(option: str, parsed: dict, topics: set[str], allow_earliest: bool,
                    allow_latest: bool) -> Positions:
    positions: Positions = {}
    for topic, partitions in parsed.items():
        if topic not in topics:
            raise SourceOptionError(f"option {option}: topic {topic!r} is not in subscribe "
                                    f"({', '.join(sorted(topics))})")
        if not isinstance(partitions, dict) or not partitions:
            raise SourceOptionError(f"option {option}: topic {topic!r} needs an object "
                                    f"{{partition: offset}}, got {partitions!r}")
        for partition, offset in partitions.items():
            if not str(partition).isdigit() or isinstance(offset, bool) or not isinstance(offset, int):
                raise SourceOptionError(f"option {option}: {topic}[{partition!r}] = {offset!r} is "
                                        "not a partition number with an integer offset")
            if offset < EARLIEST:
                raise SourceOptionError(f"option {option}: offset {offset} of {topic}-{partition}"
                                        " is negative (only -2 = earliest, -1 = latest)")
            if (offset == EARLIEST and not allow_earliest) or (offset == LATEST and not allow_latest):
                raise SourceOptionError(f"option {option}: offset {offset} of {topic}-{partition}"
                                        " is not allowed here")
            positions[(topic, int(partition))] = offset
    return positions


def resolve(option: str, spec: str | Positions, partitions: Iterable[tuple[str, int]],
            earliest: Positions, latest: Positions) -> Positions:
    """Concrete offsets of `spec` for every partition in `partitions`.

    A JSON spec must name every partition of the subscribed topics that exist (as Spark's
    Kafka source requires) and no partition that does not exist.
    """
    wanted = sorted(partitions)
    if spec == "earliest":
        return {tp: earliest[tp] for tp in wanted}
    if spec == "latest":
        return {tp: latest[tp] for tp in wanted}
    assert isinstance(spec, dict)
    unknown = sorted(set(spec) - set(wanted))
    if unknown:
        raise SourceOptionError(f"option {option}: partitions {_names(unknown)} do not exist")
    missing = sorted(set(wanted) - set(spec))
    if missing:
        raise SourceOptionError(f"option {option}: every partition of the subscribed topics must "
                                f"be named (use -2 for earliest, -1 for latest); missing "
                                f"{_names(missing)}")
    symbolic = {EARLIEST: earliest, LATEST: latest}
    return {tp: symbolic[spec[tp]][tp] if spec[tp] < 0 else spec[tp] for tp in wanted}


def _names(partitions: Iterable[tuple[str, int]]) -> str:
    return ", ".join(f"{topic}-{partition}" for topic, partition in partitions)


def rate_limit(start: Positions, available: Positions, rows_max: int) -> Positions:
    """End positions that admit at most `rows_max` offsets beyond `start`.

    Each partition gets a share proportional to its backlog (available - start), as in
    Spark's Kafka source. Unlike Spark, which rounds small shares up and can overshoot the
    limit, the total never exceeds `rows_max`: every partition with a backlog first gets
    one offset (if the budget allows, so none starves), then the rest is split by largest
    remainder.
    """
    backlog = {tp: available[tp] - start[tp] for tp in available if available[tp] > start[tp]}
    total = sum(backlog.values())
    if total <= rows_max:
        return dict(available)
    grant = {tp: 0 for tp in backlog}
    budget = rows_max
    if budget >= len(backlog):
        grant = {tp: 1 for tp in backlog}
        budget -= len(backlog)
    rest = {tp: size - grant[tp] for tp, size in backlog.items()}
    rest_total = sum(rest.values())
    shares = {tp: budget * size / rest_total for tp, size in rest.items()} if rest_total else {}
    for tp, share in shares.items():
        grant[tp] += int(share)
    left = budget - sum(int(share) for share in shares.values())
    by_remainder = sorted(shares, key=lambda tp: (-(shares[tp] - int(shares[tp])), tp))
    for tp in by_remainder[:left]:
        grant[tp] += 1
    end = dict(available)
    for tp, granted in grant.items():
        end[tp] = start[tp] + min(granted, backlog[tp])
    return end


class OffsetReader:
    """The driver's view of Kafka: partitions of the subscribed topics and their offsets."""

    def __init__(self, config: dict[str, str], topics: list[str], read_committed: bool) -> None:
        from confluent_kafka.admin import AdminClient

        self.topics = topics
        self.read_committed = read_committed
        self._admin = AdminClient(config)

    def partitions(self) -> list[tuple[str, int]]:
        """Partitions of the subscribed topics that exist now (missing topics have none)."""
        metadata = self._call("list topics", lambda: self._admin.list_topics(timeout=ADMIN_TIMEOUT_S))
        found = []
        for topic in self.topics:
            info = metadata.topics.get(topic)
            if info is not None and info.error is None:
                found.extend((topic, partition) for partition in info.partitions)
        return sorted(found)

    def earliest(self, partitions: Iterable[tuple[str, int]]) -> Positions:
        """Log start offsets."""
        from confluent_kafka.admin import OffsetSpec

        return self._list_offsets(partitions, OffsetSpec.earliest())

    def latest(self, partitions: Iterable[tuple[str, int]]) -> Positions:
        """Last stable offsets (read_committed) or high watermarks (read_uncommitted)."""
        from confluent_kafka.admin import OffsetSpec

        return self._list_offsets(partitions, OffsetSpec.latest())

    def _list_offsets(self, partitions: Iterable[tuple[str, int]], spec) -> Positions:
        from confluent_kafka import IsolationLevel, TopicPartition

        wanted = list(partitions)
        if not wanted:
            return {}
        isolation = IsolationLevel.READ_COMMITTED if self.read_committed else IsolationLevel.READ_UNCOMMITTED
        request = {TopicPartition(topic, partition): spec for topic, partition in wanted}
        futures = self._call("list offsets", lambda: self._admin.list_offsets(
            request, isolation_level=isolation, request_timeout=ADMIN_TIMEOUT_S))
        return {(tp.topic, tp.partition): self._call(f"list offsets of {tp.topic}-{tp.partition}",
                                                     lambda f=future: f.result().offset)
                for tp, future in futures.items()}

    def _call(self, what: str, action):
        from confluent_kafka import KafkaException

        try:
            return action()
        except KafkaException as error:
            raise RuntimeError(f"onceflow-kafka: {what} failed for topics {self.topics}: {error}") from None
