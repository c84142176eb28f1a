"""ListOffsets: earliest, latest, max timestamp, or the first offset at a timestamp.

"Latest" is the high watermark, or the last stable offset under read_committed.
Each special timestamp needs a request version that knows it, else that partition
answers UNSUPPORTED_VERSION, as Kafka does: LATEST/EARLIEST v1+, MAX_TIMESTAMP (-3) v7+,
EARLIEST_LOCAL (-4) v8+ (the log start offset: every segment is local), LATEST_TIERED
(-5) v9+ (offset -1 and leader epoch -1: nothing is tiered, as Kafka answers without
remote storage); other negative timestamps are UNSUPPORTED_VERSION too. v10 only adds
a timeout for remote lookups, which never wait here.
A topic the principal may not Describe is TOPIC_AUTHORIZATION_FAILED (issue 13).
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from onceflow.broker.handlers import ApiKey, RequestContext, handles
from onceflow.broker.handlers.fetch import READ_COMMITTED
from onceflow.security.acl import Operation, ResourceType

# Special timestamps of ListOffsets (Kafka's ListOffsetsRequest).
LATEST, EARLIEST, MAX_TIMESTAMP, EARLIEST_LOCAL, LATEST_TIERED = -1, -2, -3, -4, -5
# The first request version that knows each special timestamp.
SPECIAL_SINCE = {LATEST: 1, EARLIEST: 1, MAX_TIMESTAMP: 7, EARLIEST_LOCAL: 8, LATEST_TIERED: 9}


def _one(ctx: RequestContext, topic: str, p, isolation: int) -> dict:
    state = ctx.broker
    result = {"partition_index": p.partition_index, "error_code": ErrorCode.none,
              "timestamp": -1, "offset": -1, "leader_epoch": state.cluster.leader_epoch}
    if not ctx.authorized(Operation.DESCRIBE, ResourceType.TOPIC, topic):
        return {**result, "error_code": ErrorCode.topic_authorization_failed}
    if p.timestamp < 0 and ctx.api_version < SPECIAL_SINCE.get(p.timestamp, 2**15):
        return {**result, "error_code": ErrorCode.unsupported_version}   # before existence
    info = state.topic(topic)
    if info is not None and not state.ready(topic, p.partition_index):  # still recovering
        return {**result, "error_code": ErrorCode.not_leader_or_follower}
    partition = state.partition(topic, p.partition_index) if info else None
    if partition is None:
        return {**result, "error_code": ErrorCode.unknown_topic_or_partition}
    if state.leader(info, p.partition_index) != ctx.node_id:
        return {**result, "error_code": ErrorCode.not_leader_or_follower}
    if p.timestamp == LATEST_TIERED:
        return {**result, "leader_epoch": -1}
    log = partition.log
    if p.timestamp == LATEST:
        offset = partition.last_stable_offset if isolation == READ_COMMITTED else partition.high_watermark
        return {**result, "offset": offset}
    if p.timestamp in (EARLIEST, EARLIEST_LOCAL):
        return {**result, "offset": log.log_start_offset}
    if p.timestamp == MAX_TIMESTAMP:
        found = log.max_timestamp()
        if found is None:
            return result
        ts, offset = found
        return {**result, "timestamp": ts, "offset": offset}
    found = log.offset_for_timestamp(p.timestamp)
    if found is None:
        return result   # no record at or after that timestamp: offset -1, as Kafka
    offset, ts = found
    return {**result, "offset": offset, "timestamp": ts}


@handles(ApiKey.LIST_OFFSETS)
async def list_offsets(ctx: RequestContext, body) -> dict:
    isolation = getattr(body, "isolation_level", 0)
    topics = [
        {"name": t.name, "partitions": [_one(ctx, t.name, p, isolation) for p in t.partitions]}
        for t in body.topics
    ]
    return {"throttle_time": 0, "topics": topics}
