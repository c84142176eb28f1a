"""Options of the `onceflow-kafka` source: what Spark's Kafka source accepts, checked the
way it checks them, and the pure planning rules they drive.

Theory of operation. Spark hands a data source its options as a case-insensitive map of
strings. `parse_options` turns them into a picklable `SourceOptions` (shipped to the
executors with the reader) or raises `SourceOptionError` naming the option; an option that
is neither one of `KNOWN_OPTIONS` nor a `kafka.*` client setting is refused with the list of
known ones, so a misspelt option (`maxOffsetPerTrigger`) fails at `load()` instead of
running without effect.

- Which partitions: exactly one of `subscribe` (topic list), `subscribePattern` (a
  regular expression matched against whole topic names; topics created later that match
  are picked up between micro-batches) and `assign` (JSON {"topic": [0, 1]}), as a
  `Subscription`.
- Where to start (and, for batch reads, end): a global timestamp (`startingTimestamp`)
  wins over per-partition timestamps (`startingOffsetsByTimestamp`), which win over
  `startingOffsets`, as in Spark. A timestamp resolves to the first offset whose record
  time is at or after it; when no record is that new, a start fails
  (`startingOffsetsByTimestampStrategy=error`, the default) or starts at the latest offset
  (`latest`), and an end is the latest offset.
- How many tasks: `split_ranges` cuts offset ranges larger than `maxRecordsPerPartition`
  and, with `minPartitions`, cuts the large ranges so a batch has about that many tasks
  (Spark's proportional rule: ranges whose share rounds to one part stay whole).
- When to trigger: `TriggerDelay` holds a micro-batch back while fewer than
  `minOffsetsPerTrigger` offsets wait and less than `maxTriggerDelay` has passed since the
  last batch.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
import uuid
from collections.abc import Mapping

from onceflow.spark.offsets import (
    EARLIEST,
    LATEST,
    Positions,
    SourceOptionError,
    parse_offset_option,
)
from onceflow.spark.options import boolean_option, integer_option

# Spark's Kafka source default for kafkaConsumer.pollTimeoutMs (spark.network.timeout).
POLL_TIMEOUT_MS_DEFAULT = 120_000
# The executors' consumers never join or commit to this group; Kafka clients need one.
GROUP_ID_DEFAULT = "onceflow-spark-source"
# Spark's defaults for the driver's offset queries and for maxTriggerDelay.
FETCH_OFFSET_RETRIES_DEFAULT = 3
FETCH_OFFSET_RETRY_INTERVAL_MS_DEFAULT = 1_000
MAX_TRIGGER_DELAY_DEFAULT = "15m"
# Topics a pattern never matches: Kafka's consumers exclude internal topics by default.
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state", "__share_group_state"})

STRATEGIES = ("subscribe", "subscribePattern", "assign")
# Every option of Spark's Kafka source that onceflow-kafka implements, in Spark's spelling.
KNOWN_OPTIONS = (*STRATEGIES, "startingOffsets", "endingOffsets", "startingTimestamp",
                 "endingTimestamp", "startingOffsetsByTimestamp", "endingOffsetsByTimestamp",
                 "startingOffsetsByTimestampStrategy", "maxOffsetsPerTrigger",
                 "minOffsetsPerTrigger", "maxTriggerDelay", "minPartitions",
                 "maxRecordsPerPartition", "includeHeaders", "failOnDataLoss",
                 "kafkaConsumer.pollTimeoutMs", "fetchOffset.numRetries",
                 "fetchOffset.retryIntervalMs", "groupIdPrefix")
STREAMING_ONLY = ("maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay")
BATCH_ONLY = ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp")
TIMESTAMP_STRATEGIES = ("error", "latest")

# kafka.* settings the source must control itself, with the reason given to the user.
REFUSED_KAFKA_SETTINGS = {
    "auto.offset.reset": "use startingOffsets (and failOnDataLoss for deleted offsets)",
    "enable.auto.commit": "the source never commits offsets to Kafka; Spark's checkpoint holds them",
    "enable.auto.offset.store": "the source never commits offsets to Kafka",
    "enable.partition.eof": "the read tasks rely on partition-EOF events",
    "key.deserializer": "keys and values are always returned as binary",
    "value.deserializer": "keys and values are always returned as binary",
    "interceptor.classes": "interceptors could change the records (Spark refuses them too)",
}
ISOLATION_LEVELS = ("read_committed", "read_uncommitted")
# librdkafka consumer-only settings: the driver's AdminClient is a producer-type client and
# would log a warning for each; they only go to the executors' consumers.
CONSUMER_ONLY_PREFIXES = ("fetch.", "queued.", "group.", "auto.commit.")
CONSUMER_ONLY_SETTINGS = ("max.partition.fetch.bytes", "session.timeout.ms", "heartbeat.interval.ms",
                          "max.poll.interval.ms", "check.crcs", "partition.assignment.strategy",
                          "coordinator.query.interval.ms", "allow.auto.create.topics",
                          "consume.callback.max.messages")

_DURATION = re.compile(r"(\d+)\s*(us|ms|s|m|min|h|d)?")
_DURATION_MS = {"us": 0.001, "ms": 1, None: 1, "s": 1_000, "m": 60_000, "min": 60_000,
                "h": 3_600_000, "d": 86_400_000}

Partition = tuple[str, int]


@dataclasses.dataclass(frozen=True)
class Subscription:
    """Which partitions the source reads: `kind` is one of STRATEGIES."""

    kind: str
    topics: tuple[str, ...] = ()                  # subscribe
    pattern: str | None = None                    # subscribePattern
    assigned: tuple[Partition, ...] = ()          # assign

    def topics_named(self) -> frozenset[str] | None:
        """The topics offsets and timestamps JSON may name; None: any (a pattern)."""
        if self.kind == "subscribePattern":
            return None
        if self.kind == "assign":
            return frozenset(topic for topic, _ in self.assigned)
        return frozenset(self.topics)

    def select(self, existing: Mapping[str, list[int]]) -> list[Partition]:
        """The subscribed partitions among `existing` ({topic: partition ids}), sorted."""
        if self.kind == "subscribe":
            return sorted((t, p) for t in self.topics for p in existing.get(t, ()))
        if self.kind == "subscribePattern":
            matcher = re.compile(self.pattern or "")
            return sorted((t, p) for t, ids in existing.items()
                          if t not in INTERNAL_TOPICS and matcher.fullmatch(t) for p in ids)
        missing = [(t, p) for t, p in self.assigned if p not in existing.get(t, ())]
        if missing:
            raise SourceOptionError("option assign: partitions "
                                    f"{', '.join(f'{t}-{p}' for t, p in missing)} do not exist")
        return sorted(self.assigned)

    def describe(self) -> str:
        if self.kind == "subscribePattern":
            return f"topics matching {self.pattern!r}"
        if self.kind == "assign":
            return f"partitions {', '.join(f'{t}-{p}' for t, p in self.assigned)}"
        return f"topics {', '.join(self.topics)}"


@dataclasses.dataclass(frozen=True)
class Timestamps:
    """A position given by record time: one timestamp for every partition (`everywhere`)
    or one per partition (`by_partition`)."""

    everywhere: int | None
    by_partition: Mapping[Partition, int] | None
    no_match: str                                 # "error" | "latest" (starts only)


PositionSpec = str | Positions | Timestamps


@dataclasses.dataclass(frozen=True)
class SourceOptions:
    """The parsed options; picklable, shipped to the executors with the reader."""

    subscription: Subscription
    starting: PositionSpec | None          # None: the query kind's default
    ending: PositionSpec | None
    max_offsets_per_trigger: int | None
    min_offsets_per_trigger: int | None
    max_trigger_delay_ms: int
    min_partitions: int | None
    max_records_per_partition: int | None
    include_headers: bool
    read_committed: bool
    fail_on_data_loss: bool
    poll_timeout_ms: int
    fetch_offset_retries: int
    fetch_offset_retry_interval_ms: int
    group_id: str
    kafka: dict[str, str]  # client settings without the "kafka." prefix

    def admin_config(self) -> dict[str, str]:
        return {key: value for key, value in self.kafka.items()
                if not key.startswith(CONSUMER_ONLY_PREFIXES) and key not in CONSUMER_ONLY_SETTINGS}

    def consumer_config(self) -> dict[str, str | bool]:
        return {**self.kafka, "group.id": self.group_id,
                "isolation.level": "read_committed" if self.read_committed else "read_uncommitted",
                "enable.auto.commit": False, "enable.auto.offset.store": False,
                "enable.partition.eof": True,
                # "error" surfaces deleted offsets; "earliest" skips past them.
                "auto.offset.reset": "error" if self.fail_on_data_loss else "earliest"}


def parse_options(options: Mapping[str, str], streaming: bool | None = None) -> SourceOptions:
    """Check Spark's (case-insensitive) option map; SourceOptionError names the bad option.
    `streaming` None checks what holds for both kinds of query (the schema step)."""
    _refuse_unknown([str(key) for key in options])
    given = {str(key).lower(): str(value) for key, value in options.items()}
    if not given.get("kafka.bootstrap.servers", "").strip():
        raise SourceOptionError("option kafka.bootstrap.servers is required")
    subscription = _subscription(given)
    kafka = {key[len("kafka."):]: value for key, value in given.items() if key.startswith("kafka.")}
    for key, reason in REFUSED_KAFKA_SETTINGS.items():
        if key in kafka:
            raise SourceOptionError(f"option kafka.{key} is not allowed: {reason}")
    isolation = kafka.pop("isolation.level", "read_committed").strip().lower()
    if isolation not in ISOLATION_LEVELS:
        raise SourceOptionError(f"option kafka.isolation.level must be one of {ISOLATION_LEVELS}, "
                                f"got {isolation!r}")
    if streaming:
        for name in BATCH_ONLY:
            if name.lower() in given:
                raise SourceOptionError(f"option {name} is for batch queries only (a streaming "
                                        "query has no end; use Trigger.AvailableNow)")
    named = subscription.topics_named()
    no_match = _choice(given, "startingOffsetsByTimestampStrategy", TIMESTAMP_STRATEGIES, "error")
    batch = streaming is False
    starting = _position(given, "starting", named, no_match,
                         allow_earliest=True, allow_latest=not batch)
    ending = _position(given, "ending", named, "latest", allow_earliest=False, allow_latest=True)
    max_per_trigger = _positive_int(given, "maxOffsetsPerTrigger")
    min_per_trigger = _positive_int(given, "minOffsetsPerTrigger")
    if max_per_trigger is not None and min_per_trigger is not None and min_per_trigger > max_per_trigger:
        raise SourceOptionError(f"option minOffsetsPerTrigger ({min_per_trigger}) is higher than "
                                f"maxOffsetsPerTrigger ({max_per_trigger})")
    return SourceOptions(
        subscription=subscription, starting=starting, ending=ending,
        max_offsets_per_trigger=max_per_trigger, min_offsets_per_trigger=min_per_trigger,
        max_trigger_delay_ms=duration_ms(given.get("maxtriggerdelay", MAX_TRIGGER_DELAY_DEFAULT),
                                         "maxTriggerDelay"),
        min_partitions=_positive_int(given, "minPartitions"),
        max_records_per_partition=_positive_int(given, "maxRecordsPerPartition"),
        include_headers=boolean_option(given, "includeheaders", "includeHeaders", False,
                                       SourceOptionError),
        read_committed=isolation == "read_committed",
        fail_on_data_loss=boolean_option(given, "failondataloss", "failOnDataLoss", True,
                                         SourceOptionError),
        poll_timeout_ms=_positive_int(given, "kafkaConsumer.pollTimeoutMs") or POLL_TIMEOUT_MS_DEFAULT,
        fetch_offset_retries=integer_option(given, "fetchoffset.numretries", "fetchOffset.numRetries",
                                            FETCH_OFFSET_RETRIES_DEFAULT, 0, SourceOptionError),
        fetch_offset_retry_interval_ms=integer_option(
            given, "fetchoffset.retryintervalms", "fetchOffset.retryIntervalMs",
            FETCH_OFFSET_RETRY_INTERVAL_MS_DEFAULT, 0, SourceOptionError),
        group_id=_group_id(given, kafka),
        kafka=kafka)


def _refuse_unknown(keys: list[str]) -> None:
    known = {name.lower() for name in KNOWN_OPTIONS}
    unknown = sorted(key for key in keys
                     if key.lower() not in known and not key.lower().startswith("kafka."))
    if unknown:
        # Spark lowercases option names before a Python data source sees them.
        by_lower = {name.lower(): name for name in KNOWN_OPTIONS}
        close = [by_lower[m] for key in unknown
                 for m in difflib.get_close_matches(key.lower(), by_lower, n=1)]
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise SourceOptionError(f"unknown option{'s' if len(unknown) > 1 else ''} "
                                f"{', '.join(unknown)} of onceflow-kafka{hint}; known options: "
                                f"{', '.join(KNOWN_OPTIONS)} and kafka.* client settings")


def _subscription(given: Mapping[str, str]) -> Subscription:
    chosen = [name for name in STRATEGIES if name.lower() in given]
    if not chosen:
        raise SourceOptionError(f"one of the options {', '.join(STRATEGIES)} is required "
                                "(subscribe: a comma-separated list of topics)")
    if len(chosen) > 1:
        raise SourceOptionError(f"only one of the options {', '.join(STRATEGIES)} may be given, "
                                f"got {', '.join(chosen)}")
    kind = chosen[0]
    value = given[kind.lower()]
    if kind == "subscribe":
        topics = tuple(t.strip() for t in value.split(",") if t.strip())
        if not topics:
            raise SourceOptionError("option subscribe is required: a comma-separated list of topics, "
                                    f"got {value!r}")
        return Subscription(kind, topics=topics)
    if kind == "subscribePattern":
        pattern = value.strip()
        if not pattern:
            raise SourceOptionError("option subscribePattern is empty")
        try:
            re.compile(pattern)
        except re.error as error:
            raise SourceOptionError(f"option subscribePattern: {pattern!r} is not a regular "
                                    f"expression ({error})") from None
        return Subscription(kind, pattern=pattern)
    return Subscription(kind, assigned=_assigned(value))


def _assigned(text: str) -> tuple[Partition, ...]:
    try:
        parsed = json.loads(text)
    except ValueError as error:
        parsed, detail = None, str(error)
    else:
        detail = "expected an object"
    if not isinstance(parsed, dict) or not parsed:
        raise SourceOptionError('option assign: expected JSON like {"topicA": [0, 1], "topicB": [2]}, '
                                f"got {text!r} ({detail})")
    partitions = []
    for topic, ids in parsed.items():
        if not isinstance(ids, list) or not ids or not all(
                isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
            raise SourceOptionError(f"option assign: topic {topic!r} needs a non-empty list of "
                                    f"partition numbers, got {ids!r}")
        partitions.extend((topic, i) for i in ids)
    return tuple(sorted(set(partitions)))


def _position(given: Mapping[str, str], side: str, named: frozenset[str] | None, no_match: str,
              *, allow_earliest: bool, allow_latest: bool) -> PositionSpec | None:
    """The start or end of a query: global timestamp > timestamps by partition > offsets."""
    global_name, by_name, offsets_name = (f"{side}Timestamp", f"{side}OffsetsByTimestamp",
                                          f"{side}Offsets")
    if global_name.lower() in given:
        text = given[global_name.lower()].strip()
        try:
            stamp = int(text)
        except ValueError:
            stamp = -1
        if stamp < 0:
            raise SourceOptionError(f"option {global_name} must be a timestamp in milliseconds "
                                    f"since the epoch, got {text!r}")
        return Timestamps(stamp, None, no_match)
    if by_name.lower() in given:
        stamps = parse_offset_option(by_name, given[by_name.lower()], named, allow_earliest=False,
                                     allow_latest=False, keywords=False)
        assert isinstance(stamps, dict)
        return Timestamps(None, stamps, no_match)
    if offsets_name.lower() in given:
        return parse_offset_option(offsets_name, given[offsets_name.lower()], named,
                                   allow_earliest=allow_earliest, allow_latest=allow_latest)
    return None


def _choice(given: Mapping[str, str], name: str, choices: tuple[str, ...], default: str) -> str:
    value = given.get(name.lower(), default).strip().lower()
    if value not in choices:
        raise SourceOptionError(f"option {name} must be one of {', '.join(choices)}, got {value!r}")
    return value


def _positive_int(given: Mapping[str, str], name: str) -> int | None:
    return integer_option(given, name.lower(), name, None, 1, SourceOptionError, "a positive integer")


def _group_id(given: Mapping[str, str], kafka: dict[str, str]) -> str:
    """kafka.group.id if given; else `<groupIdPrefix>-<random>-executor` (Spark's shape) when a
    prefix is given; else GROUP_ID_DEFAULT. The executors never join the group or commit to it,
    but a broker with an authorizer checks the group in FindCoordinator."""
    explicit = kafka.pop("group.id", None)
    if explicit is not None:
        return explicit
    prefix = given.get("groupidprefix")
    if prefix is not None:
        if not prefix.strip():
            raise SourceOptionError("option groupIdPrefix is empty")
        return f"{prefix.strip()}-{uuid.uuid4()}-executor"
    return GROUP_ID_DEFAULT


def duration_ms(text: str, name: str) -> int:
    """Spark's time strings: a number with an optional unit us, ms (default), s, m/min, h, d."""
    match = _DURATION.fullmatch(text.strip().lower())
    if match is None:
        raise SourceOptionError(f"option {name} must be a duration like 30s, 5m or 1h, got {text!r}")
    return int(int(match.group(1)) * _DURATION_MS[match.group(2)])


def timestamp_offsets(spec: Timestamps, partitions: list[Partition], found: Mapping[Partition, int],
                      latest: Positions, starting: bool) -> Positions:
    """Offsets of a timestamp position: `found` holds the first offset at or after each
    partition's timestamp, -1 where no record is that new (then: an error or the latest
    offset for a start, the latest offset for an end)."""
    result: Positions = {}
    for tp in partitions:
        offset = found[tp]
        if offset >= 0:
            result[tp] = offset
        elif starting and spec.no_match == "error":
            stamp = spec.everywhere if spec.everywhere is not None else spec.by_partition[tp]
            raise SourceOptionError(
                f"no offset of {tp[0]}-{tp[1]} has a record at or after timestamp {stamp} "
                "(set startingOffsetsByTimestampStrategy=latest to start at the latest offset)")
        else:
            result[tp] = latest[tp]
    return result


def timestamps_wanted(spec: Timestamps, partitions: list[Partition], option: str) -> dict[Partition, int]:
    """The timestamp to look up for each partition; a per-partition map must name them all."""
    if spec.everywhere is not None:
        return {tp: spec.everywhere for tp in partitions}
    assert spec.by_partition is not None
    if set(spec.by_partition) != set(partitions):
        raise SourceOptionError(
            f"option {option}: every partition read must be named; named "
            f"{_names(spec.by_partition)}, read {_names(partitions)}")
    return dict(spec.by_partition)


def _names(partitions) -> str:
    return ", ".join(f"{t}-{p}" for t, p in sorted(partitions)) or "none"


def split_ranges(ranges: list[tuple[str, int, int, int]], min_partitions: int | None,
                 max_records: int | None) -> list[tuple[str, int, int, int]]:
    """(topic, partition, start, end) ranges cut into tasks: none longer than `max_records`,
    and with `min_partitions` about that many in all (a range's share of the offsets decides
    its parts; ranges whose share rounds to one part stay whole). Empty ranges go."""
    ranges = [r for r in ranges if r[3] > r[2]]
    if max_records is not None:
        ranges = [piece for r in ranges for piece in _cut(r, -(-(r[3] - r[2]) // max_records))]
    if min_partitions is None or len(ranges) >= min_partitions:
        return ranges
    total = sum(end - start for _, _, start, end in ranges)
    whole = [r for r in ranges if _parts(r[3] - r[2], total, min_partitions) == 1]
    split_total = total - sum(r[3] - r[2] for r in whole)
    split_min = max(min_partitions - len(whole), 1)
    result = []
    for r in ranges:
        parts = 1 if r in whole else _parts(r[3] - r[2], split_total, split_min)
        result.extend(_cut(r, parts))
    return result


def _parts(size: int, total: int, wanted: int) -> int:
    return max(int(size / total * wanted + 0.5), 1)


def _cut(r: tuple[str, int, int, int], parts: int) -> list[tuple[str, int, int, int]]:
    topic, partition, start, end = r
    pieces, remaining = [], end - start
    for part in range(parts):
        length = remaining // (parts - part)
        remaining -= length
        pieces.append((topic, partition, start, start + length))
        start += length
    return [p for p in pieces if p[3] > p[2]]


@dataclasses.dataclass
class TriggerDelay:
    """minOffsetsPerTrigger with maxTriggerDelay: a batch waits while fewer offsets than
    `min_offsets` are waiting, until `max_delay_ms` after the last batch (the first batch
    never waits, as in Spark)."""

    min_offsets: int
    max_delay_ms: int
    last_trigger_ms: float = 0.0

    def hold(self, waiting: int, now_ms: float) -> bool:
        if now_ms - self.last_trigger_ms >= self.max_delay_ms or waiting >= self.min_offsets:
            self.last_trigger_ms = now_ms
            return False
        return True


__all__ = [
    "EARLIEST",
    "KNOWN_OPTIONS",
    "LATEST",
    "SourceOptions",
    "Subscription",
    "Timestamps",
    "TriggerDelay",
    "duration_ms",
    "parse_options",
    "split_ranges",
    "timestamp_offsets",
    "timestamps_wanted",
]
