"""Consumer groups as people look at them: members, committed offsets, lag, offset resets.

Theory of operation: shared by `onceflow groups` and the console, so both show the same
numbers. `group_offsets` combines four answers of the AdminClient: the group's
description (DescribeGroups: state, assignor, members and their assignments), its
committed offsets with their metadata (OffsetFetch), and for those partitions the log
end offset (ListOffsets latest, read_uncommitted: the high watermark) and the last stable
offset (ListOffsets latest, read_committed: the LSO). A `read_committed` consumer can
read only below the LSO, so its lag is `LSO - committed`; any other consumer's is `high
watermark - committed`. Which one a group is cannot be seen from outside (the isolation
level is a consumer setting the broker is not told about), so the caller chooses and both
ends are shown. Partitions that are assigned but never committed, and committed but no
longer assigned, are both listed.

`plan_reset` / `apply_reset` are `kafka-consumer-groups.sh --reset-offsets`: a plan
(current -> new offset per partition, clamped to the partition's [log start, log end] as
Kafka's tool does) is computed and shown first; applying it needs the group to be
inactive (Empty), as in Kafka, since live members would overwrite the offsets.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import enum
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from confluent_kafka import (
    ConsumerGroupState,
    ConsumerGroupTopicPartitions,
    IsolationLevel,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, ConsumerGroupDescription, OffsetSpec

from onceflow.client.admin import ClientError, NotFoundError, describe_kafka_error
from onceflow.client.cluster import Partition, list_offsets

# How long the broker may take to answer one admin request.
ADMIN_TIMEOUT_S = 30.0
NO_OFFSET = -1  # librdkafka's OFFSET_INVALID: nothing committed
# Groups whose offsets may be changed: no member would overwrite them (Kafka's rule).
INACTIVE_STATES = frozenset({ConsumerGroupState.EMPTY, ConsumerGroupState.DEAD})


class Isolation(str, enum.Enum):
    """Which end a group's lag is measured to (see the module docstring)."""

    read_committed = "read_committed"        # to the last stable offset
    read_uncommitted = "read_uncommitted"    # to the high watermark


def wait(future: concurrent.futures.Future, group: str | None = None) -> Any:
    """An admin future's result, or ClientError with a sentence for people."""
    try:
        return future.result(timeout=ADMIN_TIMEOUT_S)
    except KafkaException as exc:
        error = exc.args[0]
        if isinstance(error, KafkaError) and error.code() == KafkaError.GROUP_ID_NOT_FOUND:
            raise NotFoundError(f"unknown group '{group}'") from None
        raise ClientError(describe_kafka_error(error)) from None
    except concurrent.futures.TimeoutError:
        raise ClientError(f"no answer from the broker within {ADMIN_TIMEOUT_S:.0f} s") from None


def state_name(state: Any) -> str:
    return state.name.lower() if hasattr(state, "name") else str(state)


@dataclasses.dataclass(frozen=True)
class PartitionOffsets:
    """One partition of a group: what it committed and how far the log is."""

    topic: str
    partition: int
    committed: int | None       # None: nothing committed
    metadata: str               # the commit's metadata string ("" when none)
    log_end: int | None         # high watermark; None when ListOffsets failed
    stable: int | None          # last stable offset; None when ListOffsets failed
    owner: str | None           # the member's client id (member id if none); None: unassigned

    def end(self, isolation: Isolation) -> int | None:
        return self.stable if isolation is Isolation.read_committed else self.log_end

    def lag(self, isolation: Isolation) -> int | None:
        end = self.end(isolation)
        if end is None or self.committed is None:
            return None
        return max(end - self.committed, 0)


def total_lag(rows: Iterable[PartitionOffsets], isolation: Isolation) -> int:
    return sum(row.lag(isolation) or 0 for row in rows)


def list_groups(admin: AdminClient) -> list[Any]:
    listed = wait(admin.list_consumer_groups(request_timeout=ADMIN_TIMEOUT_S))
    return sorted(listed.valid, key=lambda g: g.group_id)


def describe_group(admin: AdminClient, group: str) -> ConsumerGroupDescription:
    futures = admin.describe_consumer_groups([group], request_timeout=ADMIN_TIMEOUT_S)
    description = wait(futures[group], group)
    if description.state in (ConsumerGroupState.DEAD, ConsumerGroupState.UNKNOWN):
        raise NotFoundError(f"unknown group '{group}'")
    return description


def committed_offsets(admin: AdminClient, group: str) -> dict[Partition, tuple[int, str]]:
    """(offset, metadata) per partition the group committed."""
    futures = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)],
                                                request_timeout=ADMIN_TIMEOUT_S)
    found = wait(futures[group], group)
    return {(tp.topic, tp.partition): (tp.offset, tp.metadata or "")
            for tp in found.topic_partitions}


def owners(description: ConsumerGroupDescription) -> dict[Partition, str]:
    return {(tp.topic, tp.partition): member.client_id or member.member_id
            for member in description.members
            for tp in (member.assignment.topic_partitions if member.assignment else [])}


