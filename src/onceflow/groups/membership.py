"""JoinGroup, SyncGroup, Heartbeat and LeaveGroup of the classic group protocol.

Each handler follows Kafka's classic GroupCoordinator rule for rule (doJoinGroup,
doSyncGroup, handleHeartbeat, handleLeaveGroup); where we differ, a comment says why.
The coordinator-level checks (group id valid, partition loaded here) happen before, in
`coordinator.py`. JoinGroup and SyncGroup answer through `respond`, possibly later (from
`tick` or from the replay of a record); Heartbeat and LeaveGroup answer at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from onceflow.groups.api import (
    AssignmentLike,
    HeartbeatResult,
    JoinGroupResult,
    JoinRespond,
    LeaveGroupResult,
    LeaveMemberResult,
    MemberIdentityLike,
    SyncGroupResult,
    SyncRespond,
    join_error,
)
from onceflow.groups.context import PENDING_MEMBER, Ctx
from onceflow.groups.group import MEMBER_ID_DELIMITER, Group, Member, Protocols
from onceflow.groups.rebalance import (
    StaticRejoin,
    maybe_prepare_rebalance,
    prepare_rebalance,
    remove_member_and_update_group,
    remove_pending_member_and_update_group,
    remove_pending_sync,
    schedule_heartbeat,
    store_assignment,
    try_complete_join,
)
from onceflow.groups.records import group_metadata_record
from onceflow.groups.state import GroupState

S = GroupState
UNKNOWN_MEMBER_ID = ""  # Kafka's JoinGroupRequest.UNKNOWN_MEMBER_ID

# JoinGroup versions (Kafka: JoinGroupRequest.requiresKnownMemberId / supportsSkippingAssignment)
JOIN_REQUIRES_KNOWN_MEMBER_ID_MIN_VERSION = 4  # KIP-394: MEMBER_ID_REQUIRED round trip
JOIN_SKIP_ASSIGNMENT_MIN_VERSION = 9  # KIP-814: static leader rejoin skips the assignor


@dataclass(frozen=True, slots=True)
class JoinRequest:
    group_id: str
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: Protocols
    api_version: int


# ---------------------------------------------------------------- JoinGroup


def join_group(ctx: Ctx, groups: dict[str, Group], partition: int, req: JoinRequest,
               respond: JoinRespond) -> None:
    config = ctx.config
    if not config.group_min_session_timeout_ms <= req.session_timeout_ms \
            <= config.group_max_session_timeout_ms:
        respond(join_error(req.member_id, ErrorCode.invalid_session_timeout))
        return
    is_unknown = req.member_id == UNKNOWN_MEMBER_ID
    group = groups.get(req.group_id)
    if group is None:
        if not is_unknown:  # a member id for a group we do not know
            respond(join_error(req.member_id, ErrorCode.unknown_member_id))
            return
        group = groups[req.group_id] = Group(req.group_id, partition, S.EMPTY, ctx.now_ms)
    if not _accepts_joining_member(ctx, group, req.member_id):
        member = group.remove(req.member_id)  # Kafka sheds a member that had not rejoined
        if member is not None:
            group.answer_join(member, join_error(UNKNOWN_MEMBER_ID,
                                                 ErrorCode.group_max_size_reached))
            ctx.cancel_session(group, member.member_id)
        respond(join_error(UNKNOWN_MEMBER_ID, ErrorCode.group_max_size_reached))
    elif is_unknown:
        _join_new_member(ctx, group, req, respond)
    else:
        _join_current_member(ctx, group, req, respond)
    try_complete_join(ctx, group)


def _accepts_joining_member(ctx: Ctx, group: Group, member_id: str) -> bool:
    """Kafka's acceptJoiningMember (group.max.size)."""
    max_size = ctx.config.group_max_size
    member = group.members.get(member_id)
    if group.is_(S.EMPTY, S.DEAD):
        return True
    if group.is_(S.PREPARING_REBALANCE):
        return (member is not None and member.join_waiter is not None) \
            or group.num_awaiting_join() < max_size
    return member is not None or len(group.members) < max_size


def _protocol_error(group: Group, req: JoinRequest) -> ErrorCode | None:
    if group.is_(S.DEAD):
        # removed meanwhile (deleted, unloaded): let the client find the coordinator again
        return ErrorCode.coordinator_not_available
    names = tuple(name for name, _ in req.protocols)
    if not group.supports_protocols(req.protocol_type, names):
        return ErrorCode.inconsistent_group_protocol
    return None


def _join_new_member(ctx: Ctx, group: Group, req: JoinRequest, respond: JoinRespond) -> None:
    error = _protocol_error(group, req)
    if error is not None:
        respond(join_error(UNKNOWN_MEMBER_ID, error))
        return
    new_member_id = (req.group_instance_id or req.client_id) + MEMBER_ID_DELIMITER + ctx.new_uuid()
    if req.group_instance_id is not None:
        old_member_id = group.static_members.get(req.group_instance_id)
        if old_member_id is not None:
            _rejoin_static_member(ctx, group, req, old_member_id, new_member_id, respond)
        else:
            _add_member_and_rebalance(ctx, group, req, new_member_id, respond)
    elif req.api_version >= JOIN_REQUIRES_KNOWN_MEMBER_ID_MIN_VERSION:
        # KIP-394: hand out the id and let the client come back with it, so that a client
        # whose request timed out does not leave a phantom member behind
        group.pending_members.add(new_member_id)
        ctx.schedule(PENDING_MEMBER, group, req.session_timeout_ms, new_member_id)
        respond(join_error(new_member_id, ErrorCode.member_id_required))
    else:
        _add_member_and_rebalance(ctx, group, req, new_member_id, respond)


