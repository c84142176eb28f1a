"""DescribeTopicPartitions (KIP-966): Metadata's topic view, paged by partitions.

Topics (all of them when none is named) are answered in name order from the request's cursor
on, at most `response_partition_limit` partitions in all (capped at Kafka's
max.request.partition.size.limit, 2000, and at least 1); when the limit cuts a topic short or
falls at a topic boundary with more to come, `next_cursor` names where to go on. Named topics
that do not exist come back with UNKNOWN_TOPIC_OR_PARTITION (INVALID_TOPIC_EXCEPTION for a bad
name), those the principal may not describe with TOPIC_AUTHORIZATION_FAILED; when listing all
topics both are left out. `topic_authorized_operations` holds the operations the principal may
perform on each topic. A cursor naming a topic that is not requested, or a negative partition,
is INVALID_REQUEST for every named topic, as Kafka's error response does.
"""

from __future__ import annotations

import uuid

from kio.schema.errors import ErrorCode

from onceflow.broker.handlers import ApiKey, RequestContext, handles
from onceflow.broker.handlers.operations import OMITTED, authorized_operations
from onceflow.broker.state import INTERNAL_TOPICS, replication_factor, topic_name_error
from onceflow.security.acl import Operation, ResourceType
from onceflow.storage.store import TopicInfo

PARTITION_LIMIT_MAX = 2000  # Kafka's max.request.partition.size.limit default
ZERO_UUID = uuid.UUID(int=0)


def _partition(ctx: RequestContext, info: TopicInfo, index: int) -> dict:
    cluster = ctx.broker.cluster
    replicas = cluster.replicas(info.name, index, replication_factor(info))
    live = [r for r in replicas if cluster.nodes[r].up]
    leader = ctx.broker.leader(info, index)
    return {"error_code": ErrorCode.none, "partition_index": index, "leader_id": leader,
            "leader_epoch": cluster.leader_epoch, "replica_nodes": replicas,
            "isr_nodes": live or [leader], "eligible_leader_replicas": [],
            "last_known_elr": [], "offline_replicas": [r for r in replicas if r not in live]}


def _failed(name: str, code: ErrorCode) -> dict:
    return {"error_code": code, "name": name, "topic_id": ZERO_UUID,
            "is_internal": name in INTERNAL_TOPICS, "partitions": [],
            "topic_authorized_operations": OMITTED}


@handles(ApiKey.DESCRIBE_TOPIC_PARTITIONS)
async def describe_topic_partitions(ctx: RequestContext, body) -> dict:
    state = ctx.broker
    all_topics = not body.topics
    cursor = body.cursor
    start_name = cursor.topic_name if cursor is not None else ""
    if all_topics:
        names = sorted(n for n in state.topics() if n >= start_name)
    else:
        names = sorted({t.name for t in body.topics if t.name >= start_name})
    if cursor is not None and ((not all_topics and cursor.topic_name not in names)
                               or cursor.partition_index < 0):
        return {"throttle_time": 0, "next_cursor": None,
                "topics": [_failed(t.name, ErrorCode.invalid_request) for t in body.topics]}
    remaining = max(min(PARTITION_LIMIT_MAX, body.response_partition_limit), 1)
    topics, denied, next_cursor = [], [], None
    for name in names:
        if not ctx.authorized(Operation.DESCRIBE, ResourceType.TOPIC, name):
            if not all_topics:
                denied.append(_failed(name, ErrorCode.topic_authorization_failed))
            continue
        if remaining == 0:
            next_cursor = {"topic_name": name, "partition_index": 0}
            break
        info = state.topic(name)
        if info is None:
            if not all_topics:
                code = (ErrorCode.invalid_topic_exception if topic_name_error(name)
                        else ErrorCode.unknown_topic_or_partition)
                topics.append(_failed(name, code))
            continue
        first = cursor.partition_index if cursor is not None and name == start_name else 0
        indexes = list(range(first, info.num_partitions))
        taken = indexes[:remaining]
        topics.append({"error_code": ErrorCode.none, "name": name, "topic_id": info.topic_id,
                       "is_internal": name in INTERNAL_TOPICS,
                       "partitions": [_partition(ctx, info, i) for i in taken],
                       "topic_authorized_operations": authorized_operations(
                           ctx, ResourceType.TOPIC, name)})
        if len(indexes) > len(taken):
            next_cursor = {"topic_name": name, "partition_index": indexes[len(taken)]}
            break
        remaining -= len(taken)
    return {"throttle_time": 0, "topics": topics + denied, "next_cursor": next_cursor}
