"""OffsetCommit, OffsetFetch, OffsetDelete: committed offsets of consumer groups.

The handlers translate each request version onto the coordinator's version-independent
calls (onceflow.groups.offsets holds the rules) and back:

- OffsetCommit v2-v4 carry a retention time (-1: the broker's), v6+ a leader epoch per
  partition, v7+ the group.instance.id; v10 names topics by id (unknown ids answer
  UNKNOWN_TOPIC_ID). As in Kafka, partitions of topics that do not exist get
  UNKNOWN_TOPIC_OR_PARTITION and are not stored; the rest are committed.
- OffsetFetch v1-v7 ask for one group (topics null from v2 = every committed partition,
  `require_stable` from v7); v8+ ask for several groups (one coordinator call per group);
  v10 names topics by id. Errors of the group go to the top level from v2, to every
  partition in v1.
- OffsetDelete v0.
- TxnOffsetCommit v0-4 (issue 5): offsets committed inside a transaction, pending until its
  marker. v3+ carry the consumer's generation, member id and instance id, validated like
  OffsetCommit's so a zombie whose partitions moved on is fenced (KIP-447), whatever its
  transactional id. First, as Kafka does (KIP-890 part 1), the transaction coordinator
  confirms that AddOffsetsToTxn added the group's partition to the producer's open
  transaction, unless that partition already holds it (v5, transactions V2: the broker
  adds the partition itself, there was no AddOffsetsToTxn); the records are then one
  transactional batch of the producer, so its producer state fences an old epoch too.

Every committed offset is durable (fsync'd and replayed) before the answer leaves.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from onceflow.broker.handlers import ApiKey, RequestContext, handles, route_group
from onceflow.security.acl import Operation, ResourceType
from onceflow.groups import (
    FetchedPartition,
    FetchedTopic,
    OffsetCommitResult,
    OffsetFetchResult,
    PartitionCommit,
    TopicCommit,
    TopicPartitions,
)
from onceflow.groups.offsets import DEFAULT_RETENTION_TIME
from onceflow.protocol.codec import to_ms
from onceflow.txn import TopicPartition

TOPIC_IDS_MIN_VERSION = 10  # OffsetCommit and OffsetFetch v10 name topics by id
TXN_OFFSET_ABORTABLE_MIN_VERSION = 4  # TxnOffsetCommit v4 knows TRANSACTION_ABORTABLE
TXN_OFFSET_ADD_PARTITION_MIN_VERSION = 5  # v5: the broker adds the offsets partition
PER_PARTITION_FETCH_ERROR_MAX_VERSION = 1  # OffsetFetch v1 has no top-level error
GROUPS_BATCH_MIN_VERSION = 8  # OffsetFetch v8+: several groups per request
NO_OFFSET = -1


@dataclass(frozen=True, slots=True)
class _Topic:
    """A requested topic: its name (None for an unknown id) and its id (v10)."""

    name: str | None
    topic_id: uuid.UUID | None


def _resolve(ctx: RequestContext, topic) -> _Topic:
    """Name and id of a request topic, whichever the version carries."""
    if ctx.api_version >= TOPIC_IDS_MIN_VERSION:
        info = ctx.broker.topic_by_id(topic.topic_id)
        return _Topic(info.name if info else None, topic.topic_id)
    info = ctx.broker.topic(topic.name)
    return _Topic(topic.name, info.topic_id if info else None)


def _topic_key(ctx: RequestContext, topic: _Topic) -> dict:
    if ctx.api_version >= TOPIC_IDS_MIN_VERSION:
        return {"topic_id": topic.topic_id}
    return {"name": topic.name}


# ---------------------------------------------------------------- OffsetCommit


def _partition_exists(ctx: RequestContext, name: str | None, index: int) -> bool:
    info = ctx.broker.topic(name) if name is not None else None
    return info is not None and 0 <= index < info.num_partitions


def _unknown_error(ctx: RequestContext) -> ErrorCode:
    return (ErrorCode.unknown_topic_id if ctx.api_version >= TOPIC_IDS_MIN_VERSION
            else ErrorCode.unknown_topic_or_partition)


# Group-level refusals that every requested partition carries, known topic or not.
_GROUP_LEVEL_AUTH_ERRORS = (ErrorCode.group_authorization_failed,
                            ErrorCode.transactional_id_authorization_failed)


def _topic_readable(ctx: RequestContext, name: str | None) -> bool:
    """Offsets of a topic are committed with Read on it (Kafka); unknown ids pass here."""
    return name is None or ctx.authorized(Operation.READ, ResourceType.TOPIC, name)


def _commit_request(ctx: RequestContext, topics: Sequence) -> list[TopicCommit]:
    """The partitions that exist, as the coordinator's TopicCommit values."""
    wanted = []
    for topic in topics:
        resolved = _resolve(ctx, topic)
        partitions = tuple(
            PartitionCommit(p.partition_index, p.committed_offset,
                            getattr(p, "committed_leader_epoch", -1), p.committed_metadata)
            for p in topic.partitions if _partition_exists(ctx, resolved.name, p.partition_index)
            and _topic_readable(ctx, resolved.name))
        if partitions:
            wanted.append(TopicCommit(resolved.name, partitions))
    return wanted


