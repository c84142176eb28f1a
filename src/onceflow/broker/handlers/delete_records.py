"""DeleteRecords: advance a partition's log start offset (-1 = to the high watermark)."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from onceflow.broker.handlers import ApiKey, RequestContext, handles
from onceflow.security.acl import Operation, ResourceType

HIGH_WATERMARK = -1


def _one(ctx: RequestContext, topic: str, p) -> dict:
    state = ctx.broker
    result = {"partition_index": p.partition_index, "low_watermark": -1, "error_code": ErrorCode.none}
    if not ctx.authorized(Operation.DELETE, ResourceType.TOPIC, topic):
        return {**result, "error_code": ErrorCode.topic_authorization_failed}
    info = state.topic(topic)
    partition = state.partition(topic, p.partition_index) if info else None
    if partition is None:
        return {**result, "error_code": ErrorCode.unknown_topic_or_partition}
    if state.leader(info, p.partition_index) != ctx.node_id:
        return {**result, "error_code": ErrorCode.not_leader_or_follower}
    offset = partition.high_watermark if p.offset == HIGH_WATERMARK else p.offset
    if not 0 <= offset <= partition.high_watermark:
        return {**result, "error_code": ErrorCode.offset_out_of_range}
    return {**result, "low_watermark": partition.log.delete_records_before(offset)}


@handles(ApiKey.DELETE_RECORDS)
async def delete_records(ctx: RequestContext, body) -> dict:
    topics = [
        {"name": t.name, "partitions": [_one(ctx, t.name, p) for p in t.partitions]}
        for t in body.topics
    ]
    return {"throttle_time": 0, "topics": topics}
