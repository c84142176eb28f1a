"""The rebalance protocol between requests: join phase, sync phase, and expirations.

Theory of operation
-------------------
A rebalance (Kafka's GroupCoordinator.prepareRebalance .. onCompleteJoin) runs like this:

1. `prepare_rebalance`: the group enters PreparingRebalance and a JOIN deadline is set:
   the largest member rebalance timeout, or - for a group that was Empty - the initial
   rebalance delay, extended by another delay each time a new member arrived, but never
   past the rebalance timeout (Kafka's InitialDelayedJoin).
2. Members' JoinGroup requests wait as `join_waiter`s. The join phase completes
   (`complete_join`) when every member is waiting and no handed-out member id is still
   pending, or when the JOIN deadline fires; dynamic members that did not rejoin are
   dropped, a leader is (re)elected, the generation is bumped, a protocol selected, and
   every waiter answered (the leader also gets all members' metadata). A SYNC deadline
   (rebalance timeout) starts.
3. SyncGroup requests wait as `sync_waiter`s. The leader's SyncGroup writes the group
   record with the assignment (`store_assignment`); when it is durable its replay
   (`on_group_record_durable`) moves the group to Stable and answers every waiter. A
   member that has not sent SyncGroup by the SYNC deadline is removed and the group
   rebalances again.

Sessions: every member has a SESSION deadline, pushed back by heartbeats, commits and
answers. When it fires the member is removed - unless it is waiting in a join or sync
phase, which counts as alive (the rebalance timeout governs it), except a brand-new
member, whose JoinGroup expires after `new_member_join_timeout_ms`.

All of this is soft state (see group.py); the durable effects are the records written
through `Ctx.append`: the assignment at the end of a rebalance, and the empty group when
a rebalance ends without members.
"""

from __future__ import annotations

from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from onceflow.groups.api import (
    JoinGroupResult,
    SyncGroupResult,
    group_append_error,
    join_error,
)
from onceflow.groups.context import JOIN, SESSION, SYNC, Ctx, timer_key
from onceflow.groups.group import Group, Member, Protocols
from onceflow.groups.records import GroupMetadataValue, group_metadata_record
from onceflow.groups.state import CAN_REBALANCE, GroupState

S = GroupState


# ---------------------------------------------------------------- append intents


@dataclass(frozen=True, slots=True)
class StoreAssignment:
    """The leader's assignment for `generation_id` is being written."""

    group_id: str
    generation_id: int


@dataclass(frozen=True, slots=True)
class StaticRejoin:
    """A static member got a new member id in a Stable group; the record persisting the
    new id is being written. Holds what is needed to answer or to undo."""

    group_id: str
    generation_id: int
    instance_id: str
    old_member_id: str
    new_member_id: str
    old_protocols: Protocols
    old_rebalance_timeout_ms: int
    old_session_timeout_ms: int
    old_leader: str | None
    supports_skip_assignment: bool


@dataclass(frozen=True, slots=True)
class Housekeeping:
    """Records whose loss only costs a later retry (empty group, expirations)."""

    reason: str


# ---------------------------------------------------------------- sessions


def schedule_heartbeat(ctx: Ctx, group: Group, member: Member) -> None:
    ctx.schedule_session(group, member.member_id, member.session_timeout_ms)


def on_session_expired(ctx: Ctx, group: Group, member_id: str) -> None:
    member = group.members.get(member_id)
    if member is None or group.is_(S.DEAD):
        return
    waiting = member.join_waiter is not None or member.sync_waiter is not None
    if waiting and not member.is_new:
        return  # alive while it waits; the answer reschedules its session
    remove_member_and_update_group(ctx, group, member)


def on_pending_member_expired(ctx: Ctx, group: Group, member_id: str) -> None:
    if member_id in group.pending_members:
        remove_pending_member_and_update_group(ctx, group, member_id)


# ---------------------------------------------------------------- join phase


def maybe_prepare_rebalance(ctx: Ctx, group: Group) -> None:
    if group.state in CAN_REBALANCE:
        prepare_rebalance(ctx, group)


def prepare_rebalance(ctx: Ctx, group: Group) -> None:
    if group.is_(S.COMPLETING_REBALANCE):
        reset_and_propagate_assignment_error(ctx, group, ErrorCode.rebalance_in_progress)
    group.pending_sync.clear()
    ctx.cancel(SYNC, group)
    was_empty = group.is_(S.EMPTY)
    group.transition(S.PREPARING_REBALANCE, ctx.now_ms)
    if was_empty:
        delay_ms = ctx.config.group_initial_rebalance_delay_ms
        remaining_ms = max(group.rebalance_timeout_ms - delay_ms, 0)
        group.initial_join = (delay_ms, remaining_ms, ctx.now_ms + delay_ms)
        group.new_member_added = False
        ctx.schedule(JOIN, group, delay_ms)
    else:
        group.initial_join = None
        ctx.schedule(JOIN, group, group.rebalance_timeout_ms)
        try_complete_join(ctx, group)


