"""ConsumerGroupHeartbeat: join, heartbeat, reconcile, leave (Kafka's
GroupMetadataManager.consumerGroupHeartbeat and consumerGroupLeave).

A heartbeat is handled in three steps, each producing records (never mutating):

1. the member is created or updated; a changed subscription (topic names or regex) is
   written (member metadata) and bumps the group epoch, as does a change of the
   subscribed topics' metadata (partitions added, topics created or deleted) or of
   what a regex resolves to;
2. if the group epoch is ahead of the assignment epoch, a new target assignment is
   computed for everyone (target.py) and its changes written;
3. the member is reconciled one step towards its target (member.py) and its new
   current assignment written.

`Heartbeat.run` returns the response and the records, or raises `HeartbeatError` with
Kafka's error code for the request; the coordinator replays the records at once and
makes them durable before answering.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from kio.schema.errors import ErrorCode

from onceflow.groups.consumer import records as cr
from onceflow.groups.consumer.assignors import ASSIGNORS
from onceflow.groups.consumer.group import ConsumerGroup
from onceflow.groups.consumer.member import (
    JOIN_GROUP_MEMBER_EPOCH,
    LEAVE_GROUP_MEMBER_EPOCH,
    LEAVE_GROUP_STATIC_MEMBER_EPOCH,
    ConsumerMember,
    MustRejoin,
    reconcile,
)
from onceflow.groups.consumer.records import TopicPartition
from onceflow.groups.consumer.target import (
    TopicsImage,
    compile_regex,
    compute_target,
    metadata_record,
    resolve_regexes,
    subscription_metadata,
)
from onceflow.groups.records import Record

E = ErrorCode
# ConsumerGroupHeartbeat v1 (KIP-1082): the client generates its member id.
CLIENT_MEMBER_ID_MIN_VERSION = 1


class HeartbeatError(Exception):
    def __init__(self, error: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error = error
        self.message = message


@dataclass(frozen=True, slots=True)
class HeartbeatRequest:
    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None
    rack_id: str | None
    rebalance_timeout_ms: int  # -1: unchanged
    subscribed_topic_names: tuple[str, ...] | None  # None: unchanged
    subscribed_topic_regex: str | None  # None: unchanged
    server_assignor: str | None
    owned: frozenset[TopicPartition] | None  # None: not sent this time
    client_id: str
    client_host: str
    api_version: int


@dataclass(frozen=True, slots=True)
class HeartbeatResult:
    error: ErrorCode
    message: str | None = None
    member_id: str | None = None
    member_epoch: int = -1
    heartbeat_interval_ms: int = 0
    assignment: frozenset[TopicPartition] | None = None  # None: not sent


@dataclass(slots=True)
class Outcome:
    """What a heartbeat produced: records, the member's value after them, the timer work."""

    response: HeartbeatResult
    records: list[Record] = field(default_factory=list)
    member: ConsumerMember | None = None  # None when the member left or was fenced
    removed_member: str | None = None  # a member whose timers must go


def validate(req: HeartbeatRequest, assignors: Sequence[str]) -> None:
    """Kafka's throwIfConsumerGroupHeartbeatRequestIsInvalid."""
    def blank(value: str | None) -> bool:
        return value is not None and not value.strip()

    if blank(req.group_id) or not req.group_id:
        raise HeartbeatError(E.invalid_request, "GroupId can't be empty.")
    if blank(req.instance_id):
        raise HeartbeatError(E.invalid_request, "InstanceId can't be empty.")
    if blank(req.rack_id):
        raise HeartbeatError(E.invalid_request, "RackId can't be empty.")
    if req.api_version >= CLIENT_MEMBER_ID_MIN_VERSION and not req.member_id.strip():
        raise HeartbeatError(E.invalid_request, "MemberId can't be empty.")
    epoch = req.member_epoch
    if epoch > 0 or epoch == LEAVE_GROUP_MEMBER_EPOCH:
        if not req.member_id.strip():
            raise HeartbeatError(E.invalid_request, "MemberId can't be empty.")
    elif epoch == JOIN_GROUP_MEMBER_EPOCH:
        if req.rebalance_timeout_ms == -1:
            raise HeartbeatError(E.invalid_request,
                                 "RebalanceTimeoutMs must be provided in first request.")
        if req.owned is None or req.owned:
            raise HeartbeatError(E.invalid_request,
                                 "TopicPartitions must be empty when (re-)joining.")
        if not req.subscribed_topic_names and not req.subscribed_topic_regex:
            raise HeartbeatError(E.invalid_request, "SubscribedTopicNames or "
                                 "SubscribedTopicRegex must be set in first request.")
    elif epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH:
        if not req.member_id.strip():
            raise HeartbeatError(E.invalid_request, "MemberId can't be empty.")
        if req.instance_id is None:
            raise HeartbeatError(E.invalid_request, "InstanceId can't be null.")
    else:
        raise HeartbeatError(E.invalid_request, "MemberEpoch is invalid.")
    if req.server_assignor is not None and req.server_assignor not in assignors:
        raise HeartbeatError(E.unsupported_assignor,
                             f"ServerAssignor {req.server_assignor} is not supported. "
                             f"Supported assignors: {', '.join(assignors)}.")


