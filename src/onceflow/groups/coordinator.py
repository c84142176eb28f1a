"""`GroupCoordinator`: the one object per broker that answers the group APIs.

Theory of operation
-------------------
The coordinator owns the groups of the `__consumer_offsets` partitions this broker has
loaded, one `Shard` per partition (groups + offsets). It performs no I/O and reads no
clock: every call takes `now_ms`, and every durable change leaves as an `Append`.

Prepare, persist, apply:

1. A handler (`offset_commit`, `join_group`, ...) validates the request against the
   current state and returns a `Result`: the response, and the records to append.
   JoinGroup and SyncGroup instead take a `respond` callback, called once - maybe at
   once, maybe from a later call.
2. The broker appends each `Append` as one batch to its partition (a transactional batch
   when it carries a producer id) and waits until it is durable.
3. The broker calls `complete(result, outcomes, now_ms)`: each durable append is
   *replayed* - the very code that `load_partition` runs over the partition at startup,
   so recovery is not a second code path - and each failed one is undone as Kafka does.
   `complete` returns the response to send, and perhaps follow-up appends (handled the
   same way, their response ignored).

Time: `tick(now_ms)` fires the deadlines that are due (sessions, join and sync timeouts,
pending member ids, the periodic offsets expiration) and returns the appends they
produce; `next_deadline_ms()` tells when to call it next.

Transactions: a TxnOffsetCommit's records are pending until the producer's marker in the
partition. After writing a COMMIT/ABORT control batch to __consumer_offsets, the broker
calls `complete_txn(producer_id, commit, partitions)`; at load, markers are `TxnMarker`
entries and take the same path.

What membership state is soft (lost on restart, as in Kafka) and what is durable is
described in group.py; the state machine and how each state answers each request in
state.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

from kio.schema.errors import ErrorCode

from onceflow.groups import membership, offsets, rebalance
from onceflow.groups.api import (
    AppendFailed,
    AppendOutcome,
    AssignmentLike,
    DeleteGroupResult,
    DescribedGroup,
    DescribedMember,
    HeartbeatResult,
    JoinRespond,
    LeaveGroupResult,
    ListedGroup,
    ListGroupsResult,
    MemberIdentityLike,
    OffsetCommitResult,
    OffsetDeleteResult,
    OffsetFetchResult,
    ProtocolLike,
    Result,
    SyncGroupResult,
    SyncRespond,
    TopicCommitLike,
    TopicDeleteLike,
    TopicPartitionsLike,
    commit_errors,
    join_error,
    offset_append_error,
)
from onceflow.groups.config import CoordinatorConfig
from onceflow.groups.consumer import records as consumer_records
from onceflow.groups.consumer.coordinator import (
    TIMER_KINDS,
    ConsumerGroups,
    ConsumerWrite,
    key_type,
)
from onceflow.groups.consumer.group import ConsumerGroup
from onceflow.groups.consumer.target import EMPTY_IMAGE, TopicsImage
from onceflow.groups.consumer_apis import ConsumerGroupAPIs
from onceflow.groups.context import OFFSETS_EXPIRATION, Ctx
from onceflow.groups.group import Group, plain_protocols
from onceflow.groups.records import (
    GroupMetadataKey,
    LogEntry,
    LogRecord,
    TxnMarker,
    decode_group_metadata_value,
    decode_key,
    decode_offset_commit_value,
    group_metadata_record,
    partition_for,
)
from onceflow.groups.state import GroupState, parse_state_filter
from onceflow.groups.timers import Timers

R = TypeVar("R")
S = GroupState
CLASSIC_GROUP_TYPE = "classic"
# Kafka accepts an empty group id only for these (backward compatibility); the rest
# need a non-empty id (GroupCoordinator.isValidGroupId)
_EMPTY_GROUP_ID_OK = frozenset({"offset_commit", "offset_fetch", "describe_groups",
                                "delete_groups"})


class Shard:
    """The groups and offsets of one __consumer_offsets partition."""

    def __init__(self, partition: int) -> None:
        self.partition = partition
        self.groups: dict[str, Group] = {}  # classic groups
        self.consumer_groups: dict[str, ConsumerGroup] = {}  # KIP-848; ids never in both
        self.offsets = offsets.OffsetStore()


@dataclass(frozen=True, slots=True)
class DeleteGroups:
    """Append intent: these groups were marked Dead and their tombstones are being written."""

    group_ids: tuple[str, ...]


class GroupCoordinator(ConsumerGroupAPIs):
    def __init__(self, config: CoordinatorConfig | None = None,
                 new_uuid: Callable[[], str] = lambda: str(uuid.uuid4())) -> None:
        self.config = config or CoordinatorConfig()
        self._new_uuid = new_uuid  # member ids are "<client or instance id>-<uuid>"
        self._timers = Timers()
        self._shards: dict[int, Shard] = {}
        self._loading: set[int] = set()
        self._expiration_scheduled = False
        self.consumers = ConsumerGroups(self.config, new_uuid)
        # the broker's topics as last handed over (`update_topics`): consumer groups
        # subscribe to them and resolve regexes against them
        self.topics_image: TopicsImage = EMPTY_IMAGE

    # ------------------------------------------------------------ partitions

    def partition_for(self, group_id: str) -> int:
        """The __consumer_offsets partition (hence coordinator) of a group (FindCoordinator)."""
        return partition_for(group_id, self.config.offsets_topic_num_partitions)

    def loaded_partitions(self) -> frozenset[int]:
        return frozenset(self._shards)

    def begin_loading(self, partition: int) -> None:
        """Requests for the partition's groups get COORDINATOR_LOAD_IN_PROGRESS meanwhile."""
        self._loading.add(partition)

    def load_partition(self, partition: int, entries: Iterable[LogEntry], now_ms: int) -> None:
        """Become coordinator for `partition`: replay its entries (in offset order)."""
        assert partition not in self._shards, f"partition {partition} is already loaded"
        shard = self._shards[partition] = Shard(partition)
        ctx = self._ctx(now_ms)
        for entry in entries:
            self._replay_entry(ctx, shard, entry, loading=True)
        for group in shard.groups.values():  # Kafka's onGroupLoaded: sessions start now
            for member in group.members.values():
                rebalance.schedule_heartbeat(ctx, group, member)
            if len(group.members) > self.config.group_max_size:
                rebalance.prepare_rebalance(ctx, group)
        self.consumers.on_loaded(ctx, shard)
        self._loading.discard(partition)
        self._schedule_expiration(ctx)

    def unload_partition(self, partition: int, now_ms: int) -> None:
        """Stop coordinating `partition`: its groups die and waiting requests get
        NOT_COORDINATOR (the clients look the new coordinator up)."""
        self._loading.discard(partition)
        shard = self._shards.pop(partition, None)
        if shard is None:
            return
        ctx = self._ctx(now_ms)
        for group in shard.groups.values():
            ctx.cancel_all(group)
            group.transition(S.DEAD, now_ms)
            for member in group.members.values():
                group.answer_join(member, join_error(member.member_id, ErrorCode.not_coordinator))
                group.answer_sync(member, SyncGroupResult(ErrorCode.not_coordinator))

    # ------------------------------------------------------------ replay and effects

    def replay(self, partition: int, entries: Iterable[LogEntry], now_ms: int) -> Result[None]:
        """Apply entries appended to a loaded partition by someone else (e.g. markers)."""
        ctx = self._ctx(now_ms)
        shard = self._shards.get(partition)
        if shard is not None:
            for entry in entries:
                self._replay_entry(ctx, shard, entry, loading=False)
        return Result(None, tuple(ctx.appends))

    def complete_txn(self, producer_id: int, commit: bool,
                     partitions: Iterable[int] | None = None, now_ms: int = 0) -> None:
        """The producer's COMMIT/ABORT marker is durable in these partitions (all loaded
        ones if None): its pending offsets become visible, or are dropped."""
        for partition in (self._shards if partitions is None else partitions):
            shard = self._shards.get(partition)
            if shard is not None:
                self._replay_marker(self._ctx(now_ms), shard, producer_id, commit)

    def complete(self, result: Result[R], outcomes: Sequence[AppendOutcome],
                 now_ms: int) -> Result[R]:
        """Apply the outcomes of `result.appends` (same order); returns the response to
        send and any follow-up appends."""
        assert len(outcomes) == len(result.appends), "one outcome per append"
        ctx = self._ctx(now_ms)
        response = result.response
        for append, outcome in zip(result.appends, outcomes, strict=True):
            shard = self._shards.get(append.partition)
            if isinstance(outcome, AppendFailed):
                response = self._append_failed(ctx, shard, append.intent, outcome.error, response)
            elif isinstance(append.intent, ConsumerWrite):
                pass  # replayed when written (consumer/coordinator.py)
            elif shard is not None:  # else: unloaded meanwhile; its next owner replays the log
                for i, record in enumerate(append.records):
                    entry = LogRecord(outcome.base_offset + i, outcome.timestamp_ms,
                                      append.producer_id, record.key, record.value)
                    self._replay_entry(ctx, shard, entry, loading=False)
        return Result(response, tuple(ctx.appends))

    def tick(self, now_ms: int) -> Result[None]:
        """Fire every deadline due at `now_ms` (deadlines set meanwhile wait for the next tick)."""
        ctx = self._ctx(now_ms)
        for key, seq in self._timers.due(now_ms):
            if not self._timers.claim(key, seq):
                continue  # rescheduled or cancelled by an earlier event of this tick
            if key == OFFSETS_EXPIRATION:
                self._expiration_scheduled = False
                self._expire_offsets(ctx)
                self._schedule_expiration(ctx)
                continue
            kind, group_id, incarnation, _ = key
            if kind in TIMER_KINDS:
                shard = self._shards.get(self.partition_for(group_id))
                if shard is not None:
                    self.consumers.fire_timer(ctx, shard, key, self.topics_image)
                continue
            group = self._group(group_id)
            if group is not None and group.incarnation == incarnation:
                rebalance.fire_timer(ctx, key, group)
        return Result(None, tuple(ctx.appends))

    def next_deadline_ms(self) -> int | None:
        return self._timers.next_deadline_ms()

    # ------------------------------------------------------------ membership APIs

    def join_group(self, *, group_id: str, member_id: str, group_instance_id: str | None,
                   client_id: str, client_host: str, session_timeout_ms: int,
                   rebalance_timeout_ms: int, protocol_type: str,
                   protocols: Sequence[ProtocolLike], api_version: int, now_ms: int,
                   respond: JoinRespond) -> Result[None]:
        """JoinGroup (any version). `rebalance_timeout_ms` < 0 (v0) means the session timeout."""
        ctx = self._ctx(now_ms)
        error, shard = self._check(group_id, "join_group")
        if error is not None:
            respond(join_error(member_id, error))
            return Result(None)
        assert shard is not None
        error = self._join_consumer_group(ctx, shard, group_id)
        if error is not None:
            respond(join_error(member_id, error))
            return Result(None)
        req = membership.JoinRequest(
            group_id, member_id, group_instance_id, client_id, client_host, session_timeout_ms,
            rebalance_timeout_ms if rebalance_timeout_ms >= 0 else session_timeout_ms,
            protocol_type, plain_protocols(protocols), api_version)
        membership.join_group(ctx, shard.groups, shard.partition, req, respond)
        return Result(None, tuple(ctx.appends))

    def sync_group(self, *, group_id: str, generation_id: int, member_id: str,
                   group_instance_id: str | None, protocol_type: str | None,
                   protocol_name: str | None, assignments: Sequence[AssignmentLike],
                   now_ms: int, respond: SyncRespond) -> Result[None]:
        ctx = self._ctx(now_ms)
        error, shard = self._check(group_id, "sync_group")
        if error is ErrorCode.coordinator_load_in_progress:
            # the rebalance state is lost with the load: make the member rejoin (older
            # clients do not expect COORDINATOR_LOAD_IN_PROGRESS here - Kafka)
            error = ErrorCode.rebalance_in_progress
        if error is not None:
            respond(SyncGroupResult(error))
            return Result(None)
        assert shard is not None
        membership.sync_group(ctx, shard.groups.get(group_id), generation_id, member_id,
                              group_instance_id, protocol_type, protocol_name, assignments,
                              respond)
        return Result(None, tuple(ctx.appends))

    def heartbeat(self, *, group_id: str, generation_id: int, member_id: str,
                  group_instance_id: str | None, now_ms: int) -> Result[HeartbeatResult]:
        ctx = self._ctx(now_ms)
        error, shard = self._check(group_id, "heartbeat")
        if error is ErrorCode.coordinator_load_in_progress:
            return Result(HeartbeatResult(ErrorCode.none))  # Kafka answers blindly while loading
        if error is not None:
            return Result(HeartbeatResult(error))
        assert shard is not None
        response = membership.heartbeat(ctx, shard.groups.get(group_id), member_id,
                                        group_instance_id, generation_id)
        return Result(response, tuple(ctx.appends))

    def leave_group(self, *, group_id: str, members: Sequence[MemberIdentityLike],
                    now_ms: int) -> Result[LeaveGroupResult]:
        """LeaveGroup; v0-v2 pass their one member_id as a one-element list."""
        ctx = self._ctx(now_ms)
        error, shard = self._check(group_id, "leave_group")
        if error is not None:
            return Result(LeaveGroupResult(error))
        assert shard is not None
        response = membership.leave_group(ctx, shard.groups.get(group_id), members)
        return Result(response, tuple(ctx.appends))

    # ------------------------------------------------------------ offsets APIs

    def offset_commit(self, *, group_id: str, generation_id: int, member_id: str,
                      group_instance_id: str | None, topics: Sequence[TopicCommitLike],
                      retention_time_ms: int = offsets.DEFAULT_RETENTION_TIME,
                      api_version: int, now_ms: int) -> Result[OffsetCommitResult]:
        ctx = self._ctx(now_ms)
        error, shard = self._check(group_id, "offset_commit")
        if error is None and group_id in shard.consumer_groups:
            error = self._consumer_commit_error(shard, group_id, member_id, generation_id,
                                                False, api_version)
            if error is None:
                response = offsets.prepare_commit(ctx, group_id, shard.partition, topics, -1,
                                                  -1, -1)
                return Result(response, tuple(ctx.appends))
        if error is not None:
            return Result(commit_errors(topics, error))
        assert shard is not None
        response = offsets.offset_commit(
            ctx, shard.groups.get(group_id), group_id, shard.partition, generation_id,
            member_id, group_instance_id, topics, retention_time_ms, api_version)
        return Result(response, tuple(ctx.appends))

    def txn_offset_commit(self, *, group_id: str, producer_id: int, producer_epoch: int,
                          generation_id: int, member_id: str, group_instance_id: str | None,
                          topics: Sequence[TopicCommitLike],
                          now_ms: int) -> Result[OffsetCommitResult]:
        """KIP-447 TxnOffsetCommit. Producer-epoch fencing happens when the broker appends
        the transactional batch (the partition's producer state), not here."""
        ctx = self._ctx(now_ms)
        error, shard = self._check(group_id, "txn_offset_commit")
        if error is None and group_id in shard.consumer_groups:
            error = self._consumer_commit_error(shard, group_id, member_id, generation_id,
                                                True, 0)
            if error is None:
                response = offsets.prepare_commit(ctx, group_id, shard.partition, topics, -1,
                                                  producer_id, producer_epoch)
                return Result(response, tuple(ctx.appends))
        if error is not None:
            return Result(commit_errors(topics, error))
        assert shard is not None
        response = offsets.txn_offset_commit(
            ctx, shard.groups.get(group_id), group_id, shard.partition, producer_id,
            producer_epoch, generation_id, member_id, group_instance_id, topics)
        return Result(response, tuple(ctx.appends))

    def offset_fetch(self, *, group_id: str, topics: Sequence[TopicPartitionsLike] | None,
                     require_stable: bool = False, member_id: str | None = None,
                     member_epoch: int = -1) -> OffsetFetchResult:
        """One group of OffsetFetch (v8+ asks for several: call once per group). v9+ name
        the member: a consumer group's member must be current (Kafka's validateOffsetFetch)."""
        error, shard = self._check(group_id, "offset_fetch")
        if error is None and group_id in shard.consumer_groups \
                and not (member_id is None and member_epoch < 0):
            error = self.consumers.validate_member_epoch(shard.consumer_groups[group_id],
                                                         member_id, member_epoch)
        if error is not None:
            return OffsetFetchResult(group_id, error)
        assert shard is not None
        return offsets.offset_fetch(shard.offsets, shard.groups.get(group_id), group_id,
                                    topics, require_stable)

    def offset_delete(self, *, group_id: str, topics: Sequence[TopicDeleteLike],
                      now_ms: int) -> Result[OffsetDeleteResult]:
        ctx = self._ctx(now_ms)
        error, shard = self._check(group_id, "offset_delete")
        if error is not None:
            return Result(OffsetDeleteResult(error))
        assert shard is not None
        if group_id in shard.consumer_groups:
            response = self._consumer_offset_delete(ctx, shard, group_id, topics)
            return Result(response, tuple(ctx.appends))
        response = offsets.offset_delete(ctx, shard.offsets, shard.groups.get(group_id),
                                         group_id, topics)
        return Result(response, tuple(ctx.appends))

    # ------------------------------------------------------------ admin APIs

    def describe_groups(self, group_ids: Sequence[str]) -> list[DescribedGroup]:
        return [self._describe(group_id) for group_id in group_ids]

    def list_groups(self, states_filter: Sequence[str] = (),
                    types_filter: Sequence[str] = ()) -> ListGroupsResult:
        """ListGroups; filters are case-insensitive, empty = everything (KIP-518, KIP-848)."""
        error = ErrorCode.coordinator_load_in_progress if self._loading else ErrorCode.none
        states = parse_state_filter(tuple(states_filter)) if states_filter else None
        consumer = self._consumer_listed(states_filter, types_filter)
        if types_filter and CLASSIC_GROUP_TYPE not in {t.lower() for t in types_filter}:
            return ListGroupsResult(error, consumer)
        listed = tuple(
            ListedGroup(g.group_id, g.protocol_type or "", g.state.value, CLASSIC_GROUP_TYPE)
            for shard in self._shards.values() for g in shard.groups.values()
            if states is None or g.state in states)
        return ListGroupsResult(error, listed + consumer)

    def delete_groups(self, group_ids: Sequence[str],
                      now_ms: int) -> Result[list[DeleteGroupResult]]:
        """DeleteGroups: only Empty groups; their offsets and metadata get tombstones."""
        ctx = self._ctx(now_ms)
        results: list[DeleteGroupResult] = []
        by_partition: dict[int, list] = {}
        for group_id in group_ids:
            error, shard = self._check(group_id, "delete_groups")
            if error is None:
                assert shard is not None
                error = self._prepare_delete(ctx, shard, group_id, by_partition)
            results.append(DeleteGroupResult(group_id, error or ErrorCode.none))
        for partition, (ids, records) in sorted(by_partition.items()):
            ctx.append(partition, records, DeleteGroups(tuple(ids)))
        return Result(results, tuple(ctx.appends))

    # ------------------------------------------------------------ internals

    def _ctx(self, now_ms: int) -> Ctx:
        return Ctx(self.config, self._timers, now_ms, self._new_uuid)

    def _group(self, group_id: str) -> Group | None:
        shard = self._shards.get(self.partition_for(group_id))
        return None if shard is None else shard.groups.get(group_id)

    def _check(self, group_id: str | None, api: str) -> tuple[ErrorCode | None, Shard | None]:
        """Kafka's validateGroupStatus: valid id, loaded here, not loading."""
        if group_id is None or (group_id == "" and api not in _EMPTY_GROUP_ID_OK):
            return ErrorCode.invalid_group_id, None
        partition = self.partition_for(group_id)
        if partition in self._loading:
            return ErrorCode.coordinator_load_in_progress, None
        shard = self._shards.get(partition)
        if shard is None:
            return ErrorCode.not_coordinator, None
        return None, shard

    def _replay_entry(self, ctx: Ctx, shard: Shard, entry: LogEntry, loading: bool) -> None:
        if isinstance(entry, TxnMarker):
            self._replay_marker(ctx, shard, entry.producer_id, entry.commit)
            return
        if key_type(entry.key) in consumer_records.KEY_TYPES:
            self.consumers.replay(ctx, shard, entry.key, entry.value)
            return
        key = decode_key(entry.key)
        if isinstance(key, GroupMetadataKey):
            self._replay_group(ctx, shard, key.group, entry.value, loading)
            return
        value = None if entry.value is None else decode_offset_commit_value(entry.value)
        if value is not None and entry.producer_id < 0:
            self._ensure_group(ctx, shard, key.group)
        shard.offsets.replay_commit(entry.offset, entry.producer_id, key, value)
        if value is None:
            self._drop_if_bare(shard, key.group)

    def _replay_marker(self, ctx: Ctx, shard: Shard, producer_id: int, commit: bool) -> None:
        for group_id in shard.offsets.replay_marker(producer_id, commit):
            if shard.offsets.group_offsets(group_id):
                self._ensure_group(ctx, shard, group_id)
            else:
                self._drop_if_bare(shard, group_id)

    @staticmethod
    def _ensure_group(ctx: Ctx, shard: Shard, group_id: str) -> None:
        """Committed offsets without membership make a "simple" group (no protocol type).
        Pending offsets do not: an aborted transaction leaves no group behind, so the state
        after replay does not depend on whether compaction kept the aborted records."""
        if group_id not in shard.groups and group_id not in shard.consumer_groups:
            shard.groups[group_id] = Group(group_id, shard.partition, S.EMPTY, ctx.now_ms)

    @staticmethod
    def _drop_if_bare(shard: Shard, group_id: str) -> None:
        """A simple group lives only as long as its offsets. (Kafka keeps it until the
        next expiration run, so whether it survives a restart depends on compaction;
        dropping it at once makes the state after replay a function of the log.)"""
        group = shard.groups.get(group_id)
        if group is not None and group.is_(S.EMPTY) and group.protocol_type is None \
                and group.generation_id == 0 and not group.pending_members \
                and not shard.offsets.group_offsets(group_id) \
                and group_id not in shard.offsets.open_txns_by_group:
            del shard.groups[group_id]

    def _replay_group(self, ctx: Ctx, shard: Shard, group_id: str, data: bytes | None,
                      loading: bool) -> None:
        group = shard.groups.get(group_id)
        if data is None:  # tombstone: the group is gone (its offsets have their own)
            if group is not None:
                ctx.cancel_all(group)
                rebalance.answer_all_removed(group)
                del shard.groups[group_id]
            if shard.offsets.group_offsets(group_id):
                # offsets outlived it (never so when we wrote the log): what is left is a
                # simple group, exactly what replaying a compacted log would build
                self._ensure_group(ctx, shard, group_id)
            return
        value = decode_group_metadata_value(data)
        if loading or group is None:
            # loading builds the group from its newest record (Kafka's replay)
            shard.groups[group_id] = Group.from_value(group_id, shard.partition, value, ctx.now_ms)
        else:
            # live: the record this group wrote is durable now
            rebalance.on_group_record_durable(ctx, group, value)

    def _append_failed(self, ctx: Ctx, shard: Shard | None, intent: object, error: ErrorCode,
                       response: R) -> R:
        if isinstance(intent, offsets.CommitOffsets):
            return offsets.commit_failed(intent.response, error)  # type: ignore[return-value]
        if isinstance(intent, offsets.DeleteOffsets):
            return offsets.delete_failed(intent.response, error)  # type: ignore[return-value]
        if shard is None:
            return response
        if isinstance(intent, ConsumerWrite):
            self.consumers.failed(shard, intent)
            return self.consumer_write_failed(intent, response, error)
        if isinstance(intent, DeleteGroups):
            self._revert_delete(ctx, shard, intent.group_ids)
            if isinstance(response, list):
                failed = set(intent.group_ids)
                mapped = offset_append_error(error)
                return [replace(r, error=mapped) if r.group_id in failed else r
                        for r in response]  # type: ignore[return-value]
            return response
        group_id = getattr(intent, "group_id", None)
        group = shard.groups.get(group_id) if group_id is not None else None
        if group is not None:
            rebalance.on_group_record_failed(ctx, group, intent, error)
        return response

    def _prepare_delete(self, ctx: Ctx, shard: Shard, group_id: str,
                        by_partition: dict[int, list]) -> ErrorCode | None:
        if group_id in shard.consumer_groups:
            return self._consumer_delete(ctx, shard, group_id)
        group = shard.groups.get(group_id)
        if group is None or group.is_(S.DEAD):
            return ErrorCode.group_id_not_found
        if not group.is_(S.EMPTY):
            return ErrorCode.non_empty_group
        self._kill(ctx, shard, group, by_partition)
        return None

    def _kill(self, ctx: Ctx, shard: Shard, group: Group, by_partition: dict[int, list]) -> None:
        """Mark an Empty group Dead and queue its tombstones; the group disappears when
        the group tombstone is replayed."""
        records = offsets.all_offset_tombstones(shard.offsets, group.group_id)
        records.append(group_metadata_record(group.group_id, None))
        ctx.cancel_all(group)
        group.transition(S.DEAD, ctx.now_ms)
        ids, queued = by_partition.setdefault(shard.partition, ([], []))
        ids.append(group.group_id)
        queued.extend(records)

    def _revert_delete(self, ctx: Ctx, shard: Shard, group_ids: Iterable[str]) -> None:
        """The tombstones did not make it: the groups are what a reload would give."""
        for group_id in group_ids:
            group = shard.groups.get(group_id)
            if group is not None and group.is_(S.DEAD):
                shard.groups[group_id] = Group.from_value(group_id, shard.partition,
                                                          group.to_value(), ctx.now_ms)

    def _schedule_expiration(self, ctx: Ctx) -> None:
        if not self._expiration_scheduled and self._shards:
            self._timers.schedule(OFFSETS_EXPIRATION,
                                  ctx.now_ms + self.config.offsets_retention_check_interval_ms)
            self._expiration_scheduled = True

    def _expire_offsets(self, ctx: Ctx) -> None:
        """Kafka's cleanupGroupMetadata: tombstones for expired offsets, and for Empty
        groups that have none left."""
        for shard in self._shards.values():
            by_partition: dict[int, list] = {}
            expired = []
            for group in list(shard.groups.values()):
                if group.is_(S.DEAD) or group.pending_members:
                    continue  # (a pending member is about to join: keep its group)
                records, all_expired = offsets.expire_offsets(ctx, shard.offsets, group)
                if all_expired and group.is_(S.EMPTY):
                    self._kill(ctx, shard, group, by_partition)  # tombstones every offset
                else:
                    expired.extend(records)
            ctx.append(shard.partition, expired, rebalance.Housekeeping("offsets expired"))
            for partition, (ids, records) in by_partition.items():
                ctx.append(partition, records, DeleteGroups(tuple(ids)))

    def _describe(self, group_id: str) -> DescribedGroup:
        error, shard = self._check(group_id, "describe_groups")
        if error is not None:
            return DescribedGroup(group_id, error, "")
        assert shard is not None
        if group_id in shard.consumer_groups:
            return self._consumer_described(shard, group_id)
        group = shard.groups.get(group_id)
        if group is None:
            return DescribedGroup(group_id, ErrorCode.none, S.DEAD.value)
        stable = group.is_(S.STABLE)
        protocol = group.protocol_name if stable else None
        members = tuple(
            DescribedMember(m.member_id, m.group_instance_id, m.client_id, m.client_host,
                            m.metadata(protocol) if protocol is not None else b"", m.assignment)
            for m in group.members.values())
        return DescribedGroup(group_id, ErrorCode.none, group.state.value,
                              group.protocol_type or "", protocol or "", members)
