"""Server-side assignors of consumer groups: `uniform` (the default) and `range`.

An assignor is a pure function from the members (their subscribed topic ids and their
current target partitions) and the partition count of each topic to a new target
assignment: {member id: partitions}. It never sees time, records or the network.

- `uniform` (Kafka's UniformAssignor): every partition of a subscribed topic goes to some
  subscribed member; the counts differ by at most one between members that could take
  each other's partitions; and partitions stay where they are whenever that balance
  allows (sticky), so a rebalance moves as few partitions as possible.
- `range` (Kafka's RangeAssignor): per topic, members sorted (static members first, by
  instance id, then by member id) take consecutive ranges, the first ones one partition
  more; members with the same subscriptions get the same ranges of co-partitioned topics.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from onceflow.groups.consumer.records import TopicPartition

UNIFORM = "uniform"
RANGE = "range"


@dataclass(frozen=True, slots=True)
class MemberSpec:
    member_id: str
    instance_id: str | None
    topic_ids: frozenset[uuid.UUID]  # subscribed topics that exist
    current: frozenset[TopicPartition]  # its partitions in the current target assignment


Assignor = Callable[[Sequence[MemberSpec], Mapping[uuid.UUID, int]],
                    dict[str, frozenset[TopicPartition]]]


def _sorted(members: Sequence[MemberSpec]) -> list[MemberSpec]:
    """Kafka's order: static members by instance id first, then dynamic ones by id."""
    return sorted(members, key=lambda m: (m.instance_id is None, m.instance_id or "",
                                          m.member_id))


def uniform(members: Sequence[MemberSpec],
            partitions: Mapping[uuid.UUID, int]) -> dict[str, frozenset[TopicPartition]]:
    members = _sorted(members)
    owned: dict[str, set[TopicPartition]] = {m.member_id: set() for m in members}
    subscribers: dict[uuid.UUID, list[str]] = {}
    for m in members:
        for topic_id in m.topic_ids:
            if topic_id in partitions:
                subscribers.setdefault(topic_id, []).append(m.member_id)
    taken: set[TopicPartition] = set()
    for m in members:  # stickiness: keep what is still valid and not claimed twice
        for tp in sorted(m.current):
            topic_id, index = tp
            if topic_id in m.topic_ids and index < partitions.get(topic_id, 0) \
                    and tp not in taken:
                owned[m.member_id].add(tp)
                taken.add(tp)
    for topic_id in sorted(subscribers):  # unassigned partitions to the least loaded
        for index in range(partitions[topic_id]):
            tp = (topic_id, index)
            if tp not in taken:
                target = min(subscribers[topic_id], key=lambda mid: len(owned[mid]))
                owned[target].add(tp)
                taken.add(tp)
    _balance(owned, subscribers)
    return {mid: frozenset(tps) for mid, tps in owned.items()}


def _balance(owned: dict[str, set[TopicPartition]],
             subscribers: Mapping[uuid.UUID, list[str]]) -> None:
    """Move partitions from a member to a fellow subscriber holding two or more fewer,
    until no such move exists. Each move lowers the sum of squared counts, so this ends;
    moves go from the most loaded members first, so few partitions move."""
    moved = True
    while moved:
        moved = False
        for donor in sorted(owned, key=lambda mid: -len(owned[mid])):
            for tp in sorted(owned[donor]):
                receiver = min(subscribers[tp[0]], key=lambda mid: len(owned[mid]))
                if len(owned[receiver]) + 1 < len(owned[donor]):
                    owned[donor].discard(tp)
                    owned[receiver].add(tp)
                    moved = True


def range_(members: Sequence[MemberSpec],
           partitions: Mapping[uuid.UUID, int]) -> dict[str, frozenset[TopicPartition]]:
    members = _sorted(members)
    owned: dict[str, set[TopicPartition]] = {m.member_id: set() for m in members}
    for topic_id in sorted(partitions):
        subscribed = [m.member_id for m in members if topic_id in m.topic_ids]
        if not subscribed:
            continue
        quota, extra = divmod(partitions[topic_id], len(subscribed))
        start = 0
        for i, member_id in enumerate(subscribed):
            count = quota + (1 if i < extra else 0)
            owned[member_id].update((topic_id, p) for p in range(start, start + count))
            start += count
    return {mid: frozenset(tps) for mid, tps in owned.items()}


ASSIGNORS: dict[str, Assignor] = {UNIFORM: uniform, RANGE: range_}
