"""What a consumer group should look like, computed as values (Kafka's
TargetAssignmentBuilder, subscription metadata and regular-expression resolution).

Each function takes the group as it is (plus, for a heartbeat, the member as it will be)
and returns the records that describe the change; none mutates the group. The caller
replays the records, which is how the group changes.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass

import re2

from onceflow.groups.consumer import records as cr
from onceflow.groups.consumer.assignors import ASSIGNORS, MemberSpec
from onceflow.groups.consumer.group import ConsumerGroup
from onceflow.groups.consumer.member import ConsumerMember
from onceflow.groups.consumer.records import ResolvedRegex, TopicMetadata, TopicPartition
from onceflow.groups.records import Record

# RE2 as Kafka uses it (RE2/J): linear-time matching, no backreferences or lookaround;
# a subscription regex must match the whole topic name.
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a client's bad pattern is its error, not our log noise


@dataclass(frozen=True, slots=True)
class TopicsImage:
    """The broker's topics as the coordinator sees them; `version` grows on every change
    (Kafka's metadata image offset), so a resolved regex knows if it is stale."""

    version: int
    topics: Mapping[str, TopicMetadata]  # by name

    def by_id(self) -> dict[uuid.UUID, TopicMetadata]:
        return {t.topic_id: t for t in self.topics.values()}


EMPTY_IMAGE = TopicsImage(0, {})


def compile_regex(pattern: str) -> re2._Regexp | None:
    """The compiled RE2 pattern, or None if it is not valid RE2 syntax."""
    try:
        return re2.compile(pattern, options=_RE2_OPTIONS)
    except re2.error:
        return None


def resolve_regexes(regexes: set[str], image: TopicsImage,
                    now_ms: int) -> dict[str, ResolvedRegex]:
    """Every topic name each regex matches in full (Kafka's refreshRegularExpressions)."""
    resolved = {}
    for pattern in regexes:
        compiled = compile_regex(pattern)
        topics = frozenset() if compiled is None else frozenset(
            name for name in image.topics if compiled.fullmatch(name) is not None)
        resolved[pattern] = ResolvedRegex(topics, image.version, now_ms)
    return resolved


def subscription_metadata(names: set[str], image: TopicsImage) -> dict[str, TopicMetadata]:
    return {name: image.topics[name] for name in names if name in image.topics}


def metadata_record(group_id: str, metadata: dict[str, TopicMetadata]) -> Record:
    return cr.record(cr.PARTITION_METADATA, group_id,
                     cr.partition_metadata_value(metadata.values()))


def _member_topics(member: ConsumerMember, metadata: Mapping[str, TopicMetadata],
                   resolved: Mapping[str, ResolvedRegex]) -> frozenset[uuid.UUID]:
    names = set(member.subscribed_topic_names)
    regex = resolved.get(member.subscribed_topic_regex or "")
    if regex is not None:
        names |= regex.topics
    return frozenset(metadata[n].topic_id for n in names if n in metadata)


def compute_target(group: ConsumerGroup, epoch: int, updated: ConsumerMember | None,
                   removed: str | None, metadata: Mapping[str, TopicMetadata],
                   resolved: Mapping[str, ResolvedRegex],
                   assignor: str) -> tuple[dict[str, frozenset[TopicPartition]], list[Record]]:
    """The new target assignment at `epoch` and its records (changed members, removed
    members' tombstones, then the assignment epoch). `updated` joins or replaces its id
    (and the static member it replaces); `removed` leaves."""
    members = dict(group.members)
    inherited: dict[str, frozenset[TopicPartition]] = {}
    if updated is not None:
        previous = group.static_members.get(updated.instance_id or "") \
            if updated.instance_id is not None else None
        if previous is not None and previous != updated.member_id:
            members.pop(previous, None)
        inherited[updated.member_id] = group.target_of(updated.member_id, updated.instance_id)
        members[updated.member_id] = updated
    if removed is not None:
        members.pop(removed, None)
    specs = [MemberSpec(m.member_id, m.instance_id, _member_topics(m, metadata, resolved),
                        inherited.get(m.member_id, group.target.get(m.member_id, frozenset())))
             for m in members.values()]
    partitions = {t.topic_id: t.num_partitions for t in metadata.values()}
    new_target = ASSIGNORS[assignor](specs, partitions) if specs else {}
    records = []
    for member_id, tps in sorted(new_target.items()):
        if group.target.get(member_id) != tps:
            records.append(cr.record(cr.TARGET_ASSIGNMENT_MEMBER, group.group_id,
                                     cr.target_member_value(tps), member_id))
    for member_id in sorted(set(group.target) - set(new_target)):
        records.append(cr.record(cr.TARGET_ASSIGNMENT_MEMBER, group.group_id, None, member_id))
    records.append(cr.record(cr.TARGET_ASSIGNMENT_METADATA, group.group_id, cr.epoch_value(epoch)))
    return new_target, records
