"""JoinGroup, SyncGroup, Heartbeat, LeaveGroup, DescribeGroups, ListGroups, DeleteGroups.

Each handler checks that this node coordinates the group (else NOT_COORDINATOR, and the
client looks the coordinator up again), maps the kio request of any version onto one
`GroupCoordinator` call, lets the `GroupRuntime` persist what the call produced, and maps
the version-independent result back onto the response of the request's version. The
group semantics live in onceflow.groups; nothing here decides anything.

Version notes (Kafka's message specs):
- JoinGroup v0 has no rebalance timeout (the coordinator then uses the session timeout);
  v4+ asks new dynamic members to come back with the id it hands out (MEMBER_ID_REQUIRED);
  before v7 the protocol name is not nullable (Kafka answers "" on errors).
- LeaveGroup v0-2 carries one member_id and answers its error at the top level; v3+
  carries a batch of members (KIP-345) and answers each.
- DescribeGroups v6 (KIP-1043) answers GROUP_ID_NOT_FOUND for a group that does not
  exist instead of an empty "Dead" group.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from onceflow.broker.handlers import ApiKey, RequestContext, handles, route_group
from onceflow.broker.handlers.operations import authorized_operations
from onceflow.security.acl import Operation, ResourceType
from onceflow.groups import (
    DescribedGroup,
    JoinGroupResult,
    LeaveGroupResult,
    MemberIdentity,
    SyncGroupResult,
)
from onceflow.protocol.codec import to_ms

# JoinGroup v0 has no rebalance timeout: the coordinator treats a negative one as "use
# the session timeout" (Kafka does the same for v0 members).
NO_REBALANCE_TIMEOUT = -1
NULLABLE_PROTOCOL_NAME_MIN_VERSION = 7  # JoinGroup: protocol name/type nullable from v7
BATCHED_LEAVE_MIN_VERSION = 3  # LeaveGroup: members array (KIP-345)
DESCRIBE_NOT_FOUND_MIN_VERSION = 6  # DescribeGroups: GROUP_ID_NOT_FOUND (KIP-1043)
DEAD = "Dead"
# Kafka's sentinel for "authorized operations not requested".
AUTHORIZED_OPERATIONS_OMITTED = -(2**31)


# ---------------------------------------------------------------- JoinGroup


def _join_response(api_version: int, result: JoinGroupResult) -> dict:
    nullable = api_version >= NULLABLE_PROTOCOL_NAME_MIN_VERSION
    protocol_name = result.protocol_name if nullable else (result.protocol_name or "")
    return {
        "throttle_time": 0, "error_code": result.error, "generation_id": result.generation_id,
        "protocol_type": result.protocol_type, "protocol_name": protocol_name,
        "leader": result.leader, "skip_assignment": result.skip_assignment,
        "member_id": result.member_id,
        "members": [{"member_id": m.member_id, "group_instance_id": m.group_instance_id,
                     "metadata": m.metadata} for m in result.members],
    }


@handles(ApiKey.JOIN_GROUP)
async def join_group(ctx: RequestContext, body) -> dict:
    runtime = ctx.groups
    error = route_group(ctx, body.group_id, Operation.READ)
    if error is not None:
        return _join_response(ctx.api_version, JoinGroupResult(error, body.member_id))
    rebalance = getattr(body, "rebalance_timeout", None)
    result = await runtime.answer(lambda respond: runtime.coordinator.join_group(
        group_id=body.group_id, member_id=body.member_id,
        group_instance_id=getattr(body, "group_instance_id", None),
        client_id=ctx.client_id or "", client_host=ctx.client_host,
        session_timeout_ms=to_ms(body.session_timeout),
        rebalance_timeout_ms=NO_REBALANCE_TIMEOUT if rebalance is None else to_ms(rebalance),
        protocol_type=body.protocol_type, protocols=body.protocols,
        api_version=ctx.api_version, now_ms=ctx.now_ms(), respond=respond))
    return _join_response(ctx.api_version, result)


# ---------------------------------------------------------------- SyncGroup


def _sync_response(result: SyncGroupResult) -> dict:
    return {"throttle_time": 0, "error_code": result.error,
            "protocol_type": result.protocol_type, "protocol_name": result.protocol_name,
            "assignment": result.assignment}


@handles(ApiKey.SYNC_GROUP)
async def sync_group(ctx: RequestContext, body) -> dict:
    runtime = ctx.groups
    error = route_group(ctx, body.group_id, Operation.READ)
    if error is not None:
        return _sync_response(SyncGroupResult(error))
    result = await runtime.answer(lambda respond: runtime.coordinator.sync_group(
        group_id=body.group_id, generation_id=body.generation_id, member_id=body.member_id,
        group_instance_id=getattr(body, "group_instance_id", None),
        protocol_type=getattr(body, "protocol_type", None),
        protocol_name=getattr(body, "protocol_name", None),
        assignments=body.assignments, now_ms=ctx.now_ms(), respond=respond))
    return _sync_response(result)


# ---------------------------------------------------------------- Heartbeat


@handles(ApiKey.HEARTBEAT)
async def heartbeat(ctx: RequestContext, body) -> dict:
    runtime = ctx.groups
    error = route_group(ctx, body.group_id, Operation.READ)
    if error is None:
        result = await runtime.persist(runtime.coordinator.heartbeat(
            group_id=body.group_id, generation_id=body.generation_id, member_id=body.member_id,
            group_instance_id=getattr(body, "group_instance_id", None), now_ms=ctx.now_ms()))
        error = result.error
    return {"throttle_time": 0, "error_code": error}


# ---------------------------------------------------------------- LeaveGroup


def _leave_response(api_version: int, result: LeaveGroupResult) -> dict:
    if api_version < BATCHED_LEAVE_MIN_VERSION:  # one member: its error is the answer
        error = result.error
        if error is ErrorCode.none and result.members:
            error = result.members[0].error
        return {"throttle_time": 0, "error_code": error}
    return {"throttle_time": 0, "error_code": result.error,
            "members": [{"member_id": m.member_id, "group_instance_id": m.group_instance_id,
                         "error_code": m.error} for m in result.members]}


@handles(ApiKey.LEAVE_GROUP)
async def leave_group(ctx: RequestContext, body) -> dict:
    runtime = ctx.groups
    error = route_group(ctx, body.group_id, Operation.READ)
    if error is not None:
        return _leave_response(ctx.api_version, LeaveGroupResult(error))
    if ctx.api_version < BATCHED_LEAVE_MIN_VERSION:
        members = [MemberIdentity(body.member_id)]
    else:
        members = list(body.members)
    result = await runtime.persist(runtime.coordinator.leave_group(
        group_id=body.group_id, members=members, now_ms=ctx.now_ms()))
    return _leave_response(ctx.api_version, result)


# ---------------------------------------------------------------- DescribeGroups


def _described(api_version: int, group: DescribedGroup) -> dict:
    error, message = group.error, None
    if api_version >= DESCRIBE_NOT_FOUND_MIN_VERSION and error is ErrorCode.none \
            and group.group_state == DEAD:
        error, message = ErrorCode.group_id_not_found, f"Group {group.group_id} not found."
    return {
        "error_code": error, "error_message": message, "group_id": group.group_id,
        "group_state": group.group_state, "protocol_type": group.protocol_type,
        "protocol_data": group.protocol_data,
        "members": [{"member_id": m.member_id, "group_instance_id": m.group_instance_id,
                     "client_id": m.client_id, "client_host": m.client_host,
                     "member_metadata": m.member_metadata,
                     "member_assignment": m.member_assignment} for m in group.members],
        "authorized_operations": AUTHORIZED_OPERATIONS_OMITTED,
    }


def _describe_one(ctx: RequestContext, group_id: str) -> DescribedGroup:
    runtime = ctx.groups
    error = route_group(ctx, group_id, Operation.DESCRIBE)
    if error is not None:
        return DescribedGroup(group_id, error, "")
    return runtime.coordinator.describe_groups([group_id])[0]


@handles(ApiKey.DESCRIBE_GROUPS)
async def describe_groups(ctx: RequestContext, body) -> dict:
    groups = [_described(ctx.api_version, _describe_one(ctx, g)) for g in body.groups]
    if getattr(body, "include_authorized_operations", False):  # v3+ (issue 15)
        groups = [{**g, "authorized_operations": authorized_operations(
            ctx, ResourceType.GROUP, g["group_id"])} if g["error_code"] == ErrorCode.none else g
            for g in groups]
    return {"throttle_time": 0, "groups": groups}


# ---------------------------------------------------------------- ListGroups


@handles(ApiKey.LIST_GROUPS)
async def list_groups(ctx: RequestContext, body) -> dict:
    """The groups this node coordinates (an admin client asks every node and merges)."""
    runtime = ctx.groups
    result = runtime.coordinator.list_groups(getattr(body, "states_filter", ()) or (),
                                             getattr(body, "types_filter", ()) or ())
    ours = [g for g in result.groups if runtime.coordinator_node(g.group_id) == ctx.node_id
            and (ctx.authorized_cluster(Operation.DESCRIBE)
                 or ctx.authorized(Operation.DESCRIBE, ResourceType.GROUP, g.group_id))]
    return {"throttle_time": 0, "error_code": result.error,
            "groups": [{"group_id": g.group_id, "protocol_type": g.protocol_type,
                        "group_state": g.group_state, "group_type": g.group_type}
                       for g in ours]}


# ---------------------------------------------------------------- DeleteGroups


@handles(ApiKey.DELETE_GROUPS)
async def delete_groups(ctx: RequestContext, body) -> dict:
    runtime = ctx.groups
    errors = {g: route_group(ctx, g, Operation.DELETE) for g in body.groups_names}
    ours = [g for g, error in errors.items() if error is None]
    deleted = {}
    if ours:
        results = await runtime.persist(runtime.coordinator.delete_groups(ours, ctx.now_ms()))
        deleted = {r.group_id: r.error for r in results}
    return {"throttle_time": 0,
            "results": [{"group_id": g, "error_code": errors[g] or deleted[g]}
                        for g in body.groups_names]}
