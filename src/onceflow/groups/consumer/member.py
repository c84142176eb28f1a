"""A consumer-group member and its reconciliation state machine (Kafka's
ConsumerGroupMember and CurrentAssignmentBuilder).

Theory of operation
-------------------
The coordinator computes a *target* assignment for the whole group (target.py); each
member then moves towards its part of it in steps that never let two members own one
partition at the same time:

1. partitions the member owns but the target gives to someone else are *revoked*
   first: the member stays at its epoch in UNREVOKED_PARTITIONS until a heartbeat's
   owned partitions no longer list them;
2. then it moves to the target epoch and gets the target's partitions that are free
   (no other member holds them at any epoch); partitions still held by their previous
   owner are *unreleased*: the member waits for them in UNRELEASED_PARTITIONS and gets
   each one at a later heartbeat, once its previous owner revoked it.

`reconcile` is that step as a pure function of (member, target epoch, target partitions,
who holds what, what the member reports it owns). A member is a frozen value: the
coordinator writes the new value's record and replays it, as for every change.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, replace

from onceflow.groups.consumer.records import (
    MemberAssignmentValue,
    MemberSubscription,
    TopicPartition,
)

LEAVE_GROUP_MEMBER_EPOCH = -1  # ConsumerGroupHeartbeatRequest.LEAVE_GROUP_MEMBER_EPOCH
LEAVE_GROUP_STATIC_MEMBER_EPOCH = -2
JOIN_GROUP_MEMBER_EPOCH = 0
NO_PARTITION_EPOCH = -1  # a partition nobody holds


class IllegalMemberTransition(RuntimeError):
    """A member state change that is not in LEGAL_MEMBER_TRANSITIONS (our bug)."""


class MemberState(enum.Enum):
    """Kafka's MemberState; `.value` is its int8 in ConsumerGroupCurrentMemberAssignment."""

    def __new__(cls, value: int, doc: str) -> MemberState:
        member = object.__new__(cls)
        member._value_ = value
        member.__doc__ = doc
        return member

    STABLE = (0, """Reconciled: the member owns exactly its target partitions at the
        assignment epoch. A heartbeat at a newer target epoch starts the next step
        (revoke first, or assign at once); otherwise it is answered with the same epoch.""")
    UNREVOKED_PARTITIONS = (1, """Waiting for the member to give up partitions the target
        moved to others. Heartbeats are answered with the current epoch and the reduced
        assignment; the one whose owned partitions no longer list the revoked ones moves
        the member on. The rebalance timeout fences a member that never does.""")
    UNRELEASED_PARTITIONS = (2, """At the target epoch, but some target partitions are still
        held by their previous owner. Each heartbeat hands over those released since.""")
    UNKNOWN = (127, """A state a newer Kafka wrote that this version does not know: the
        member is fenced at its next heartbeat unless it owns nothing (Kafka's rule).""")


_M = MemberState
# Kafka's builder may move between any two known states; nothing is ever written as
# UNKNOWN (it only comes from a log written by a newer version).
LEGAL_MEMBER_TRANSITIONS: dict[MemberState, frozenset[MemberState]] = {
    _M.STABLE: frozenset({_M.STABLE, _M.UNREVOKED_PARTITIONS, _M.UNRELEASED_PARTITIONS}),
    _M.UNREVOKED_PARTITIONS: frozenset({_M.STABLE, _M.UNREVOKED_PARTITIONS,
                                        _M.UNRELEASED_PARTITIONS}),
    _M.UNRELEASED_PARTITIONS: frozenset({_M.STABLE, _M.UNREVOKED_PARTITIONS,
                                         _M.UNRELEASED_PARTITIONS}),
    _M.UNKNOWN: frozenset({_M.STABLE, _M.UNREVOKED_PARTITIONS, _M.UNRELEASED_PARTITIONS}),
}


def member_state(value: int) -> MemberState:
    try:
        return MemberState(value)
    except ValueError:
        return MemberState.UNKNOWN