def _join_current_member(ctx: Ctx, group: Group, req: JoinRequest, respond: JoinRespond) -> None:
    error = _protocol_error(group, req)
    if error is not None:
        respond(join_error(req.member_id, error))
        return
    if req.member_id in group.pending_members:
        if req.group_instance_id is not None:
            # Kafka throws IllegalStateException here (a static member is never pending),
            # which reaches the client as UNKNOWN_SERVER_ERROR
            respond(join_error(req.member_id, ErrorCode.unknown_server_error))
            return
        ctx.cancel(PENDING_MEMBER, group, req.member_id)
        _add_member_and_rebalance(ctx, group, req, req.member_id, respond)
        return
    error = group.validate_member(req.member_id, req.group_instance_id)
    if error is not None:
        respond(join_error(req.member_id, error))
        return
    member = group.members[req.member_id]
    if group.is_(S.PREPARING_REBALANCE):
        _update_member_and_rebalance(ctx, group, member, req, respond)
    elif group.is_(S.COMPLETING_REBALANCE):
        if member.matches(req.protocols):
            # it lost its join response: send the current generation again
            leader = group.is_leader(member.member_id)
            members = group.current_member_metadata() if leader else ()
            respond(_current_generation(group, member, members))
        else:
            _update_member_and_rebalance(ctx, group, member, req, respond)
    elif group.is_(S.STABLE):
        if group.is_leader(member.member_id) or not member.matches(req.protocols):
            # the leader rejoins to trigger a rebalance for changes outside member metadata
            _update_member_and_rebalance(ctx, group, member, req, respond)
        else:
            respond(_current_generation(group, member, ()))
    else:  # Empty: members cannot exist; Dead was answered above
        respond(join_error(req.member_id, ErrorCode.unknown_member_id))


def _current_generation(group: Group, member: Member, members: tuple) -> JoinGroupResult:
    return JoinGroupResult(ErrorCode.none, member.member_id, group.generation_id,
                           group.protocol_type, group.protocol_name, group.leader_id or "",
                           members=members)


def _add_member_and_rebalance(ctx: Ctx, group: Group, req: JoinRequest, member_id: str,
                              respond: JoinRespond) -> None:
    member = Member(member_id, req.group_instance_id, req.client_id, req.client_host,
                    req.rebalance_timeout_ms, req.session_timeout_ms, req.protocol_type,
                    req.protocols, is_new=True)
    if group.is_(S.PREPARING_REBALANCE) and group.generation_id == 0:
        group.new_member_added = True  # extends the initial rebalance delay
    group.add(member, respond)
    # a new member cannot heartbeat while its JoinGroup waits; bound the wait instead
    ctx.schedule_session(group, member_id, ctx.config.new_member_join_timeout_ms)
    maybe_prepare_rebalance(ctx, group)


def _update_member_and_rebalance(ctx: Ctx, group: Group, member: Member, req: JoinRequest,
                                 respond: JoinRespond) -> None:
    group.update_member(member, req.protocols, req.rebalance_timeout_ms,
                        req.session_timeout_ms, respond)
    maybe_prepare_rebalance(ctx, group)


def _rejoin_static_member(ctx: Ctx, group: Group, req: JoinRequest, old_member_id: str,
                          new_member_id: str, respond: JoinRespond) -> None:
    """A static member restarted (unknown member id, known group.instance.id): its old id
    is fenced and replaced (Kafka: updateStaticMemberAndRebalance)."""
    assert req.group_instance_id is not None
    old_leader = group.leader_id
    member = group.members[old_member_id]
    rejoin = StaticRejoin(group.group_id, group.generation_id, req.group_instance_id,
                          old_member_id, new_member_id, member.protocols,
                          member.rebalance_timeout_ms, member.session_timeout_ms, old_leader,
                          req.api_version >= JOIN_SKIP_ASSIGNMENT_MIN_VERSION)
    group.replace_static_member(req.group_instance_id, old_member_id, new_member_id)
    ctx.cancel_session(group, old_member_id)
    schedule_heartbeat(ctx, group, member)
    group.update_member(member, req.protocols, req.rebalance_timeout_ms, req.session_timeout_ms,
                        respond)
    if group.is_(S.STABLE):
        if group.protocol_name == group.select_protocol():
            # nothing changes for the assignment: persist the new member id, answer on replay
            member.static_rejoin = rejoin
            ctx.append(group.partition, [group_metadata_record(group.group_id, group.to_value())],
                       rejoin)
        else:
            maybe_prepare_rebalance(ctx, group)
    elif group.is_(S.COMPLETING_REBALANCE):
        # the leader may already have computed an assignment under the old member id
        prepare_rebalance(ctx, group)
    else:
        assert group.is_(S.PREPARING_REBALANCE), group  # static members exist, so not Empty


