"""Committed offsets: OffsetCommit, TxnOffsetCommit, OffsetFetch, OffsetDelete, expiry.

Theory of operation
-------------------
Offsets change only by replaying __consumer_offsets records (`OffsetStore.replay_commit`,
`OffsetStore.replay_marker`): a handler validates the request and prepares one record per
partition; the broker appends them; their replay - now, or when the partition is loaded
after a restart - updates the store. OffsetFetch reads only replayed state, so a client
never sees a commit that is not durable.

A record appended by a transactional producer (TxnOffsetCommit, KIP-447) is *pending*:
kept per producer id, invisible to OffsetFetch, and reported as UNSTABLE_OFFSET_COMMIT to
a fetch with `require_stable`. The producer's COMMIT marker in this partition makes them
committed, its ABORT marker drops them (`replay_marker`, Kafka's
replayEndTransactionMarker).

Every stored offset remembers the position (`record_offset`) of the record it came from.
When a transaction commits, its offset is only materialized if its record is newer than
the committed one - Kafka's rule, which keeps the outcome the same whatever compaction
removed - and a plain commit or tombstone only replaces an older record, so replay is
insensitive to the order in which the broker hands durable appends back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from onceflow.groups.api import (
    FetchedPartition,
    FetchedTopic,
    OffsetCommitResult,
    OffsetDeleteResult,
    OffsetFetchResult,
    PartitionError,
    TopicCommitLike,
    TopicDeleteLike,
    TopicErrors,
    TopicPartitionsLike,
    commit_errors,
    offset_append_error,
)
from onceflow.groups.context import Ctx
from onceflow.groups.group import CONSUMER_PROTOCOL_TYPE, Group
from onceflow.groups.rebalance import schedule_heartbeat
from onceflow.groups.records import (
    OffsetCommitKey,
    OffsetCommitValue,
    Record,
    offset_commit_record,
)
from onceflow.groups.state import GroupState

S = GroupState
TopicPartition = tuple[str, int]
NO_OFFSET = -1  # Kafka's OffsetFetchResponse.INVALID_OFFSET
NO_METADATA = ""
DEFAULT_RETENTION_TIME = -1  # OffsetCommit v2-v4 retention_time_ms: "use the broker's"
# OffsetCommit v9+ answers GROUP_ID_NOT_FOUND for an unknown group (older: ILLEGAL_GENERATION)
OFFSET_COMMIT_GROUP_ID_NOT_FOUND_MIN_VERSION = 9


@dataclass(frozen=True, slots=True)
class OffsetAndMetadata:
    committed_offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp_ms: int
    expire_timestamp_ms: int  # -1 unless an old client asked for a retention time
    record_offset: int  # where its record sits in __consumer_offsets


@dataclass(frozen=True, slots=True)
class CommitOffsets:
    """Append intent of (Txn)OffsetCommit: the response to rewrite if the append fails."""

    response: OffsetCommitResult


@dataclass(frozen=True, slots=True)
class DeleteOffsets:
    response: OffsetDeleteResult


class OffsetStore:
    """Committed and pending offsets of the groups of one __consumer_offsets partition."""

    def __init__(self) -> None:
        self.committed: dict[str, dict[TopicPartition, OffsetAndMetadata]] = {}
        # producer id -> group -> partition -> offset, until the producer's marker
        self.pending: dict[int, dict[str, dict[TopicPartition, OffsetAndMetadata]]] = {}
        self.open_txns_by_group: dict[str, set[int]] = {}

    def replay_commit(self, record_offset: int, producer_id: int, key: OffsetCommitKey,
                      value: OffsetCommitValue | None) -> None:
        tp = (key.topic, key.partition)
        if value is None:
            offsets = self.committed.get(key.group, {})
            current = offsets.get(tp)
            if current is not None and current.record_offset < record_offset:
                del offsets[tp]
                if not offsets:
                    del self.committed[key.group]
            for pid in self.open_txns_by_group.get(key.group, ()):
                self.pending[pid].get(key.group, {}).pop(tp, None)
            return
        stored = OffsetAndMetadata(value.offset, value.leader_epoch, value.metadata,
                                   value.commit_timestamp_ms, value.expire_timestamp_ms,
                                   record_offset)
        if producer_id < 0:
            self._put_if_newer(key.group, tp, stored)
        else:
            self.pending.setdefault(producer_id, {}).setdefault(key.group, {})[tp] = stored
            self.open_txns_by_group.setdefault(key.group, set()).add(producer_id)

    def replay_marker(self, producer_id: int, commit: bool) -> list[str]:
        """Settle the producer's pending offsets; returns the groups it touched."""
        by_group = self.pending.pop(producer_id, None)
        if by_group is None:
            return []  # nothing of this transaction in this partition
        for group_id, offsets in by_group.items():
            txns = self.open_txns_by_group.get(group_id)
            if txns is not None:
                txns.discard(producer_id)
                if not txns:
                    del self.open_txns_by_group[group_id]
            if commit:
                for tp, stored in offsets.items():
                    self._put_if_newer(group_id, tp, stored)
        return list(by_group)

    def _put_if_newer(self, group_id: str, tp: TopicPartition, stored: OffsetAndMetadata) -> None:
        current = self.get(group_id, tp)
        if current is None or current.record_offset < stored.record_offset:
            self.committed.setdefault(group_id, {})[tp] = stored

    def get(self, group_id: str, tp: TopicPartition) -> OffsetAndMetadata | None:
        return self.committed.get(group_id, {}).get(tp)

    def group_offsets(self, group_id: str) -> dict[TopicPartition, OffsetAndMetadata]:
        return self.committed.get(group_id, {})

    def has_pending(self, group_id: str, tp: TopicPartition) -> bool:
        return any(tp in self.pending[pid].get(group_id, {})
                   for pid in self.open_txns_by_group.get(group_id, ()))

    def pending_partitions(self, group_id: str) -> set[TopicPartition]:
        return {tp for pid in self.open_txns_by_group.get(group_id, ())
                for tp in self.pending[pid].get(group_id, {})}


