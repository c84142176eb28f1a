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
import time
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


def parse_offset_option(option: str, text: str, topics: Iterable[str] | None, *,
                        allow_earliest: bool, allow_latest: bool,
                        keywords: bool = True) -> str | Positions:
    """Check a startingOffsets/endingOffsets value: "earliest", "latest" or a JSON map.

    Returns the keyword, or {(topic, partition): offset} with -2/-1 kept symbolic.
    `topics` None accepts any topic (subscribePattern). With `keywords` False the value
    must be the JSON map and its numbers are timestamps (startingOffsetsByTimestamp).
    """
    keyword = text.strip().lower()
    if keywords and keyword in ("earliest", "latest"):
        if keyword == "earliest" and not allow_earliest:
            raise SourceOptionError(f"option {option}: 'earliest' is not allowed here")
        if keyword == "latest" and not allow_latest:
            raise SourceOptionError(f"option {option}: 'latest' is not allowed here"
                                    " (Spark's Kafka source refuses it too)")
        return keyword
    try:
        parsed = json.loads(text)
    except ValueError as error:
        example = ("'earliest', 'latest' or JSON like " if keywords else "JSON like ") + (
            '{"topic": {"0": 23, "1": -2}}' if keywords else '{"topic": {"0": 1700000000000}}')
        raise SourceOptionError(f"option {option}: expected {example}, got {text!r} ({error})") from None
    if not isinstance(parsed, dict) or not parsed:
        raise SourceOptionError(f"option {option}: the JSON must be a non-empty object "
                                f"{{topic: {{partition: {'offset' if keywords else 'timestamp'}}}}}, "
                                f"got {text!r}")
    return _json_positions(option, parsed, None if topics is None else set(topics),
                           allow_earliest, allow_latest, 0 if not keywords else EARLIEST)


def _json_positions(option: str, parsed: dict, topics: set[str] | None, allow_earliest: bool,
                    allow_latest: bool, lowest: int) -> Positions:
    positions: Positions = {}
    for topic, partitions in parsed.items():
        if topics is not None and topic not in topics:
            raise SourceOptionError(f"option {option}: topic {topic!r} is not in subscribe "
                                    f"({', '.join(sorted(topics))})")
        if not isinstance(partitions, dict) or not partitions:
            raise SourceOptionError(f"option {option}: topic {topic!r} needs an object "
                                    f"{{partition: offset}}, got {partitions!r}")
        for partition, offset in partitions.items():
            if not str(partition).isdigit() or isinstance(offset, bool) or not isinstance(offset, int):
                raise SourceOptionError(f"option {option}: {topic}[{partition!r}] = {offset!r} is "
                                        "not a partition number with an integer offset")
            if offset < lowest:
                raise SourceOptionError(
                    f"option {option}: {'offset' if lowest < 0 else 'timestamp'} {offset} of "
                    f"{topic}-{partition} is negative"
                    f"{' (only -2 = earliest, -1 = latest)' if lowest < 0 else ''}")
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
    """The driver's view of Kafka: the subscribed partitions and their offsets. A query that
    fails with a retriable client error is asked again up to `retries` times,
    `retry_interval_ms` apart (Spark's fetchOffset.numRetries / retryIntervalMs)."""

    def __init__(self, config: dict[str, str], subscription, read_committed: bool,
                 retries: int = 3, retry_interval_ms: int = 1_000) -> None:
        from confluent_kafka.admin import AdminClient

        self.subscription = subscription
        self.read_committed = read_committed
        self.retries = retries
        self.retry_interval_s = retry_interval_ms / 1000
        self._admin = AdminClient(config)

    def partitions(self) -> list[tuple[str, int]]:
        """The subscribed partitions that exist now (missing topics have none)."""
        metadata = self._call("list topics", lambda: self._admin.list_topics(timeout=ADMIN_TIMEOUT_S))
        existing = {name: list(info.partitions) for name, info in metadata.topics.items()
                    if info.error is None}
        return self.subscription.select(existing)

    def earliest(self, partitions: Iterable[tuple[str, int]]) -> Positions:
        """Log start offsets."""
        from confluent_kafka.admin import OffsetSpec

        return self._list_offsets({tp: OffsetSpec.earliest() for tp in partitions})

    def latest(self, partitions: Iterable[tuple[str, int]]) -> Positions:
        """Last stable offsets (read_committed) or high watermarks (read_uncommitted)."""
        from confluent_kafka.admin import OffsetSpec

        return self._list_offsets({tp: OffsetSpec.latest() for tp in partitions})

    def for_times(self, timestamps: dict[tuple[str, int], int]) -> Positions:
        """The first offset whose record time is at or after each partition's timestamp;
        -1 where no record is that new."""
        from confluent_kafka.admin import OffsetSpec

        return self._list_offsets({tp: OffsetSpec.for_timestamp(ms) for tp, ms in timestamps.items()})

    def _list_offsets(self, specs: dict) -> Positions:
        from confluent_kafka import IsolationLevel, TopicPartition

        if not specs:
            return {}
        isolation = IsolationLevel.READ_COMMITTED if self.read_committed else IsolationLevel.READ_UNCOMMITTED
        request = {TopicPartition(topic, partition): spec for (topic, partition), spec in specs.items()}

        def query() -> Positions:
            futures = self._admin.list_offsets(request, isolation_level=isolation,
                                               request_timeout=ADMIN_TIMEOUT_S)
            return {(tp.topic, tp.partition): future.result().offset for tp, future in futures.items()}

        return self._call("list offsets", query)

    def _call(self, what: str, action):
        from confluent_kafka import KafkaException

        for attempt in range(self.retries + 1):
            try:
                return action()
            except KafkaException as error:
                retriable = error.args[0].retriable() if error.args else False
                if not retriable or attempt == self.retries:
                    raise RuntimeError(f"onceflow-kafka: {what} failed for "
                                       f"{self.subscription.describe()}: {error}") from None
            time.sleep(self.retry_interval_s)
        raise AssertionError("unreachable")