# ---------------------------------------------------------------- SyncGroup


def sync_group(ctx: Ctx, group: Group | None, generation_id: int, member_id: str,
               group_instance_id: str | None, protocol_type: str | None,
               protocol_name: str | None, assignments: Sequence[AssignmentLike],
               respond: SyncRespond) -> None:
    if group is None:
        respond(SyncGroupResult(ErrorCode.unknown_member_id))
        return
    error = _sync_error(group, generation_id, member_id, group_instance_id, protocol_type,
                        protocol_name)
    if error is not None:
        respond(SyncGroupResult(error))
    elif group.is_(S.EMPTY):
        respond(SyncGroupResult(ErrorCode.unknown_member_id))
    elif group.is_(S.PREPARING_REBALANCE):
        respond(SyncGroupResult(ErrorCode.rebalance_in_progress))
    elif group.is_(S.COMPLETING_REBALANCE):
        member = group.members[member_id]
        if member.sync_waiter is not None:  # a retry supersedes (see Group.update_member)
            group.answer_sync(member, SyncGroupResult(ErrorCode.rebalance_in_progress))
        member.sync_waiter = respond
        remove_pending_sync(ctx, group, member_id)
        if group.is_leader(member_id):
            store_assignment(ctx, group, {a.member_id: bytes(a.assignment) for a in assignments})
    else:  # Stable: the assignment of this generation
        member = group.members[member_id]
        remove_pending_sync(ctx, group, member_id)
        respond(SyncGroupResult(ErrorCode.none, group.protocol_type, group.protocol_name,
                                member.assignment))
        schedule_heartbeat(ctx, group, member)


def _sync_error(group: Group, generation_id: int, member_id: str, instance_id: str | None,
                protocol_type: str | None, protocol_name: str | None) -> ErrorCode | None:
    if group.is_(S.DEAD):
        return ErrorCode.coordinator_not_available
    error = group.validate_member(member_id, instance_id)
    if error is not None:
        return error
    if generation_id != group.generation_id:
        return ErrorCode.illegal_generation
    if protocol_type is not None and protocol_type != group.protocol_type:
        return ErrorCode.inconsistent_group_protocol  # SyncGroup v5+ carries both
    if protocol_name is not None and protocol_name != group.protocol_name:
        return ErrorCode.inconsistent_group_protocol
    return None


# ---------------------------------------------------------------- Heartbeat


def heartbeat(ctx: Ctx, group: Group | None, member_id: str, group_instance_id: str | None,
              generation_id: int) -> HeartbeatResult:
    if group is None:
        return HeartbeatResult(ErrorCode.unknown_member_id)
    if group.is_(S.DEAD):
        return HeartbeatResult(ErrorCode.coordinator_not_available)
    error = group.validate_member(member_id, group_instance_id)
    if error is not None:
        return HeartbeatResult(error)
    if generation_id != group.generation_id:
        return HeartbeatResult(ErrorCode.illegal_generation)
    if group.is_(S.EMPTY):
        return HeartbeatResult(ErrorCode.unknown_member_id)
    schedule_heartbeat(ctx, group, group.members[member_id])
    if group.is_(S.PREPARING_REBALANCE):
        return HeartbeatResult(ErrorCode.rebalance_in_progress)
    return HeartbeatResult(ErrorCode.none)  # Stable, or CompletingRebalance after the join


# ---------------------------------------------------------------- LeaveGroup


def leave_group(ctx: Ctx, group: Group | None,
                members: Sequence[MemberIdentityLike]) -> LeaveGroupResult:
    if group is None:
        return LeaveGroupResult(ErrorCode.none, tuple(
            LeaveMemberResult(m.member_id, m.group_instance_id, ErrorCode.unknown_member_id)
            for m in members))
    if group.is_(S.DEAD):
        return LeaveGroupResult(ErrorCode.coordinator_not_available)
    results = tuple(
        LeaveMemberResult(m.member_id, m.group_instance_id,
                          _leave_one(ctx, group, m.member_id, m.group_instance_id))
        for m in members)
    return LeaveGroupResult(ErrorCode.none, results)


def _leave_one(ctx: Ctx, group: Group, member_id: str, instance_id: str | None) -> ErrorCode:
    if member_id == UNKNOWN_MEMBER_ID:
        # admin removal of a static member by its group.instance.id (KIP-345)
        current = group.static_members.get(instance_id) if instance_id is not None else None
        if current is None:
            return ErrorCode.unknown_member_id
        remove_member_and_update_group(ctx, group, group.members[current])
        return ErrorCode.none
    if member_id in group.pending_members:
        ctx.cancel(PENDING_MEMBER, group, member_id)
        remove_pending_member_and_update_group(ctx, group, member_id)
        return ErrorCode.none
    error = group.validate_member(member_id, instance_id)
    if error is not None:
        return error
    remove_member_and_update_group(ctx, group, group.members[member_id])
    return ErrorCode.none
