"""ConsumerGroupHeartbeat and ConsumerGroupDescribe: the consumer group protocol (KIP-848).

As for the classic APIs, each handler checks that this node coordinates the group (else
NOT_COORDINATOR), maps the kio request onto one `GroupCoordinator` call, lets the runtime
persist what it produced, and maps the result back; the rules live in
onceflow.groups.consumer. Before each call the runtime hands the coordinator the current
topics (`refresh_topics`), which is how a topic created after a member joined reaches a
regex subscription: at that member's next heartbeat, without any client-side refresh.

Versions: ConsumerGroupHeartbeat v0 (Java 3.7-3.9) lets the coordinator make the member
id; v1 (Kafka 4.0, librdkafka 2.16) has the client make it and carries the regex.
ConsumerGroupDescribe v1 adds each member's type (1: consumer protocol).
"""

from __future__ import annotations

from collections.abc import Iterable

from kio.schema.errors import ErrorCode

from onceflow.broker.handlers import ApiKey, RequestContext, handles, route_group
from onceflow.security.acl import Operation
from onceflow.groups.consumer.coordinator import DescribedConsumerGroup
from onceflow.groups.consumer.heartbeat import HeartbeatRequest
from onceflow.protocol.codec import to_ms

MEMBER_TYPE_CONSUMER = 1  # ConsumerGroupDescribe v1: 0 classic, 1 consumer
AUTHORIZED_OPERATIONS_OMITTED = -(2**31)
NOT_SET = -1


def _by_topic(tps: Iterable) -> list[dict]:
    topics: dict = {}
    for topic_id, partition in sorted(tps):
        topics.setdefault(topic_id, []).append(partition)
    return [{"topic_id": topic_id, "partitions": parts} for topic_id, parts in topics.items()]


def _owned(body) -> frozenset | None:
    if body.topic_partitions is None:
        return None
    return frozenset((t.topic_id, p) for t in body.topic_partitions for p in t.partitions)


def _heartbeat_response(result) -> dict:
    assignment = None
    if result.assignment is not None:
        assignment = {"topic_partitions": _by_topic(result.assignment)}
    return {"throttle_time": 0, "error_code": result.error, "error_message": result.message,
            "member_id": result.member_id, "member_epoch": result.member_epoch,
            "heartbeat_interval": result.heartbeat_interval_ms, "assignment": assignment}


@handles(ApiKey.CONSUMER_GROUP_HEARTBEAT)
async def consumer_group_heartbeat(ctx: RequestContext, body) -> dict:
    runtime = ctx.groups
    error = route_group(ctx, body.group_id, Operation.READ)
    if error is not None:
        return {"throttle_time": 0, "error_code": error, "member_epoch": NOT_SET,
                "heartbeat_interval": 0}
    runtime.refresh_topics()
    rebalance = body.rebalance_timeout
    names = body.subscribed_topic_names
    req = HeartbeatRequest(
        group_id=body.group_id, member_id=body.member_id, member_epoch=body.member_epoch,
        instance_id=body.instance_id, rack_id=body.rack_id,
        rebalance_timeout_ms=to_ms(rebalance) if rebalance is not None else NOT_SET,
        subscribed_topic_names=None if names is None else tuple(names),
        subscribed_topic_regex=getattr(body, "subscribed_topic_regex", None),
        server_assignor=body.server_assignor, owned=_owned(body),
        client_id=ctx.client_id or "", client_host=ctx.client_host,
        api_version=ctx.api_version)
    result = await runtime.persist(runtime.coordinator.consumer_group_heartbeat(
        req, ctx.now_ms()))
    return _heartbeat_response(result)


def _described(ctx: RequestContext, group: DescribedConsumerGroup) -> dict:
    topics = ctx.groups.coordinator.topics_image.by_id()

    def assignment(tps) -> dict:
        return {"topic_partitions": [
            {"topic_id": t["topic_id"], "partitions": t["partitions"],
             "topic_name": topics[t["topic_id"]].name if t["topic_id"] in topics else ""}
            for t in _by_topic(tps)]}

    return {
        "error_code": group.error, "error_message": group.message, "group_id": group.group_id,
        "group_state": group.state, "group_epoch": group.group_epoch,
        "assignment_epoch": group.assignment_epoch, "assignor_name": group.assignor,
        "authorized_operations": AUTHORIZED_OPERATIONS_OMITTED,
        "members": [{
            "member_id": m.member_id, "instance_id": m.instance_id, "rack_id": m.rack_id,
            "member_epoch": m.member_epoch, "client_id": m.client_id,
            "client_host": m.client_host, "subscribed_topic_names": list(m.subscribed_topic_names),
            "subscribed_topic_regex": m.subscribed_topic_regex,
            "assignment": assignment(m.assignment), "target_assignment": assignment(m.target),
            "member_type": MEMBER_TYPE_CONSUMER} for m in group.members]}


@handles(ApiKey.CONSUMER_GROUP_DESCRIBE)
async def consumer_group_describe(ctx: RequestContext, body) -> dict:
    runtime = ctx.groups
    runtime.refresh_topics()
    groups = []
    for group_id in body.group_ids:
        error = (route_group(ctx, group_id, Operation.DESCRIBE) if group_id
                 else ErrorCode.invalid_group_id)
        if error is not None:
            described = DescribedConsumerGroup(group_id, error)
        else:
            (described,) = runtime.coordinator.consumer_group_describe([group_id])
        groups.append(_described(ctx, described))
    return {"throttle_time": 0, "groups": groups}