def _fenced(message: str) -> HeartbeatError:
    return HeartbeatError(E.fenced_member_epoch, message + " The member must abandon all "
                          "its partitions and rejoin.")


def check_epoch(member: ConsumerMember, epoch: int,
                owned: frozenset[TopicPartition] | None) -> None:
    """Kafka's throwIfConsumerGroupMemberEpochIsInvalid: the previous epoch is accepted
    with a subset of the assignment (the answer carrying the bump may have been lost)."""
    if epoch > member.member_epoch:
        raise _fenced(f"The consumer group member has a greater member epoch ({epoch}) "
                      f"than the one known by the group coordinator ({member.member_epoch}).")
    if epoch < member.member_epoch and (
            epoch != member.previous_member_epoch or owned is None
            or not owned <= member.assigned):
        raise _fenced(f"The consumer group member has a smaller member epoch ({epoch}) "
                      f"than the one known by the group coordinator ({member.member_epoch}).")


@dataclass(slots=True)
class Heartbeat:
    """One regular heartbeat (epoch >= 0) against `group` (None: the group is new)."""

    group: ConsumerGroup
    req: HeartbeatRequest
    image: TopicsImage
    now_ms: int
    default_assignor: str
    regex_refresh_interval_ms: int
    heartbeat_interval_ms: int
    new_member_id: str
    records: list[Record] = field(default_factory=list)
    replaced: bool = False

    def run(self) -> Outcome:
        member = self._member()
        updated = self._updated(member)
        bump = self.group.group_epoch == 0  # a new group starts at epoch 1
        if updated.subscription() != member.subscription() or self._is_new(member):
            self.records.append(cr.record(cr.MEMBER_METADATA, self.group.group_id,
                                          cr.member_metadata_value(updated.subscription()),
                                          updated.member_id))
            bump |= updated.subscribed_topic_names != member.subscribed_topic_names \
                or self._is_new(member)
        resolved, regex_bump = self._regexes(member, updated)
        bump |= regex_bump
        group_epoch, metadata = self._epoch(member, updated, bump, resolved)
        target_epoch, target = self._target(group_epoch, updated, metadata, resolved)
        try:
            reconciled = reconcile(updated, target_epoch, target, self.group.holder_epoch,
                                   self.req.owned)
        except MustRejoin:
            raise _fenced("The consumer group member is in a unknown state.") from None
        if reconciled.assignment_value() != member.assignment_value() \
                or reconciled.member_id != member.member_id:
            self.records.append(cr.record(cr.CURRENT_MEMBER_ASSIGNMENT, self.group.group_id,
                                          cr.member_assignment_value(reconciled.assignment_value()),
                                          reconciled.member_id))
        full = self.req.member_epoch == 0 or (
            self.req.rebalance_timeout_ms != -1 and self.req.subscribed_topic_names is not None
            and self.req.owned is not None)
        changed = reconciled.assigned != member.assigned
        return Outcome(HeartbeatResult(
            E.none, None, reconciled.member_id, reconciled.member_epoch,
            self.heartbeat_interval_ms,
            reconciled.assigned if full or changed else None), self.records, reconciled)

    # ------------------------------------------------------------ steps

    def _is_new(self, member: ConsumerMember) -> bool:
        """A member joining for the first time (a static member replacing itself is not)."""
        return member.member_id not in self.group.members and not self.replaced

    def _member(self) -> ConsumerMember:
        """Kafka's getOrMaybeSubscribe{Dynamic,Static}ConsumerGroupMember."""
        req, group = self.req, self.group
        joining = req.member_epoch == JOIN_GROUP_MEMBER_EPOCH
        member_id = req.member_id or self.new_member_id
        if req.instance_id is None:
            member = group.members.get(member_id)
            if member is None:
                if not joining:
                    raise HeartbeatError(E.unknown_member_id,
                                         f"Member {member_id} is not a member of group "
                                         f"{group.group_id}.")
                return ConsumerMember(member_id)
            check_epoch(member, req.member_epoch, req.owned)
            return member
        existing = group.static_member(req.instance_id)
        if joining:
            if existing is None:
                return group.members.get(member_id) or ConsumerMember(member_id)
            # Kafka: the instance id must have been released (a leave with epoch -2) or
            # its member fenced (session timeout) - also for the same member id
            if existing.member_epoch != LEAVE_GROUP_STATIC_MEMBER_EPOCH:
                raise HeartbeatError(
                    E.unreleased_instance_id,
                    f"Static member {member_id} with instance id {req.instance_id} cannot "
                    f"join the group because the instance id is owned by "
                    f"{existing.member_id} member.")
            return self._replace(existing, member_id)
        if existing is None:
            raise HeartbeatError(E.unknown_member_id,
                                 f"Instance id {req.instance_id} is unknown.")
        if existing.member_id != member_id:
            raise HeartbeatError(E.fenced_instance_id,
                                 f"Static member {member_id} with instance id "
                                 f"{req.instance_id} was fenced by member "
                                 f"{existing.member_id}.")
        check_epoch(existing, req.member_epoch, req.owned)
        return existing

    def _replace(self, old: ConsumerMember, member_id: str) -> ConsumerMember:
        """A static member rejoins with a new member id: it takes the old one's place,
        assignment and target (Kafka's replaceMember)."""
        gid = self.group.group_id
        new = replace(old, member_id=member_id, member_epoch=0, previous_member_epoch=0)
        self.replaced = True
        self.records += remove_member_records(gid, old.member_id)
        self.records.append(cr.record(cr.MEMBER_METADATA, gid,
                                      cr.member_metadata_value(new.subscription()), member_id))
        self.records.append(cr.record(cr.TARGET_ASSIGNMENT_MEMBER, gid, cr.target_member_value(
            self.group.target.get(old.member_id, frozenset())), member_id))
        self.records.append(cr.record(cr.CURRENT_MEMBER_ASSIGNMENT, gid,
                                      cr.member_assignment_value(new.assignment_value()),
                                      member_id))
        return new

    def _updated(self, member: ConsumerMember) -> ConsumerMember:
        req = self.req
        return replace(
            member,
            instance_id=req.instance_id if req.instance_id is not None else member.instance_id,
            rack_id=req.rack_id if req.rack_id is not None else member.rack_id,
            rebalance_timeout_ms=(req.rebalance_timeout_ms if req.rebalance_timeout_ms != -1
                                  else member.rebalance_timeout_ms),
            server_assignor=(req.server_assignor if req.server_assignor is not None
                             else member.server_assignor),
            subscribed_topic_names=(tuple(sorted(req.subscribed_topic_names))
                                    if req.subscribed_topic_names is not None
                                    else member.subscribed_topic_names),
            subscribed_topic_regex=(req.subscribed_topic_regex or None
                                    if req.subscribed_topic_regex is not None
                                    else member.subscribed_topic_regex),
            client_id=req.client_id, client_host=req.client_host)

    def _regexes(self, member: ConsumerMember,
                 updated: ConsumerMember) -> tuple[dict, bool]:
        """Resolve regexes now when a new one arrives or the topics changed since the last
        resolution (no more often than every `regex_refresh_interval_ms`, as Kafka);
        returns the resolution to use and whether it changes what the group consumes."""
        group, gid = self.group, self.group.group_id
        resolved = dict(group.resolved_regexes)
        old, new = member.subscribed_topic_regex, updated.subscribed_topic_regex
        if old != new:
            if old and group.regex_subscribers(old) == 1 and old in resolved:
                self.records.append(cr.record(cr.REGULAR_EXPRESSION, gid, None, old))
                del resolved[old]
            if new and compile_regex(new) is None:
                raise HeartbeatError(E.invalid_regular_expression,
                                     f"SubscribedTopicRegex `{new}` is not a valid "
                                     "regular expression.")
        wanted = {m.subscribed_topic_regex for m in group.members.values()
                  if m.member_id != updated.member_id and m.subscribed_topic_regex}
        if new:
            wanted.add(new)
        unresolved = wanted - set(resolved)
        stale = any(r.version < self.image.version for p, r in resolved.items() if p in wanted)
        due = self.now_ms >= group.regex_refresh_ms + self.regex_refresh_interval_ms
        if not unresolved and not (stale and due):
            return resolved, bool(new and old != new and new in resolved)
        fresh = resolve_regexes(wanted, self.image, self.now_ms)
        changed = False
        for pattern, value in sorted(fresh.items()):
            previous = resolved.get(pattern)
            changed |= previous is None or previous.topics != value.topics
            self.records.append(cr.record(cr.REGULAR_EXPRESSION, gid, cr.regex_value(value),
                                          pattern))
        resolved.update(fresh)
        group.regex_refresh_ms = self.now_ms  # soft, as in Kafka
        return resolved, changed

    def _epoch(self, member: ConsumerMember, updated: ConsumerMember, bump: bool,
               resolved: dict) -> tuple[int, dict]:
        group = self.group
        metadata = group.subscription_metadata
        # Kafka refreshes when the subscription changed or the metadata image changed
        # (onNewMetadataImage -> requestMetadataRefresh); the image version says the latter
        if bump or self.image.version != group.metadata_image_version:
            names = group.subscribed_topic_names(without=updated.member_id, extra=updated,
                                                 resolved_regexes=resolved)
            metadata = subscription_metadata(names, self.image)
            if metadata != group.subscription_metadata:
                bump = True
                self.records.append(metadata_record(group.group_id, metadata))
            group.metadata_image_version = self.image.version  # soft, restored on failure
        epoch = group.group_epoch + 1 if bump else group.group_epoch
        if bump:
            self.records.append(cr.record(cr.GROUP_METADATA, group.group_id, cr.epoch_value(epoch)))
        return epoch, metadata

    def _target(self, group_epoch: int, updated: ConsumerMember, metadata: dict,
                resolved: dict) -> tuple[int, frozenset[TopicPartition]]:
        group = self.group
        if group_epoch <= group.assignment_epoch:
            return group.assignment_epoch, group.target_of(updated.member_id, updated.instance_id)
        assignor = _preferred(group, updated, self.default_assignor)
        target, records = compute_target(group, group_epoch, updated, None, metadata, resolved,
                                         assignor)
        self.records += records
        return group_epoch, target.get(updated.member_id, frozenset())