def _commit_response(ctx: RequestContext, topics: Sequence, result: OffsetCommitResult,
                     error: ErrorCode | None) -> dict:
    """One entry per requested partition, in request order: the coordinator's answer, the
    group-level `error`, or the unknown-topic error for partitions it never saw."""
    answered = {(t.name, p.partition_index): p.error for t in result.topics for p in t.partitions}
    out = []
    for topic in topics:
        resolved = _resolve(ctx, topic)
        partitions = []
        for p in topic.partitions:
            code = answered.get((resolved.name, p.partition_index))
            if code is None and error is None and not _topic_readable(ctx, resolved.name):
                code = ErrorCode.topic_authorization_failed
            if code is None and error in _GROUP_LEVEL_AUTH_ERRORS:
                code = error
            if code is None:
                code = (error if error is not None and
                        _partition_exists(ctx, resolved.name, p.partition_index)
                        else _unknown_error(ctx))
            partitions.append({"partition_index": p.partition_index, "error_code": code})
        out.append({**_topic_key(ctx, resolved), "partitions": partitions})
    return {"throttle_time": 0, "topics": out}


@handles(ApiKey.OFFSET_COMMIT)
async def offset_commit(ctx: RequestContext, body) -> dict:
    runtime = ctx.groups
    error = route_group(ctx, body.group_id, Operation.READ)
    if error is not None:
        return _commit_response(ctx, body.topics, OffsetCommitResult(()), error)
    wanted = _commit_request(ctx, body.topics)
    result = OffsetCommitResult(())
    if wanted:
        retention = getattr(body, "retention_time", None)
        result = await runtime.persist(runtime.coordinator.offset_commit(
            group_id=body.group_id, generation_id=body.generation_id_or_member_epoch,
            member_id=body.member_id, group_instance_id=getattr(body, "group_instance_id", None),
            topics=wanted,
            retention_time_ms=DEFAULT_RETENTION_TIME if retention is None else to_ms(retention),
            api_version=ctx.api_version, now_ms=ctx.now_ms()))
    return _commit_response(ctx, body.topics, result, None)


# ---------------------------------------------------------------- TxnOffsetCommit


async def _verify_txn_offsets(ctx: RequestContext, body) -> ErrorCode | None:
    """KIP-890 part 1: is the group's offsets partition in the producer's transaction?
    Part 2 (v5+): the broker adds it itself (the client sent no AddOffsetsToTxn)."""
    runtime = ctx.groups
    index = runtime.coordinator.partition_for(body.group_id)
    partition = ctx.broker.partition(runtime.topic_name, index)
    if partition is None or partition.producers.has_ongoing_transaction(body.producer_id,
                                                                          body.producer_epoch):
        return None  # no such partition: the coordinator answers; or verified before
    if ctx.api_version >= TXN_OFFSET_ADD_PARTITION_MIN_VERSION:
        error = await ctx.txns.add_implicitly(
            body.transactional_id, body.producer_id, body.producer_epoch,
            [TopicPartition(runtime.topic_name, index)])
        return None if error is ErrorCode.none else error
    error = ctx.txns.verify(
        body.transactional_id, body.producer_id, body.producer_epoch,
        TopicPartition(runtime.topic_name, index),
        abortable_ok=ctx.api_version >= TXN_OFFSET_ABORTABLE_MIN_VERSION)
    return None if error is ErrorCode.none else error


@handles(ApiKey.TXN_OFFSET_COMMIT)
async def txn_offset_commit(ctx: RequestContext, body) -> dict:
    runtime = ctx.groups
    error = route_group(ctx, body.group_id, Operation.READ)
    if not ctx.authorized(Operation.WRITE, ResourceType.TRANSACTIONAL_ID, body.transactional_id):
        error = ErrorCode.transactional_id_authorization_failed  # Kafka checks it first
    if error is None:
        error = await _verify_txn_offsets(ctx, body)
    if error is not None:
        return _commit_response(ctx, body.topics, OffsetCommitResult(()), error)
    wanted = _commit_request(ctx, body.topics)
    result = OffsetCommitResult(())
    if wanted:
        result = await runtime.persist(runtime.coordinator.txn_offset_commit(
            group_id=body.group_id, producer_id=body.producer_id,
            producer_epoch=body.producer_epoch,
            generation_id=getattr(body, "generation_id", -1),
            member_id=getattr(body, "member_id", ""),
            group_instance_id=getattr(body, "group_instance_id", None),
            topics=wanted, now_ms=ctx.now_ms()))
    return _commit_response(ctx, body.topics, result, None)