# ---------------------------------------------------------------- commits


def validate_commit(group: Group, generation_id: int, member_id: str,
                    instance_id: str | None, transactional: bool) -> ErrorCode | None:
    """Kafka's ClassicGroup.validateOffsetCommit."""
    if group.is_(S.DEAD):
        return ErrorCode.coordinator_not_available
    if generation_id < 0 and group.is_(S.EMPTY):
        return None  # a standalone consumer or the admin client: allowed while Empty
    if generation_id >= 0 or member_id or instance_id is not None:
        error = group.validate_member(member_id, instance_id)
        if error is not None:
            return error
        if generation_id != group.generation_id:
            return ErrorCode.illegal_generation
    elif not transactional and not group.is_(S.EMPTY):
        return ErrorCode.unknown_member_id  # no member id: only while nobody is a member
    if not transactional and group.is_(S.COMPLETING_REBALANCE):
        return ErrorCode.rebalance_in_progress  # let the member finish its SyncGroup
    return None


def prepare_commit(ctx: Ctx, group_id: str, partition: int, topics: Sequence[TopicCommitLike],
                   expire_timestamp_ms: int, producer_id: int,
                   producer_epoch: int) -> OffsetCommitResult:
    """One record per valid partition; OFFSET_METADATA_TOO_LARGE for the others."""
    records: list[Record] = []
    answered = []
    for topic in topics:
        errors = []
        for p in topic.partitions:
            metadata = p.committed_metadata if p.committed_metadata is not None else NO_METADATA
            if len(metadata) > ctx.config.offset_metadata_max_bytes:
                errors.append(PartitionError(p.partition_index,
                                             ErrorCode.offset_metadata_too_large))
                continue
            value = OffsetCommitValue(p.committed_offset, p.committed_leader_epoch, metadata,
                                      ctx.now_ms, expire_timestamp_ms)
            records.append(offset_commit_record(group_id, topic.name, p.partition_index, value))
            errors.append(PartitionError(p.partition_index, ErrorCode.none))
        answered.append(TopicErrors(topic.name, tuple(errors)))
    response = OffsetCommitResult(tuple(answered))
    ctx.append(partition, records, CommitOffsets(response), producer_id, producer_epoch)
    return response