def _preferred(group: ConsumerGroup, updated: ConsumerMember, default: str) -> str:
    counts: dict[str, int] = {}
    for m in [*(m for mid, m in group.members.items() if mid != updated.member_id), updated]:
        if m.server_assignor:
            counts[m.server_assignor] = counts.get(m.server_assignor, 0) + 1
    chosen = max(counts, key=counts.__getitem__) if counts else default
    return chosen if chosen in ASSIGNORS else default


def remove_member_records(group_id: str, member_id: str) -> list[Record]:
    """Tombstones of a member, in the order replay needs (Kafka's removeMember)."""
    return [cr.record(cr.CURRENT_MEMBER_ASSIGNMENT, group_id, None, member_id),
            cr.record(cr.TARGET_ASSIGNMENT_MEMBER, group_id, None, member_id),
            cr.record(cr.MEMBER_METADATA, group_id, None, member_id)]


def fence_records(group: ConsumerGroup, member: ConsumerMember,
                  image: TopicsImage) -> list[Record]:
    """A member leaves or is fenced: its tombstones, the regex it alone used, the
    subscribed topics without it, and a group epoch bump (Kafka's consumerGroupFenceMember)."""
    gid = group.group_id
    records = remove_member_records(gid, member.member_id)
    regex = member.subscribed_topic_regex
    resolved = dict(group.resolved_regexes)
    if regex and group.regex_subscribers(regex) == 1 and regex in resolved:
        records.append(cr.record(cr.REGULAR_EXPRESSION, gid, None, regex))
        del resolved[regex]
    names = group.subscribed_topic_names(without=member.member_id, resolved_regexes=resolved)
    metadata = subscription_metadata(names, image)
    if metadata != group.subscription_metadata:
        records.append(metadata_record(gid, metadata))
    records.append(cr.record(cr.GROUP_METADATA, gid, cr.epoch_value(group.group_epoch + 1)))
    return records


def static_leave_records(group: ConsumerGroup, member: ConsumerMember) -> list[Record]:
    """A static member leaves temporarily (epoch -2): it keeps its partitions until its
    session expires or it rejoins (Kafka's consumerGroupStaticMemberGroupLeave)."""
    leaving = replace(member, member_epoch=LEAVE_GROUP_STATIC_MEMBER_EPOCH,
                      pending_revocation=frozenset())
    return [cr.record(cr.CURRENT_MEMBER_ASSIGNMENT, group.group_id,
                      cr.member_assignment_value(leaving.assignment_value()), member.member_id)]
