"""Consumer groups and onceflow processors.

Theory of operation: the numbers are `onceflow.client.groups`' (what `onceflow groups
describe` prints), so the page and the command agree. A group whose commits carry an
onceflow processor's offset map (`onceflow.processor.offset_map`: the completed offsets
above the committed one, in the commit metadata) is shown as a processor too: per
partition the committed offset (the first offset still pending), the completed ranges
above it, how many offsets in between are still pending, and how far the window reaches.
"""

from __future__ import annotations

import contextlib
import dataclasses

from confluent_kafka import KafkaException
from confluent_kafka.admin import ConsumerGroupDescription

from onceflow.client.groups import (
    ADMIN_TIMEOUT_S,
    Isolation,
    PartitionOffsets,
    ResetStep,
    ResetStrategy,
    apply_reset,
    describe_group,
    describe_group_or_none,
    group_offsets,
    list_groups,
    partitions_of,
    plan_reset,
    state_name,
    total_lag,
)
from onceflow.console.backend import Backend
from onceflow.processor import offset_map

# Groups described at once on the groups page (each is one DescribeGroups entry).
GROUPS_DESCRIBED_MAX = 500


@dataclasses.dataclass(frozen=True, slots=True)
class GroupSummary:
    group_id: str
    state: str
    members: int | None
    simple: bool


@dataclasses.dataclass(frozen=True, slots=True)
class WindowRow:
    """One partition of an onceflow processor's out-of-order commit window."""

    topic: str
    partition: int
    committed: int                       # the first offset not yet completed
    completed: tuple[tuple[int, int], ...]   # half-open ranges above it
    log_end: int | None

    @property
    def completed_count(self) -> int:
        return sum(end - start for start, end in self.completed)

    @property
    def window_end(self) -> int:
        """Exclusive end of the window the map covers."""
        return self.completed[-1][1] if self.completed else self.committed

    @property
    def pending_count(self) -> int:
        """Offsets inside the window not completed yet (run again after a restart)."""
        return self.window_end - self.committed - self.completed_count


@dataclasses.dataclass
class GroupView:
    description: ConsumerGroupDescription
    state: str
    rows: list[PartitionOffsets]
    isolation: Isolation
    total_lag: int
    window: list[WindowRow]              # non-empty: an onceflow processor


def groups_list(backend: Backend) -> list[GroupSummary]:
    admin = backend.cluster().admin
    listed = list_groups(admin)
    members: dict[str, int] = {}
    ids = [g.group_id for g in listed[:GROUPS_DESCRIBED_MAX]]
    if ids:
        for group_id, future in admin.describe_consumer_groups(ids).items():
            with contextlib.suppress(KafkaException, TimeoutError):
                # a group that vanished meanwhile is shown without a member count
                members[group_id] = len(future.result(timeout=ADMIN_TIMEOUT_S).members)
    return [GroupSummary(g.group_id, state_name(g.state), members.get(g.group_id),
                         g.is_simple_consumer_group) for g in listed]


def group_view(backend: Backend, group: str, isolation: Isolation) -> GroupView:
    admin = backend.cluster().admin
    description = describe_group(admin, group)
    rows = group_offsets(admin, group, description)
    return GroupView(description, state_name(description.state), rows, isolation,
                     total_lag(rows, isolation), processor_window(rows))


def processor_window(rows: list[PartitionOffsets]) -> list[WindowRow]:
    """The out-of-order window of each partition whose commit carries an offset map."""
    found = []
    for row in rows:
        if row.committed is None or not row.metadata.startswith(offset_map.PREFIX):
            continue
        ranges = offset_map.decode(row.metadata, row.committed)
        if ranges is None:
            continue  # malformed or stale: the processor itself ignores it too
        found.append(WindowRow(row.topic, row.partition, row.committed,
                               tuple((start, end) for start, end in ranges), row.log_end))
    return found


def reset_plan(backend: Backend, group: str, strategy: ResetStrategy, value: int | None,
               topic: str | None) -> list[ResetStep]:
    admin = backend.cluster().admin
    description = describe_group_or_none(admin, group)
    rows = group_offsets(admin, group, description) if description is not None else []
    return plan_reset(admin, group, partitions_of(backend.metadata().topics, rows, topic),
                      strategy, value)


def reset_apply(backend: Backend, group: str, steps: list[ResetStep]) -> None:
    apply_reset(backend.cluster().admin, group, steps)