def try_complete_join(ctx: Ctx, group: Group) -> None:
    """Complete the join phase early if everyone is in (never during the initial delay)."""
    if group.is_(S.PREPARING_REBALANCE) and group.initial_join is None \
            and group.has_all_members_joined():
        complete_join(ctx, group)


def on_join_deadline(ctx: Ctx, group: Group) -> None:
    if not group.is_(S.PREPARING_REBALANCE):
        return
    if group.initial_join is not None:
        delay_ms, remaining_ms, deadline_ms = group.initial_join
        if group.new_member_added and remaining_ms != 0:
            # Kafka's InitialDelayedJoin: wait once more for stragglers, within the budget.
            # Counted from the deadline, not from a late tick, so the budget holds.
            group.new_member_added = False
            next_delay_ms = min(ctx.config.group_initial_rebalance_delay_ms, remaining_ms)
            group.initial_join = (next_delay_ms, max(remaining_ms - delay_ms, 0),
                                  deadline_ms + next_delay_ms)
            ctx.timers.schedule(timer_key(JOIN, group), deadline_ms + next_delay_ms)
            return
    complete_join(ctx, group)


def complete_join(ctx: Ctx, group: Group) -> None:
    """Kafka's onCompleteJoin."""
    ctx.cancel(JOIN, group)
    group.initial_join = None
    for member in [m for m in group.members.values()
                   if m.join_waiter is None and m.group_instance_id is None]:
        group.remove(member.member_id)
        answer_dropped(group, member)
        ctx.cancel_session(group, member.member_id)
    if group.is_(S.DEAD):
        return
    if not group.maybe_elect_new_joined_leader() and group.members:
        # only static members that did not rejoin are left: wait another rebalance timeout
        ctx.schedule(JOIN, group, group.rebalance_timeout_ms)
        return
    group.init_next_generation(ctx.now_ms)
    if group.is_(S.EMPTY):
        ctx.append(group.partition, [group_metadata_record(group.group_id, group.to_value())],
                   Housekeeping("group became empty"))
        return
    for member in group.members.values():
        leader = group.is_leader(member.member_id)
        group.answer_join(member, JoinGroupResult(
            error=ErrorCode.none, member_id=member.member_id,
            generation_id=group.generation_id, protocol_type=group.protocol_type,
            protocol_name=group.protocol_name, leader=group.leader_id or "",
            members=group.current_member_metadata() if leader else ()))
        schedule_heartbeat(ctx, group, member)
        member.is_new = False
        member.static_rejoin = None
        group.pending_sync.add(member.member_id)
    ctx.schedule(SYNC, group, group.rebalance_timeout_ms)


# ---------------------------------------------------------------- sync phase


def remove_pending_sync(ctx: Ctx, group: Group, member_id: str) -> None:
    group.pending_sync.discard(member_id)
    if not group.pending_sync:
        ctx.cancel(SYNC, group)


def on_sync_deadline(ctx: Ctx, group: Group) -> None:
    if not group.is_(S.COMPLETING_REBALANCE, S.STABLE) or not group.pending_sync:
        return
    for member_id in sorted(group.pending_sync):
        member = group.remove(member_id)
        if member is not None:
            answer_dropped(group, member)
        ctx.cancel_session(group, member_id)
    prepare_rebalance(ctx, group)


def store_assignment(ctx: Ctx, group: Group, assignment: dict[str, bytes]) -> None:
    """The leader's SyncGroup: write the group with its assignment (missing members get
    an empty one, as in Kafka). Its replay completes the sync phase."""
    full = {m: assignment.get(m, b"") for m in group.members}
    value = group.to_value(full)
    ctx.append(group.partition, [group_metadata_record(group.group_id, value)],
               StoreAssignment(group.group_id, group.generation_id))


def on_group_record_durable(ctx: Ctx, group: Group, value: GroupMetadataValue) -> None:
    """Replay of a group record into a live group (loading builds a new group instead)."""
    if value.generation != group.generation_id:
        return  # the group moved on while the record was written (Kafka ignores it too)
    if group.is_(S.COMPLETING_REBALANCE):
        assignment = {m.member_id: m.assignment for m in value.members}
        for member in group.members.values():
            member.assignment = assignment.get(member.member_id, b"")
        propagate_assignment(ctx, group, ErrorCode.none)
        group.transition(S.STABLE, ctx.now_ms)
    elif group.is_(S.STABLE):
        persisted = {m.member_id for m in value.members}
        for member in list(group.members.values()):
            if member.static_rejoin is not None and member.member_id in persisted:
                answer_static_rejoin(group, member)


