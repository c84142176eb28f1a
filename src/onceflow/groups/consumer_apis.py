"""The group coordinator's entry points for consumer groups (KIP-848), and how the
classic APIs (offsets, DescribeGroups, ListGroups, DeleteGroups, JoinGroup) treat them.

A mixin of `GroupCoordinator` (coordinator.py), kept apart so that each module stays
readable: the consumer-group rules themselves live in onceflow.groups.consumer, the
classic ones in membership/offsets/rebalance; this module only routes between them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from onceflow.groups import offsets
from onceflow.groups.api import (
    DescribedGroup,
    DescribedMember,
    ListedGroup,
    OffsetDeleteResult,
    PartitionError,
    Result,
    TopicDeleteLike,
    TopicErrors,
    group_append_error,
)
from onceflow.groups.consumer.coordinator import ConsumerWrite, DescribedConsumerGroup
from onceflow.groups.consumer.group import CONSUMER_GROUP_TYPE, CONSUMER_PROTOCOL_TYPE
from onceflow.groups.consumer.heartbeat import HeartbeatError, HeartbeatRequest, HeartbeatResult
from onceflow.groups.consumer.target import TopicsImage
from onceflow.groups.context import Ctx
from onceflow.groups.records import group_metadata_record
from onceflow.groups.state import GroupState

if TYPE_CHECKING:
    from onceflow.groups.consumer.coordinator import ConsumerGroups

Shard = Any  # coordinator.Shard (which imports this module: named here, not imported)

S = GroupState
# OffsetCommit v9 is the first that carries a member epoch (KIP-848 members must use it)
CONSUMER_OFFSET_COMMIT_MIN_VERSION = 9


class ConsumerGroupAPIs:
    consumers: ConsumerGroups
    topics_image: TopicsImage

    # ------------------------------------------------------------ consumer groups (KIP-848)

    def update_topics(self, image: TopicsImage) -> None:
        """The broker's topics changed (or are handed over for the first time)."""
        self.topics_image = image

    def consumer_group_heartbeat(self, req: HeartbeatRequest,
                                 now_ms: int) -> Result[HeartbeatResult]:
        ctx = self._ctx(now_ms)
        error, shard = self._check(req.group_id, "consumer_group_heartbeat")
        if error is not None:
            if error is ErrorCode.invalid_group_id:
                error = ErrorCode.invalid_request  # Kafka: "GroupId can't be empty."
            return Result(HeartbeatResult(error, member_epoch=-1))
        assert shard is not None

        def convert() -> tuple[Any, list]:
            """An empty classic group becomes a consumer group (its offsets stay); a live
            one does not (no online upgrade here): Kafka's answer when it cannot convert."""
            classic = shard.groups[req.group_id]
            if not classic.is_(S.EMPTY) or classic.pending_members:
                raise HeartbeatError(ErrorCode.group_id_not_found,
                                     f"Group {req.group_id} is not a consumer group.")
            ctx.cancel_all(classic)
            return classic, [group_metadata_record(req.group_id, None)]

        response = self.consumers.heartbeat(ctx, shard, req, self.topics_image, convert)
        return Result(response, tuple(ctx.appends))

    def consumer_group_describe(self, group_ids: Sequence[str]) -> list[DescribedConsumerGroup]:
        described = []
        for group_id in group_ids:
            error, shard = self._check(group_id, "consumer_group_describe")
            if error is not None:
                described.append(DescribedConsumerGroup(group_id, error))
            else:
                described.append(self.consumers.describe(shard, group_id, self.topics_image))
        return described

    def _consumer_commit_error(self, shard: Shard, group_id: str, member_id: str,
                               epoch: int, transactional: bool,
                               api_version: int) -> ErrorCode | None:
        """Kafka's ConsumerGroup.validateOffsetCommit (TxnOffsetCommit: a stale epoch is
        ILLEGAL_GENERATION, as Kafka maps it, which KIP-447 clients understand)."""
        group = shard.consumer_groups[group_id]
        if epoch < 0 and group.is_empty():
            return None
        if not transactional and member_id in group.members \
                and api_version < CONSUMER_OFFSET_COMMIT_MIN_VERSION:
            return ErrorCode.unsupported_version
        error = self.consumers.validate_member_epoch(group, member_id, epoch)
        if transactional and error is ErrorCode.stale_member_epoch:
            return ErrorCode.illegal_generation
        return error

    # ------------------------------------------------------------ classic APIs on consumer groups

    def _consumer_offset_delete(self, ctx: Ctx, shard: Shard, group_id: str,
                                topics: Sequence[TopicDeleteLike]) -> OffsetDeleteResult:
        """Kafka: any state, but not the offsets of a topic the group subscribes to."""
        group = shard.consumer_groups[group_id]
        subscribed = group.subscribed_topic_names()
        records, answered = [], []
        for topic in topics:
            errors = []
            for p in topic.partitions:
                if topic.name in subscribed:
                    errors.append(PartitionError(p.partition_index,
                                                 ErrorCode.group_subscribed_to_topic))
                    continue
                tp = (topic.name, p.partition_index)
                if shard.offsets.get(group_id, tp) is not None \
                        or shard.offsets.has_pending(group_id, tp):
                    records.append(offsets.offset_commit_record(group_id, tp[0], tp[1], None))
                errors.append(PartitionError(p.partition_index, ErrorCode.none))
            answered.append(TopicErrors(topic.name, tuple(errors)))
        response = OffsetDeleteResult(ErrorCode.none, tuple(answered))
        ctx.append(shard.partition, records, offsets.DeleteOffsets(response))
        return response

    def _consumer_described(self, shard: Shard, group_id: str) -> DescribedGroup:
        """DescribeGroups (the classic API) of a consumer group: its state, protocol type
        "consumer", the assignor, and its members (no classic metadata to show)."""
        described = self.consumers.describe(shard, group_id, self.topics_image)
        members = tuple(DescribedMember(m.member_id, m.instance_id, m.client_id, m.client_host,
                                        b"", b"") for m in described.members)
        return DescribedGroup(group_id, ErrorCode.none, described.state, CONSUMER_PROTOCOL_TYPE,
                              described.assignor, members)

    def _consumer_listed(self, states: Sequence[str],
                         types: Sequence[str]) -> tuple[ListedGroup, ...]:
        if types and CONSUMER_GROUP_TYPE not in {t.lower() for t in types}:
            return ()
        wanted = {s.lower() for s in states}
        return tuple(ListedGroup(g.group_id, CONSUMER_PROTOCOL_TYPE, g.state, CONSUMER_GROUP_TYPE)
                     for shard in self._shards.values()  # type: ignore[attr-defined]
                     for g in shard.consumer_groups.values()
                     if not wanted or g.state.lower() in wanted)

    def _consumer_delete(self, ctx: Ctx, shard: Shard, group_id: str) -> ErrorCode | None:
        """DeleteGroups of a consumer group: Empty only; its records and offsets go."""
        group = shard.consumer_groups[group_id]
        if not group.is_empty():
            return ErrorCode.non_empty_group
        self.consumers.apply(ctx, shard, group_id, group.tombstones())
        ctx.append(shard.partition, offsets.all_offset_tombstones(shard.offsets, group_id),
                   offsets.DeleteOffsets(OffsetDeleteResult(ErrorCode.none)))
        return None

    def _join_consumer_group(self, ctx: Ctx, shard: Shard, group_id: str) -> ErrorCode | None:
        """A classic JoinGroup for a consumer group's id: an empty consumer group is
        deleted (its offsets stay) and the classic group takes its place, as Kafka does
        for any migration policy; a live one would need classic members inside a consumer
        group, which is not implemented: INCONSISTENT_GROUP_PROTOCOL."""
        group = shard.consumer_groups.get(group_id)
        if group is None:
            return None
        if not group.is_empty():
            return ErrorCode.inconsistent_group_protocol
        self.consumers.apply(ctx, shard, group_id, group.tombstones())
        return None

    @staticmethod
    def consumer_write_failed(intent: ConsumerWrite, response: object,
                              error: ErrorCode) -> object:
        """The response a request gets when its consumer-group records failed to append."""
        if isinstance(response, HeartbeatResult):
            return HeartbeatResult(group_append_error(error), member_epoch=-1)
        return response
