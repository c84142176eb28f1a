"""Values exchanged between the coordinator and the broker.

Inputs are plain Python values. Where a request carries nested lists, the coordinator
accepts any object with Kafka's field names (the `Protocol` classes below): kio's request
dataclasses (`JoinGroupRequestProtocol`, `OffsetCommitRequestTopic`, ...) satisfy them
as they are, and so do the small dataclasses defined here for tests. Outputs are the
frozen dataclasses below, independent of the API version; the broker builds the kio
response of the version it is answering.

Every handler returns a `Result`: the response (None for JoinGroup/SyncGroup, which are
answered through their `respond` callback) and the `Append`s to write to
__consumer_offsets. The broker appends each, waits until it is durable, and hands the
outcomes to `GroupCoordinator.complete`, which replays the records (or handles the
failure) and returns the response to send.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from kio.schema.errors import ErrorCode

from onceflow.groups.records import NO_PRODUCER_EPOCH, NO_PRODUCER_ID, Record

R = TypeVar("R")


# ---------------------------------------------------------------- request shapes


class ProtocolLike(Protocol):
    """JoinGroup: one protocol the member supports (name, e.g. "range"; opaque metadata)."""

    name: str
    metadata: bytes


class AssignmentLike(Protocol):
    """SyncGroup: the leader's assignment for one member."""

    member_id: str
    assignment: bytes


class MemberIdentityLike(Protocol):
    """LeaveGroup v3+: one leaving member (member_id "" + instance id = admin removal)."""

    member_id: str
    group_instance_id: str | None


class PartitionCommitLike(Protocol):
    partition_index: int
    committed_offset: int
    committed_leader_epoch: int
    committed_metadata: str | None


class TopicCommitLike(Protocol):
    name: str
    partitions: Sequence[PartitionCommitLike]


class PartitionIndexLike(Protocol):
    partition_index: int


class TopicDeleteLike(Protocol):
    """OffsetDelete: a topic and its partitions (kio's OffsetDeleteRequestTopic)."""

    name: str
    partitions: Sequence[PartitionIndexLike]


class TopicPartitionsLike(Protocol):
    """OffsetFetch: a topic and the partitions wanted."""

    name: str
    partition_indexes: Sequence[int]


@dataclass(frozen=True, slots=True)
class JoinProtocol:
    name: str
    metadata: bytes


@dataclass(frozen=True, slots=True)
class MemberAssignment:
    member_id: str
    assignment: bytes


@dataclass(frozen=True, slots=True)
class MemberIdentity:
    member_id: str
    group_instance_id: str | None = None
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class PartitionCommit:
    partition_index: int
    committed_offset: int
    committed_leader_epoch: int = -1
    committed_metadata: str | None = ""


@dataclass(frozen=True, slots=True)
class TopicCommit:
    name: str
    partitions: tuple[PartitionCommit, ...]


@dataclass(frozen=True, slots=True)
class TopicPartitions:
    name: str
    partition_indexes: tuple[int, ...]


# ---------------------------------------------------------------- responses


@dataclass(frozen=True, slots=True)
class JoinGroupMember:
    member_id: str
    group_instance_id: str | None
    metadata: bytes


@dataclass(frozen=True, slots=True)
class JoinGroupResult:
    error: ErrorCode
    member_id: str
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    skip_assignment: bool = False
    members: tuple[JoinGroupMember, ...] = ()  # non-empty for the leader only


@dataclass(frozen=True, slots=True)
class SyncGroupResult:
    error: ErrorCode
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


@dataclass(frozen=True, slots=True)
class HeartbeatResult:
    error: ErrorCode


@dataclass(frozen=True, slots=True)
class LeaveMemberResult:
    member_id: str
    group_instance_id: str | None
    error: ErrorCode


@dataclass(frozen=True, slots=True)
class LeaveGroupResult:
    error: ErrorCode  # v0-v2 clients: the broker answers with the one member's error
    members: tuple[LeaveMemberResult, ...] = ()


@dataclass(frozen=True, slots=True)
class PartitionError:
    partition_index: int
    error: ErrorCode


@dataclass(frozen=True, slots=True)
class TopicErrors:
    name: str
    partitions: tuple[PartitionError, ...]


@dataclass(frozen=True, slots=True)
class OffsetCommitResult:
    """OffsetCommit / TxnOffsetCommit response: one error per requested partition."""

    topics: tuple[TopicErrors, ...]


@dataclass(frozen=True, slots=True)
class OffsetDeleteResult:
    error: ErrorCode
    topics: tuple[TopicErrors, ...] = ()


@dataclass(frozen=True, slots=True)
class FetchedPartition:
    partition_index: int
    committed_offset: int  # -1 = none
    committed_leader_epoch: int  # -1 = unknown
    metadata: str
    error: ErrorCode = ErrorCode.none