def offset_commit(ctx: Ctx, group: Group | None, group_id: str, partition: int,
                  generation_id: int, member_id: str, instance_id: str | None,
                  topics: Sequence[TopicCommitLike], retention_time_ms: int,
                  api_version: int) -> OffsetCommitResult:
    if group is None:
        if generation_id >= 0:  # a member of a group we do not know: stale or moved
            error = (ErrorCode.group_id_not_found
                     if api_version >= OFFSET_COMMIT_GROUP_ID_NOT_FOUND_MIN_VERSION
                     else ErrorCode.illegal_generation)
            return commit_errors(topics, error)
        # else: a simple group; replaying the first commit creates it
    else:
        error = validate_commit(group, generation_id, member_id, instance_id, transactional=False)
        if error is not None:
            return commit_errors(topics, error)
        member = group.members.get(member_id)
        if member is not None and group.is_(S.STABLE, S.PREPARING_REBALANCE):
            schedule_heartbeat(ctx, group, member)  # a commit keeps the session alive
    expire_ms = (ctx.now_ms + retention_time_ms
                 if retention_time_ms != DEFAULT_RETENTION_TIME else -1)
    return prepare_commit(ctx, group_id, partition, topics, expire_ms, -1, -1)


def txn_offset_commit(ctx: Ctx, group: Group | None, group_id: str, partition: int,
                      producer_id: int, producer_epoch: int, generation_id: int,
                      member_id: str, instance_id: str | None,
                      topics: Sequence[TopicCommitLike]) -> OffsetCommitResult:
    """KIP-447: a zombie whose partitions moved on is fenced by its stale generation."""
    assert producer_id >= 0, "TxnOffsetCommit needs a producer id"
    if group is None:
        if generation_id >= 0:
            return commit_errors(topics, ErrorCode.illegal_generation)
    else:
        error = validate_commit(group, generation_id, member_id, instance_id, transactional=True)
        if error is not None:
            return commit_errors(topics, error)
    return prepare_commit(ctx, group_id, partition, topics, -1, producer_id, producer_epoch)


def commit_failed(response: OffsetCommitResult, error: ErrorCode) -> OffsetCommitResult:
    """The append failed: every partition that was going to succeed gets the error."""
    error = offset_append_error(error)
    return OffsetCommitResult(tuple(
        TopicErrors(t.name, tuple(
            PartitionError(p.partition_index, error if p.error is ErrorCode.none else p.error)
            for p in t.partitions))
        for t in response.topics))


# ---------------------------------------------------------------- fetch


def offset_fetch(store: OffsetStore, group: Group | None, group_id: str,
                 topics: Sequence[TopicPartitionsLike] | None,
                 require_stable: bool) -> OffsetFetchResult:
    """Offsets are answered whatever the group's state (it may only use Kafka for storage);
    `topics` None means every partition with a committed offset."""
    known = group is None or not group.is_(S.DEAD)  # offsets may exist without a group
    if topics is None:
        offsets = store.group_offsets(group_id) if known else {}
        by_topic: dict[str, list[int]] = {}
        for topic, partition_index in offsets:
            by_topic.setdefault(topic, []).append(partition_index)
        wanted = [(t, sorted(ps)) for t, ps in by_topic.items()]
    else:
        wanted = [(t.name, list(t.partition_indexes)) for t in topics]
    fetched = tuple(
        FetchedTopic(name, tuple(_fetch_one(store, group_id, (name, p), require_stable, known)
                                 for p in partitions))
        for name, partitions in wanted)
    return OffsetFetchResult(group_id, ErrorCode.none, fetched)


