"""The consumer-group half of the group coordinator: heartbeats, replay, timers, describe.

`GroupCoordinator` (groups/coordinator.py) owns the shards and delegates everything about
consumer groups here. The contract with the broker is the same as for classic groups
(a call returns `Append`s, the broker makes them durable and calls `complete`), with one
difference, Kafka's: the records of a consumer-group request are *replayed when they are
written*, so the next heartbeat - maybe already waiting in the same event loop turn -
sees the group epoch and target the previous one decided. The response still waits for
durability; an append that fails restores the group from the snapshot taken before
(`ConsumerWrite.before`), which is what Kafka's timeline rollback does.

Timers: a member's session (`group.consumer.session.timeout.ms`, pushed back by every
heartbeat) and, while it is revoking, its rebalance timeout; either one that fires fences
the member (tombstones, group epoch bump), which gives its partitions to the others at
their next heartbeats.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.groups.consumer import records as cr
from onceflow.groups.consumer.group import ConsumerGroup, Snapshot
from onceflow.groups.consumer.heartbeat import (
    Heartbeat,
    HeartbeatError,
    HeartbeatRequest,
    HeartbeatResult,
    fence_records,
    static_leave_records,
    validate,
)
from onceflow.groups.consumer.member import (
    LEAVE_GROUP_MEMBER_EPOCH,
    LEAVE_GROUP_STATIC_MEMBER_EPOCH,
    ConsumerMember,
    MemberState,
)
from onceflow.groups.consumer.target import TopicsImage
from onceflow.groups.flexible import FlexibleReader
from onceflow.groups.records import Record

E = ErrorCode
log = logging.getLogger("onceflow.groups")
CONSUMER_SESSION = "consumer-session"
CONSUMER_REBALANCE = "consumer-rebalance"
TIMER_KINDS = frozenset({CONSUMER_SESSION, CONSUMER_REBALANCE})


@dataclass(frozen=True, slots=True)
class ConsumerWrite:
    """Append intent: records of one consumer group, already replayed. `before` is the
    group as it was (None: it did not exist), `classic` a classic group the write removed."""

    group_id: str
    before: Snapshot | None
    classic: Any = None


@dataclass(frozen=True, slots=True)
class DescribedMember:
    member_id: str
    instance_id: str | None
    rack_id: str | None
    member_epoch: int
    client_id: str
    client_host: str
    subscribed_topic_names: tuple[str, ...]
    subscribed_topic_regex: str | None
    assignment: frozenset
    target: frozenset


@dataclass(frozen=True, slots=True)
class DescribedConsumerGroup:
    group_id: str
    error: ErrorCode
    message: str | None = None
    state: str = ""
    group_epoch: int = 0
    assignment_epoch: int = 0
    assignor: str = ""
    members: tuple[DescribedMember, ...] = ()


def key_type(key: bytes) -> int:
    return int.from_bytes(key[:2], "big", signed=True)


def decode_key(key: bytes) -> cr.ConsumerKey:
    r = FlexibleReader(key)
    return cr.decode_key(r.int16(), r)


class ConsumerGroups:
    """Consumer-group operations over the coordinator's shards (any object with
    `partition`, `groups` (classic) and `consumer_groups`)."""

    def __init__(self, config, new_uuid: Callable[[], str]) -> None:
        self.config = config
        self._new_uuid = new_uuid
        # A group's own configs (Kafka's GroupConfig, issue 15), set by the broker:
        # group id -> {"consumer.session.timeout.ms": "...", ...}; only valid values.
        self.group_configs: Callable[[str], Mapping[str, str]] = lambda _group_id: {}

    def session_timeout_ms(self, group_id: str) -> int:
        """consumer.session.timeout.ms of the group, else group.consumer.session.timeout.ms."""
        value = self.group_configs(group_id).get("consumer.session.timeout.ms")
        return int(value) if value is not None else self.config.consumer_group_session_timeout_ms

    def heartbeat_interval_ms(self, group_id: str) -> int:
        """consumer.heartbeat.interval.ms of the group, else the broker's."""
        value = self.group_configs(group_id).get("consumer.heartbeat.interval.ms")
        return (int(value) if value is not None
                else self.config.consumer_group_heartbeat_interval_ms)

    # ------------------------------------------------------------ replay

    def replay(self, ctx, shard, key: bytes, value: bytes | None) -> None:
        """One consumer-group record (loading, and every live write)."""
        k = decode_key(key)
        group = shard.consumer_groups.get(k.group)
        if group is None:
            if value is None:
                return  # a tombstone of a group that is already gone
            classic = shard.groups.pop(k.group, None)
            if classic is not None and classic.protocol_type is not None:
                raise RuntimeError(f"consumer group record for {k.group!r}, which is a "
                                   "classic group with members' records")
            group = shard.consumer_groups[k.group] = ConsumerGroup(k.group, shard.partition)
        if k.record_type == cr.GROUP_METADATA and value is None:
            assert not group.members, f"group {k.group} deleted with members"
            del shard.consumer_groups[k.group]
            return
        group.replay(k, value)

    def apply(self, ctx, shard, group_id: str, records: list[Record],
              classic: Any = None) -> None:
        """Replay `records` now and append them; the group before is kept to undo."""
        if not records:
            return
        group = shard.consumer_groups.get(group_id)
        before = group.snapshot() if group is not None else None
        for record in records:
            if key_type(record.key) in cr.KEY_TYPES:
                self.replay(ctx, shard, record.key, record.value)
            else:  # the classic group record a conversion deletes
                shard.groups.pop(group_id, None)
        ctx.append(shard.partition, records, ConsumerWrite(group_id, before, classic))

    def failed(self, shard, intent: ConsumerWrite) -> None:
        """The append of `intent` failed: the group is what it was before."""
        if intent.before is None:
            shard.consumer_groups.pop(intent.group_id, None)
        else:
            group = shard.consumer_groups.get(intent.group_id)
            if group is None:
                group = shard.consumer_groups[intent.group_id] = ConsumerGroup(
                    intent.group_id, shard.partition)
            group.restore(intent.before)
        if intent.classic is not None:
            shard.consumer_groups.pop(intent.group_id, None)
            shard.groups[intent.group_id] = intent.classic

    def on_loaded(self, ctx, shard) -> None:
        """Kafka's onLoaded: every member's session starts now; revoking members get their
        rebalance timeout again."""
        for group in shard.consumer_groups.values():
            for member in group.members.values():
                self._schedule_session(ctx, group, member.member_id)
                if member.state is MemberState.UNREVOKED_PARTITIONS:
                    self._schedule_rebalance(ctx, group, member)

    # ------------------------------------------------------------ heartbeat

    def heartbeat(self, ctx, shard, req: HeartbeatRequest, image: TopicsImage,
                  convert: Callable[[], Any]) -> HeartbeatResult:
        """ConsumerGroupHeartbeat. `convert` removes an empty classic group of the same id
        (returns it, its tombstone records are the caller's business) or raises."""
        try:
            validate(req, self.config.consumer_group_assignors)
            if req.member_epoch in (LEAVE_GROUP_MEMBER_EPOCH, LEAVE_GROUP_STATIC_MEMBER_EPOCH):
                return self._leave(ctx, shard, req, image)
            return self._heartbeat(ctx, shard, req, image, convert)
        except HeartbeatError as exc:
            log.info("group %s: heartbeat of %s (epoch %d) answered %s: %s", req.group_id,
                     req.member_id, req.member_epoch, exc.error.name, exc.message)
            return HeartbeatResult(exc.error, exc.message, member_epoch=-1)

    def _heartbeat(self, ctx, shard, req: HeartbeatRequest, image: TopicsImage,
                   convert) -> HeartbeatResult:
        group = shard.consumer_groups.get(req.group_id)
        prefix: list[Record] = []
        classic = None
        if group is None:
            if req.member_epoch != 0:
                raise HeartbeatError(E.group_id_not_found,
                                     f"Consumer group {req.group_id} not found.")
            if req.group_id in shard.groups:
                classic, prefix = convert()
            group = ConsumerGroup(req.group_id, shard.partition)
        if len(group.members) >= self.config.consumer_group_max_size and (
                not req.member_id or req.member_id not in group.members):
            raise HeartbeatError(E.group_max_size_reached,
                                 "The consumer group has reached its maximum capacity of "
                                 f"{self.config.consumer_group_max_size} members.")
        created = req.group_id not in shard.consumer_groups
        if created:  # computed against an empty group; it exists once its records replay
            shard.consumer_groups[req.group_id] = group
        try:
            outcome = Heartbeat(
                group, req, image, ctx.now_ms, self.config.consumer_group_assignors[0],
                self.config.consumer_group_regex_refresh_interval_ms,
                self.heartbeat_interval_ms(req.group_id),
                self._new_uuid()).run()
        finally:
            if created:
                del shard.consumer_groups[req.group_id]
        self.apply(ctx, shard, req.group_id, prefix + outcome.records, classic)
        group = shard.consumer_groups[req.group_id]
        member = outcome.member
        assert member is not None
        self._schedule_session(ctx, group, member.member_id)
        if member.state is MemberState.UNREVOKED_PARTITIONS:
            self._schedule_rebalance(ctx, group, member)
        else:
            ctx.cancel(CONSUMER_REBALANCE, group, member.member_id)
        return outcome.response

    def _leave(self, ctx, shard, req: HeartbeatRequest, image: TopicsImage) -> HeartbeatResult:
        group = shard.consumer_groups.get(req.group_id)
        if group is None:
            raise HeartbeatError(E.group_id_not_found,
                                 f"Consumer group {req.group_id} not found.")
        if req.instance_id is None:
            member = group.members.get(req.member_id)
            if member is None:
                raise HeartbeatError(E.unknown_member_id,
                                     f"Member {req.member_id} is not a member of group "
                                     f"{req.group_id}.")
        else:
            member = group.static_member(req.instance_id)
            if member is None:
                raise HeartbeatError(E.unknown_member_id,
                                     f"Instance id {req.instance_id} is unknown.")
            if member.member_id != req.member_id:
                raise HeartbeatError(E.fenced_instance_id,
                                     f"Static member {req.member_id} with instance id "
                                     f"{req.instance_id} was fenced by member "
                                     f"{member.member_id}.")
        if req.member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH:
            self.apply(ctx, shard, group.group_id, static_leave_records(group, member))
            return HeartbeatResult(E.none, None, member.member_id, LEAVE_GROUP_STATIC_MEMBER_EPOCH)
        self.fence(ctx, shard, group, member, image)
        return HeartbeatResult(E.none, None, req.member_id, req.member_epoch)

    def fence(self, ctx, shard, group: ConsumerGroup, member: ConsumerMember,
              image: TopicsImage, reason: str = "it left") -> None:
        log.info("group %s: member %s (epoch %d) leaves: %s", group.group_id,
                 member.member_id, member.member_epoch, reason)
        ctx.cancel(CONSUMER_SESSION, group, member.member_id)
        ctx.cancel(CONSUMER_REBALANCE, group, member.member_id)
        group.rebalance_epochs.pop(member.member_id, None)
        self.apply(ctx, shard, group.group_id, fence_records(group, member, image))

    # ------------------------------------------------------------ timers

    def _schedule_session(self, ctx, group: ConsumerGroup, member_id: str) -> None:
        ctx.schedule(CONSUMER_SESSION, group, self.session_timeout_ms(group.group_id),
                     member_id)

    def _schedule_rebalance(self, ctx, group: ConsumerGroup, member: ConsumerMember) -> None:
        """At most one rebalance timeout per member and epoch (a later heartbeat in the
        same state does not push it back)."""
        if group.rebalance_epochs.get(member.member_id) == member.member_epoch:
            return
        group.rebalance_epochs[member.member_id] = member.member_epoch
        ctx.schedule(CONSUMER_REBALANCE, group, max(member.rebalance_timeout_ms, 0),
                     member.member_id)

    def fire_timer(self, ctx, shard, key: tuple, image: TopicsImage) -> None:
        kind, group_id, incarnation, member_id = key
        group = shard.consumer_groups.get(group_id)
        if group is None or group.incarnation != incarnation:
            return
        member = group.members.get(member_id)
        if member is None:
            return
        reason = "its session timed out"
        if kind == CONSUMER_REBALANCE:
            expected = group.rebalance_epochs.pop(member_id, None)
            if expected != member.member_epoch or member.state is not MemberState.UNREVOKED_PARTITIONS:
                return
            reason = f"it did not revoke within {member.rebalance_timeout_ms} ms"
        self.fence(ctx, shard, group, member, image, reason)

    # ------------------------------------------------------------ admin

    def describe(self, shard, group_id: str, image: TopicsImage) -> DescribedConsumerGroup:
        group = shard.consumer_groups.get(group_id)
        if group is None:
            message = (f"Group {group_id} is not a consumer group." if group_id in shard.groups
                       else f"Group {group_id} not found.")
            return DescribedConsumerGroup(group_id, E.group_id_not_found, message)
        members = tuple(DescribedMember(
            m.member_id, m.instance_id, m.rack_id, m.member_epoch, m.client_id, m.client_host,
            m.subscribed_topic_names, m.subscribed_topic_regex, m.assigned,
            group.target.get(m.member_id, frozenset())) for m in group.members.values())
        return DescribedConsumerGroup(
            group_id, E.none, None, group.state, group.group_epoch, group.assignment_epoch,
            group.preferred_assignor(self.config.consumer_group_assignors[0]), members)

    def validate_member_epoch(self, group: ConsumerGroup, member_id: str | None,
                              epoch: int) -> ErrorCode | None:
        """Kafka's ConsumerGroup.validateOffsetCommit/validateOffsetFetch for consumer members:
        epoch < 0 from a non-member is an admin or standalone client, allowed while the group
        is empty (commits) or always (fetches with no member id)."""
        member = group.members.get(member_id or "")
        if member is None:
            return E.unknown_member_id
        if epoch != member.member_epoch:
            return E.stale_member_epoch
        return None


def new_member_uuid() -> str:
    """Kafka's Uuid.randomUuid().toString(): URL-safe base64 of 16 bytes, unpadded."""
    import base64
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
