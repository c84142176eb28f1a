"""AlterPartitionReassignments and ListPartitionReassignments.

A reassignment names a partition's new replicas, preferred leader first. Storage is shared by
every node of the cluster view (broker/cluster.py), so there is nothing to copy: the cluster
view takes the new replicas and leader at once and the reassignment is complete when the
answer leaves; ListPartitionReassignments therefore never lists an ongoing one, and cancelling
(null replicas) answers NO_REASSIGNMENT_IN_PROGRESS, as Kafka does when none is ongoing.
Validation and errors follow Kafka's controller.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from onceflow.broker.handlers import ApiKey, RequestContext, handles
from onceflow.security.acl import Operation


def _reassign(ctx: RequestContext, topic: str, p) -> dict:
    result = {"partition_index": p.partition_index, "error_code": ErrorCode.none,
              "error_message": None}
    info = ctx.broker.topic(topic)
    if info is None or not 0 <= p.partition_index < info.num_partitions:
        return {**result, "error_code": ErrorCode.unknown_topic_or_partition,
                "error_message": "Unable to find partition "
                                 f"{topic}:{p.partition_index}."}
    if p.replicas is None:
        return {**result, "error_code": ErrorCode.no_reassignment_in_progress,
                "error_message": "No partition reassignment is in progress."}
    problem = ctx.broker.cluster.assignment_error(list(p.replicas))
    if problem is not None:
        return {**result, "error_code": ErrorCode.invalid_replica_assignment,
                "error_message": problem}
    ctx.broker.cluster.assign(topic, p.partition_index, [int(r) for r in p.replicas])
    return result


@handles(ApiKey.ALTER_PARTITION_REASSIGNMENTS)
async def alter_partition_reassignments(ctx: RequestContext, body) -> dict:
    response = {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None,
                "responses": []}
    if not ctx.authorized_cluster(Operation.ALTER):
        return {**response, "error_code": ErrorCode.cluster_authorization_failed,
                "error_message": "Cluster authorization failed."}
    responses = [{"name": t.name, "partitions": [_reassign(ctx, t.name, p) for p in t.partitions]}
                 for t in body.topics]
    return {**response, "responses": responses}


@handles(ApiKey.LIST_PARTITION_REASSIGNMENTS)
async def list_partition_reassignments(ctx: RequestContext, body) -> dict:
    response = {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None,
                "topics": []}
    if not ctx.authorized_cluster(Operation.DESCRIBE):
        return {**response, "error_code": ErrorCode.cluster_authorization_failed,
                "error_message": "Cluster authorization failed."}
    return response  # reassignments complete at once: none is ever ongoing