# ---------------------------------------------------------------- OffsetFetch


def _fetched_topics(ctx: RequestContext, result: OffsetFetchResult,
                    per_partition_error: ErrorCode | None = None) -> list[dict]:
    topics = []
    for topic in result.topics:
        if not ctx.authorized(Operation.DESCRIBE, ResourceType.TOPIC, topic.name):
            continue  # as Kafka: offsets of topics the principal may not see are left out
        info = ctx.broker.topic(topic.name)
        if ctx.api_version >= TOPIC_IDS_MIN_VERSION:
            if info is None:
                continue  # a deleted topic's offsets: no id to name it by
            key = {"topic_id": info.topic_id}
        else:
            key = {"name": topic.name}
        topics.append({**key, "partitions": [
            {"partition_index": p.partition_index, "committed_offset": p.committed_offset,
             "committed_leader_epoch": p.committed_leader_epoch, "metadata": p.metadata,
             "error_code": per_partition_error or p.error} for p in topic.partitions]})
    return topics


def _fetch_one(ctx: RequestContext, group_id: str, topics: Sequence | None,
               require_stable: bool, member_id: str | None = None,
               member_epoch: int = -1) -> tuple[OffsetFetchResult, list[dict]]:
    """One group's offsets; unknown topic ids are answered UNKNOWN_TOPIC_ID."""
    runtime = ctx.groups
    wanted, unknown = None, []
    if topics is not None:
        wanted = []
        for topic in topics:
            resolved = _resolve(ctx, topic)
            if resolved.name is None:
                unknown.append({"topic_id": resolved.topic_id, "partitions": [
                    {"partition_index": i, "committed_offset": NO_OFFSET,
                     "committed_leader_epoch": -1, "metadata": "",
                     "error_code": ErrorCode.unknown_topic_id} for i in topic.partition_indexes]})
            else:
                wanted.append(TopicPartitions(resolved.name, tuple(topic.partition_indexes)))
    error = route_group(ctx, group_id, Operation.DESCRIBE)
    if error is not None:
        return OffsetFetchResult(group_id, error, _unanswered(wanted)), unknown
    return runtime.coordinator.offset_fetch(group_id=group_id, topics=wanted,
                                            require_stable=require_stable, member_id=member_id,
                                            member_epoch=member_epoch), unknown


def _unanswered(wanted: list[TopicPartitions] | None) -> tuple[FetchedTopic, ...]:
    """The requested partitions without offsets (to carry a v1 per-partition error)."""
    return tuple(FetchedTopic(t.name, tuple(FetchedPartition(i, NO_OFFSET, -1, "")
                                            for i in t.partition_indexes))
                 for t in wanted or ())


@handles(ApiKey.OFFSET_FETCH)
async def offset_fetch(ctx: RequestContext, body) -> dict:
    require_stable = getattr(body, "require_stable", False)
    if ctx.api_version >= GROUPS_BATCH_MIN_VERSION:
        groups = []
        for group in body.groups:
            result, unknown = _fetch_one(ctx, group.group_id, group.topics, require_stable,
                                         getattr(group, "member_id", None),
                                         getattr(group, "member_epoch", -1))
            topics = [] if result.error is not ErrorCode.none else _fetched_topics(ctx, result)
            groups.append({"group_id": group.group_id, "topics": topics + unknown,
                           "error_code": result.error})
        return {"throttle_time": 0, "groups": groups}
    result, _ = _fetch_one(ctx, body.group_id, body.topics, require_stable)
    if ctx.api_version <= PER_PARTITION_FETCH_ERROR_MAX_VERSION:
        error = result.error if result.error is not ErrorCode.none else None
        return {"topics": _fetched_topics(ctx, result, error)}
    topics = [] if result.error is not ErrorCode.none else _fetched_topics(ctx, result)
    return {"throttle_time": 0, "topics": topics, "error_code": result.error}


# ---------------------------------------------------------------- OffsetDelete


@handles(ApiKey.OFFSET_DELETE)
async def offset_delete(ctx: RequestContext, body) -> dict:
    runtime = ctx.groups
    error = route_group(ctx, body.group_id, Operation.DELETE)
    if error is None:
        result = await runtime.persist(runtime.coordinator.offset_delete(
            group_id=body.group_id, topics=body.topics, now_ms=ctx.now_ms()))
        error, topics = result.error, result.topics
    else:
        topics = ()
    return {"throttle_time": 0, "error_code": error, "topics": [
        {"name": t.name, "partitions": [{"partition_index": p.partition_index,
                                         "error_code": p.error} for p in t.partitions]}
        for t in topics]}