def on_group_record_failed(ctx: Ctx, group: Group, intent: object, error: ErrorCode) -> None:
    error = group_append_error(error)
    if isinstance(intent, StoreAssignment):
        if group.is_(S.COMPLETING_REBALANCE) and group.generation_id == intent.generation_id:
            reset_and_propagate_assignment_error(ctx, group, error)
            maybe_prepare_rebalance(ctx, group)
    elif isinstance(intent, StaticRejoin):
        revert_static_rejoin(ctx, group, intent, error)


def reset_and_propagate_assignment_error(ctx: Ctx, group: Group, error: ErrorCode) -> None:
    assert group.is_(S.COMPLETING_REBALANCE)
    for member in group.members.values():
        member.assignment = b""
    propagate_assignment(ctx, group, error)


def propagate_assignment(ctx: Ctx, group: Group, error: ErrorCode) -> None:
    ok = error is ErrorCode.none
    for member in group.members.values():
        result = SyncGroupResult(error, group.protocol_type if ok else None,
                                 group.protocol_name if ok else None, member.assignment)
        if group.answer_sync(member, result):
            schedule_heartbeat(ctx, group, member)


# ---------------------------------------------------------------- static members


def answer_static_rejoin(group: Group, member: Member) -> None:
    rejoin = member.static_rejoin
    assert isinstance(rejoin, StaticRejoin)
    member.static_rejoin = None
    if rejoin.supports_skip_assignment:
        # JoinGroup v9+: the leader learns it leads but skips the assignor (KIP-814)
        leader = group.is_leader(member.member_id)
        result = JoinGroupResult(
            ErrorCode.none, member.member_id, group.generation_id, group.protocol_type,
            group.protocol_name, group.leader_id or "", skip_assignment=leader,
            members=group.current_member_metadata() if leader else ())
    else:
        # older clients: name the old leader, so a restarted leader does not run an
        # assignment that a Stable group would not distribute
        result = JoinGroupResult(
            ErrorCode.none, member.member_id, group.generation_id, group.protocol_type,
            group.protocol_name, rejoin.old_leader or "")
    group.answer_join(member, result)


def revert_static_rejoin(ctx: Ctx, group: Group, rejoin: StaticRejoin, error: ErrorCode) -> None:
    member = group.members.get(rejoin.new_member_id)
    if member is None or member.static_rejoin is not rejoin or not group.is_(S.STABLE):
        return  # already answered by a rebalance, or replaced again
    member.static_rejoin = None
    waiter, member.join_waiter = member.join_waiter, None
    group.update_member(member, rejoin.old_protocols, rejoin.old_rebalance_timeout_ms,
                        rejoin.old_session_timeout_ms, None)
    old = group.replace_static_member(rejoin.instance_id, rejoin.new_member_id,
                                      rejoin.old_member_id)
    schedule_heartbeat(ctx, group, old)
    if waiter is not None:
        waiter(JoinGroupResult(error, "", group.generation_id, group.protocol_type,
                               group.protocol_name, rejoin.old_leader or ""))


# ---------------------------------------------------------------- removal


def answer_dropped(group: Group, member: Member) -> None:
    """A member left the group: answer whatever it still waits for (Kafka answers the
    join with UNKNOWN_MEMBER_ID so a live client rejoins; it never had a sync pending)."""
    group.answer_join(member, join_error("", ErrorCode.unknown_member_id))
    group.answer_sync(member, SyncGroupResult(ErrorCode.unknown_member_id))


def answer_all_removed(group: Group) -> None:
    """The group itself is gone: nothing it still waits for will happen."""
    for member in group.members.values():
        answer_dropped(group, member)


def remove_member_and_update_group(ctx: Ctx, group: Group, member: Member) -> None:
    group.remove(member.member_id)
    answer_dropped(group, member)
    ctx.cancel_session(group, member.member_id)
    if group.is_(S.STABLE, S.COMPLETING_REBALANCE):
        maybe_prepare_rebalance(ctx, group)
    elif group.is_(S.PREPARING_REBALANCE):
        try_complete_join(ctx, group)


def remove_pending_member_and_update_group(ctx: Ctx, group: Group, member_id: str) -> None:
    group.remove(member_id)
    if group.is_(S.PREPARING_REBALANCE):
        try_complete_join(ctx, group)


def fire_timer(ctx: Ctx, key: tuple, group: Group) -> None:
    """Dispatch one due timer of `group` (Kafka's purgatory expirations)."""
    kind, _, _, member_id = key
    if kind == SESSION:
        on_session_expired(ctx, group, member_id)
    elif kind == JOIN:
        on_join_deadline(ctx, group)
    elif kind == SYNC:
        on_sync_deadline(ctx, group)
    else:
        on_pending_member_expired(ctx, group, member_id)
