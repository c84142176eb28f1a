"""The group coordinator (classic protocol) and the __consumer_offsets it keeps.

Sans-IO: see `coordinator.py` for the theory of operation and the broker's contract,
`api.py` for what goes in and out (plain values; kio's request dataclasses fit the nested
shapes as they are, responses are our own version-independent dataclasses that the broker
turns into kio responses), `state.py` for the state machine, `records.py` for the on-disk
format, `compaction.py` for keeping __consumer_offsets bounded.
"""

from onceflow.groups.api import (
    Append,
    Appended,
    AppendFailed,
    AppendOutcome,
    DeleteGroupResult,
    DescribedGroup,
    DescribedMember,
    FetchedPartition,
    FetchedTopic,
    HeartbeatResult,
    JoinGroupMember,
    JoinGroupResult,
    JoinProtocol,
    LeaveGroupResult,
    LeaveMemberResult,
    ListedGroup,
    ListGroupsResult,
    MemberAssignment,
    MemberIdentity,
    OffsetCommitResult,
    OffsetDeleteResult,
    OffsetFetchResult,
    PartitionCommit,
    PartitionError,
    Result,
    SyncGroupResult,
    TopicCommit,
    TopicErrors,
    TopicPartitions,
)
from onceflow.groups.compaction import compact
from onceflow.groups.config import CoordinatorConfig
from onceflow.groups.coordinator import GroupCoordinator
from onceflow.groups.records import (
    LogEntry,
    LogRecord,
    Record,
    TxnMarker,
    java_string_hashcode,
    partition_for,
)
from onceflow.groups.state import LEGAL_TRANSITIONS, GroupState, IllegalTransition

__all__ = [
    "Append", "AppendFailed", "Appended", "AppendOutcome", "CoordinatorConfig",
    "DeleteGroupResult", "DescribedGroup", "DescribedMember", "FetchedPartition",
    "FetchedTopic", "GroupCoordinator", "GroupState", "HeartbeatResult", "IllegalTransition",
    "JoinGroupMember", "JoinGroupResult", "JoinProtocol", "LEGAL_TRANSITIONS",
    "LeaveGroupResult", "LeaveMemberResult", "ListGroupsResult", "ListedGroup", "LogEntry",
    "LogRecord", "MemberAssignment", "MemberIdentity", "OffsetCommitResult",
    "OffsetDeleteResult", "OffsetFetchResult", "PartitionCommit", "PartitionError", "Record",
    "Result", "SyncGroupResult", "TopicCommit", "TopicErrors", "TopicPartitions", "TxnMarker",
    "compact", "java_string_hashcode", "partition_for",
]