@dataclass(frozen=True, slots=True)
class ConsumerMember:
    member_id: str
    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    subscribed_topic_names: tuple[str, ...] = ()
    subscribed_topic_regex: str | None = None
    rebalance_timeout_ms: int = -1
    server_assignor: str | None = None
    member_epoch: int = JOIN_GROUP_MEMBER_EPOCH
    previous_member_epoch: int = JOIN_GROUP_MEMBER_EPOCH
    state: MemberState = MemberState.STABLE
    assigned: frozenset[TopicPartition] = frozenset()
    pending_revocation: frozenset[TopicPartition] = frozenset()

    # ------------------------------------------------------------ records

    def subscription(self) -> MemberSubscription:
        return MemberSubscription(self.instance_id, self.rack_id, self.client_id,
                                  self.client_host, self.subscribed_topic_names,
                                  self.subscribed_topic_regex, self.rebalance_timeout_ms,
                                  self.server_assignor)

    def with_subscription(self, s: MemberSubscription) -> ConsumerMember:
        return replace(self, instance_id=s.instance_id, rack_id=s.rack_id,
                       client_id=s.client_id, client_host=s.client_host,
                       subscribed_topic_names=tuple(s.subscribed_topic_names),
                       subscribed_topic_regex=s.subscribed_topic_regex,
                       rebalance_timeout_ms=s.rebalance_timeout_ms,
                       server_assignor=s.server_assignor)

    def assignment_value(self) -> MemberAssignmentValue:
        return MemberAssignmentValue(self.member_epoch, self.previous_member_epoch,
                                     self.state.value, self.assigned, self.pending_revocation)

    def with_assignment(self, v: MemberAssignmentValue) -> ConsumerMember:
        return replace(self, member_epoch=v.member_epoch,
                       previous_member_epoch=v.previous_member_epoch,
                       state=member_state(v.state), assigned=v.assigned,
                       pending_revocation=v.pending_revocation)

    # ------------------------------------------------------------ facts

    def is_reconciled_to(self, target_epoch: int) -> bool:
        return self.state is MemberState.STABLE and self.member_epoch == target_epoch

    def subscription_differs(self, other: ConsumerMember) -> bool:
        return (self.subscribed_topic_names != other.subscribed_topic_names
                or self.subscribed_topic_regex != other.subscribed_topic_regex)


def _move(member: ConsumerMember, state: MemberState, epoch: int,
          assigned: frozenset[TopicPartition],
          pending: frozenset[TopicPartition]) -> ConsumerMember:
    if state not in LEGAL_MEMBER_TRANSITIONS[member.state]:
        raise IllegalMemberTransition(f"member {member.member_id}: {member.state.name} -> "
                                      f"{state.name}")
    # Kafka's updateMemberEpoch: the previous epoch is the one before this step, so a
    # member whose answer was lost may heartbeat once more with it
    return replace(member, state=state, member_epoch=epoch,
                   previous_member_epoch=member.member_epoch,
                   assigned=assigned, pending_revocation=pending)


class MustRejoin(Exception):
    """Kafka's FencedMemberEpochException from the builder: the member is in a state this
    version does not know and still owns partitions."""


def reconcile(member: ConsumerMember, target_epoch: int, target: frozenset[TopicPartition],
              holder_epoch: Callable[[TopicPartition], int],
              owned: frozenset[TopicPartition] | None) -> ConsumerMember:
    """The member's next value (Kafka's CurrentAssignmentBuilder.build). `holder_epoch` is
    the epoch at which some member holds a partition (NO_PARTITION_EPOCH if free); `owned`
    is what the heartbeat reported (None: not sent this time)."""
    state = member.state
    if state is MemberState.STABLE:
        if member.member_epoch == target_epoch:
            return member
        return _next(member, member.member_epoch, target_epoch, target, holder_epoch, owned)
    if state is MemberState.UNREVOKED_PARTITIONS:
        if _still_owns(owned, member.pending_revocation):
            return member
        return _next(member, member.member_epoch, target_epoch, target, holder_epoch, owned)
    if state is MemberState.UNRELEASED_PARTITIONS:
        return _next(member, member.member_epoch, target_epoch, target, holder_epoch, owned)
    if owned is None or owned:
        raise MustRejoin(member.member_id)
    return _next(member, target_epoch, target_epoch, target, holder_epoch, owned)


def _still_owns(owned: frozenset[TopicPartition] | None,
                revoking: frozenset[TopicPartition]) -> bool:
    """Without owned partitions in the heartbeat, assume it still owns everything."""
    return owned is None or bool(owned & revoking)


def _next(member: ConsumerMember, epoch: int, target_epoch: int,
          target: frozenset[TopicPartition], holder_epoch: Callable[[TopicPartition], int],
          owned: frozenset[TopicPartition] | None) -> ConsumerMember:
    """Kafka's computeNextAssignment."""
    kept = member.assigned & target
    revoking = member.assigned - kept
    wanted = target - kept
    free = frozenset(tp for tp in wanted if holder_epoch(tp) == NO_PARTITION_EPOCH)
    unreleased = wanted != free
    if revoking and _still_owns(owned, revoking):
        return _move(member, MemberState.UNREVOKED_PARTITIONS, epoch, kept, revoking)
    state = MemberState.UNRELEASED_PARTITIONS if unreleased else MemberState.STABLE
    return _move(member, state, target_epoch, kept | free, frozenset())