@dataclass(frozen=True, slots=True)
class FetchedTopic:
    name: str
    partitions: tuple[FetchedPartition, ...]


@dataclass(frozen=True, slots=True)
class OffsetFetchResult:
    group_id: str
    error: ErrorCode
    topics: tuple[FetchedTopic, ...] = ()


@dataclass(frozen=True, slots=True)
class DescribedMember:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    member_metadata: bytes  # only for Stable groups, as in Kafka
    member_assignment: bytes


@dataclass(frozen=True, slots=True)
class DescribedGroup:
    group_id: str
    error: ErrorCode
    group_state: str  # Kafka's state name; "Dead" for an unknown group
    protocol_type: str = ""
    protocol_data: str = ""  # the selected protocol, only for Stable groups
    members: tuple[DescribedMember, ...] = ()


@dataclass(frozen=True, slots=True)
class ListedGroup:
    group_id: str
    protocol_type: str
    group_state: str
    group_type: str = "classic"


@dataclass(frozen=True, slots=True)
class ListGroupsResult:
    error: ErrorCode
    groups: tuple[ListedGroup, ...]


@dataclass(frozen=True, slots=True)
class DeleteGroupResult:
    group_id: str
    error: ErrorCode


# ---------------------------------------------------------------- effects


@dataclass(frozen=True, slots=True)
class Append:
    """Records to append to one __consumer_offsets partition, as one batch.

    A transactional offset commit carries the producer id/epoch: the broker appends it
    as a transactional batch of that producer, so the partition's producer state fences
    stale epochs and the transaction's COMMIT/ABORT marker later settles it.
    `intent` tells the coordinator what to undo if the append fails (opaque to the broker).
    """

    partition: int
    records: tuple[Record, ...]
    intent: Any = None
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH


@dataclass(frozen=True, slots=True)
class Appended:
    """Outcome: the batch is durable; its first record got `base_offset`."""

    base_offset: int
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class AppendFailed:
    """Outcome: the append failed with this (storage-level) Kafka error."""

    error: ErrorCode


AppendOutcome = Appended | AppendFailed


@dataclass(frozen=True, slots=True)
class Result(Generic[R]):
    response: R
    appends: tuple[Append, ...] = field(default=())


JoinRespond = Callable[[JoinGroupResult], None]
SyncRespond = Callable[[SyncGroupResult], None]


def join_error(member_id: str, error: ErrorCode) -> JoinGroupResult:
    """Kafka's JoinGroupResult(memberId, error): no generation, protocol or leader."""
    return JoinGroupResult(error=error, member_id=member_id)


def commit_errors(topics: Sequence[TopicCommitLike], error: ErrorCode) -> OffsetCommitResult:
    """The same error for every requested partition."""
    return OffsetCommitResult(tuple(
        TopicErrors(t.name, tuple(PartitionError(p.partition_index, error) for p in t.partitions))
        for t in topics
    ))


# Kafka's mapping of a failed __consumer_offsets append to the error a client
# understands (GroupMetadataManager.maybeConvertOffsetCommitError / storeGroup).
_APPEND_ERROR_FOR_CLIENT: dict[ErrorCode, ErrorCode] = {
    ErrorCode.unknown_topic_or_partition: ErrorCode.coordinator_not_available,
    ErrorCode.not_enough_replicas: ErrorCode.coordinator_not_available,
    ErrorCode.not_enough_replicas_after_append: ErrorCode.coordinator_not_available,
    ErrorCode.not_leader_or_follower: ErrorCode.not_coordinator,
    ErrorCode.kafka_storage_error: ErrorCode.not_coordinator,
    ErrorCode.message_too_large: ErrorCode.invalid_commit_offset_size,
    ErrorCode.record_list_too_large: ErrorCode.invalid_commit_offset_size,
    ErrorCode.invalid_fetch_size: ErrorCode.invalid_commit_offset_size,
}

_GROUP_APPEND_ERROR_FOR_CLIENT: dict[ErrorCode, ErrorCode] = {
    **_APPEND_ERROR_FOR_CLIENT,
    ErrorCode.request_timed_out: ErrorCode.rebalance_in_progress,
    ErrorCode.message_too_large: ErrorCode.unknown_server_error,
    ErrorCode.record_list_too_large: ErrorCode.unknown_server_error,
    ErrorCode.invalid_fetch_size: ErrorCode.unknown_server_error,
}


def offset_append_error(error: ErrorCode) -> ErrorCode:
    return _APPEND_ERROR_FOR_CLIENT.get(error, error)


def group_append_error(error: ErrorCode) -> ErrorCode:
    return _GROUP_APPEND_ERROR_FOR_CLIENT.get(error, error)