def _fetch_one(store: OffsetStore, group_id: str, tp: TopicPartition, require_stable: bool,
               known: bool) -> FetchedPartition:
    if known and require_stable and store.has_pending(group_id, tp):
        return FetchedPartition(tp[1], NO_OFFSET, -1, NO_METADATA, ErrorCode.unstable_offset_commit)
    stored = store.get(group_id, tp) if known else None
    if stored is None:
        return FetchedPartition(tp[1], NO_OFFSET, -1, NO_METADATA)
    return FetchedPartition(tp[1], stored.committed_offset, stored.leader_epoch, stored.metadata)


# ---------------------------------------------------------------- delete


def offset_delete(ctx: Ctx, store: OffsetStore, group: Group | None, group_id: str,
                  topics: Sequence[TopicDeleteLike]) -> OffsetDeleteResult:
    """Kafka: only offsets the group does not consume may go (ClassicGroup.validateOffsetDelete)."""
    if group is None or group.is_(S.DEAD):
        return OffsetDeleteResult(ErrorCode.group_id_not_found)
    if not group.is_(S.EMPTY) and group.protocol_type != CONSUMER_PROTOCOL_TYPE:
        return OffsetDeleteResult(ErrorCode.non_empty_group)
    records: list[Record] = []
    answered = []
    for topic in topics:
        subscribed = group.is_subscribed_to_topic(topic.name)
        errors = []
        for p in topic.partitions:
            tp = (topic.name, p.partition_index)
            if subscribed:
                errors.append(PartitionError(p.partition_index,
                                             ErrorCode.group_subscribed_to_topic))
                continue
            if store.get(group_id, tp) is not None or store.has_pending(group_id, tp):
                records.append(offset_commit_record(group_id, tp[0], tp[1], None))
            errors.append(PartitionError(p.partition_index, ErrorCode.none))
        answered.append(TopicErrors(topic.name, tuple(errors)))
    response = OffsetDeleteResult(ErrorCode.none, tuple(answered))
    ctx.append(group.partition, records, DeleteOffsets(response))
    return response


def delete_failed(response: OffsetDeleteResult, error: ErrorCode) -> OffsetDeleteResult:
    return OffsetDeleteResult(offset_append_error(error))


def all_offset_tombstones(store: OffsetStore, group_id: str) -> list[Record]:
    """Tombstones for every committed or pending offset of a group (DeleteGroups)."""
    partitions = set(store.group_offsets(group_id)) | store.pending_partitions(group_id)
    return [offset_commit_record(group_id, t, p, None) for t, p in sorted(partitions)]


# ---------------------------------------------------------------- expiry


def _expiry_base(group: Group) -> Callable[[OffsetAndMetadata], int] | None:
    """Kafka's offsetExpirationCondition: from when an offset's retention counts, or None."""
    if group.protocol_type is None:  # a simple group: from its last commit
        return lambda o: o.commit_timestamp_ms
    if group.is_(S.EMPTY):  # nobody consumes: from when the group became empty
        return lambda o: group.state_timestamp_ms
    if group.protocol_type == CONSUMER_PROTOCOL_TYPE and group.subscribed_topics is not None \
            and group.is_(S.STABLE):  # topics no member subscribes to: from the last commit
        return lambda o: o.commit_timestamp_ms
    return None


def expire_offsets(ctx: Ctx, store: OffsetStore, group: Group) -> tuple[list[Record], bool]:
    """Tombstones for expired offsets, and whether none are left (Kafka: cleanupExpiredOffsets)."""
    offsets = store.group_offsets(group.group_id)
    if not offsets:
        return [], group.group_id not in store.open_txns_by_group
    base = _expiry_base(group)
    if base is None:
        return [], False
    retention_ms = ctx.config.offsets_retention_ms
    records: list[Record] = []
    all_expired = True
    for tp, stored in sorted(offsets.items()):
        if group.is_subscribed_to_topic(tp[0]) or store.has_pending(group.group_id, tp):
            all_expired = False
        elif (ctx.now_ms >= stored.expire_timestamp_ms if stored.expire_timestamp_ms >= 0
              else ctx.now_ms - base(stored) >= retention_ms):
            records.append(offset_commit_record(group.group_id, tp[0], tp[1], None))
        else:
            all_expired = False
    return records, all_expired and group.group_id not in store.open_txns_by_group
