"""onceflow storage: segmented partition logs on disk, behind one interface.

`Store` owns the data directory (topics, partitions, durable metadata); each partition is a
`PartitionLog` of segments; `GroupCommitter` coalesces the fsyncs of acks=all appends.
Storage does blocking file I/O and never imports asyncio: the broker picks the threads.
See docs/architecture.md ("storage") and each module's docstring for the theory of operation.
"""

from onceflow.storage.config import (
    TOPIC_CONFIGS,
    ConfigKey,
    ConfigType,
    LogConfig,
    parse_topic_config,
    topic_config_defaults,
    validate_topic_configs,
)
from onceflow.storage.group_commit import GroupCommitStats, GroupCommitter
from onceflow.storage.layout import (
    BatchHeader,
    CorruptFileError,
    CorruptLogError,
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidTopicError,
    LogClosedError,
    LogFailedError,
    OffsetOutOfRange,
    StorageError,
    TopicExistsError,
    UnknownTopicError,
)
from onceflow.storage.log import AppendInfo, PartitionLog, RecoveryReport
from onceflow.storage.store import Store, TopicInfo, validate_topic_name

__all__ = [
    "AppendInfo",
    "BatchHeader",
    "ConfigKey",
    "ConfigType",
    "CorruptFileError",
    "CorruptLogError",
    "GroupCommitStats",
    "GroupCommitter",
    "InvalidConfigError",
    "InvalidPartitionsError",
    "InvalidTopicError",
    "LogClosedError",
    "LogConfig",
    "LogFailedError",
    "OffsetOutOfRange",
    "PartitionLog",
    "RecoveryReport",
    "StorageError",
    "Store",
    "TOPIC_CONFIGS",
    "TopicExistsError",
    "TopicInfo",
    "UnknownTopicError",
    "parse_topic_config",
    "topic_config_defaults",
    "validate_topic_configs",
    "validate_topic_name",
]