def group_offsets(admin: AdminClient, group: str,
                  description: ConsumerGroupDescription) -> list[PartitionOffsets]:
    """Every partition the group commits to or is assigned, sorted (module docstring)."""
    committed = committed_offsets(admin, group)
    owned = owners(description)
    keys = sorted(set(committed) | set(owned))
    log_end = list_offsets(admin, keys, OffsetSpec.latest(), IsolationLevel.READ_UNCOMMITTED)
    stable = list_offsets(admin, keys, OffsetSpec.latest(), IsolationLevel.READ_COMMITTED)
    rows = []
    for key in keys:
        offset, metadata = committed.get(key, (NO_OFFSET, ""))
        rows.append(PartitionOffsets(key[0], key[1], offset if offset >= 0 else None, metadata,
                                     log_end.get(key), stable.get(key), owned.get(key)))
    return rows


def assignment_text(partitions: Iterable[TopicPartition]) -> str:
    """`topic:0,1 other:3`: a member's assignment on one line."""
    by_topic: dict[str, list[int]] = {}
    for tp in partitions:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return " ".join(f"{t}:{','.join(map(str, sorted(ps)))}" for t, ps in sorted(by_topic.items()))


# ---------------------------------------------------------------- reset offsets


class ResetStrategy(str, enum.Enum):
    """kafka-consumer-groups.sh's --to-earliest, --to-latest, --to-offset, --shift-by,
    --to-datetime (epoch ms here)."""

    earliest = "earliest"
    latest = "latest"
    offset = "offset"
    shift_by = "shift-by"
    datetime = "datetime"


@dataclasses.dataclass(frozen=True)
class ResetStep:
    topic: str
    partition: int
    current: int | None
    new: int


def plan_reset(admin: AdminClient, group: str, partitions: Sequence[Partition],
               strategy: ResetStrategy, value: int | None = None) -> list[ResetStep]:
    """The new offset of each partition (nothing is changed; see `apply_reset`)."""
    if strategy is not ResetStrategy.earliest and strategy is not ResetStrategy.latest \
            and value is None:
        raise ClientError(f"--{strategy.value} needs a value")
    committed = committed_offsets(admin, group)
    start = list_offsets(admin, partitions, OffsetSpec.earliest())
    end = list_offsets(admin, partitions, OffsetSpec.latest())
    at_time: dict[Partition, int] = {}
    if strategy is ResetStrategy.datetime:
        at_time = list_offsets(admin, partitions, OffsetSpec.for_timestamp(value))
    steps = []
    for key in partitions:
        if key not in start or key not in end:
            raise ClientError(f"cannot read the offsets of {key[0]}-{key[1]}")
        current = committed.get(key, (NO_OFFSET, ""))[0]
        current = None if current < 0 else current
        wanted = _wanted(strategy, value, current, start[key], end[key], at_time.get(key))
        steps.append(ResetStep(key[0], key[1], current,
                               min(max(wanted, start[key]), end[key])))
    return steps


def _wanted(strategy: ResetStrategy, value: int | None, current: int | None, start: int,
            end: int, at_time: int | None) -> int:
    if strategy is ResetStrategy.earliest:
        return start
    if strategy is ResetStrategy.latest:
        return end
    assert value is not None
    if strategy is ResetStrategy.offset:
        return value
    if strategy is ResetStrategy.shift_by:
        return (start if current is None else current) + value
    # datetime: the first offset at or after the time; none (after the last record): end
    return end if at_time is None or at_time < 0 else at_time


def apply_reset(admin: AdminClient, group: str, steps: Sequence[ResetStep]) -> None:
    """Commit the planned offsets; ClientError unless the group is inactive."""
    description = describe_group_or_none(admin, group)
    if description is not None and description.state not in INACTIVE_STATES:
        raise ClientError(f"group '{group}' is {state_name(description.state)}: offsets can "
                          "only be reset while it has no members (stop its consumers first)")
    offsets = [TopicPartition(s.topic, s.partition, s.new) for s in steps]
    futures = admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(group, offsets)],
                                                 request_timeout=ADMIN_TIMEOUT_S)
    answer = wait(futures[group], group)
    failed = [tp for tp in answer.topic_partitions if tp.error is not None]
    if failed:
        raise ClientError(f"resetting {failed[0].topic}-{failed[0].partition}: "
                          f"{describe_kafka_error(failed[0].error)}")


def describe_group_or_none(admin: AdminClient, group: str) -> ConsumerGroupDescription | None:
    try:
        return describe_group(admin, group)
    except ClientError:
        return None


def partitions_of(metadata_topics: Mapping[str, Any], rows: Sequence[PartitionOffsets],
                  topic: str | None) -> list[Partition]:
    """The partitions a reset touches: those of `topic` (all of them), else every
    partition the group has committed or is assigned."""
    if topic is None:
        return [(r.topic, r.partition) for r in rows]
    found = metadata_topics.get(topic)
    if found is None:
        raise ClientError(f"unknown topic '{topic}'")
    return [(topic, p) for p in sorted(found.partitions)]
