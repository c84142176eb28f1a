"""Broker settings of the group coordinator, with Kafka's names and defaults.

Every field is a broker setting (`server.properties` name in the comment) so that
tests can shrink timeouts (e.g. `group_initial_rebalance_delay_ms=0`) while the
defaults behave like Kafka 3.x/4.x.
"""

from __future__ import annotations

from dataclasses import dataclass

# Kafka: GroupCoordinatorConfig.OFFSETS_TOPIC_PARTITIONS_DEFAULT. Changing it after
# groups exist moves groups to other partitions, exactly as in Kafka.
OFFSETS_TOPIC_PARTITIONS_DEFAULT = 50

# Kafka: GROUP_INITIAL_REBALANCE_DELAY_MS_DEFAULT. Lets a group that starts with many
# consumers form one generation instead of one rebalance per arriving consumer.
GROUP_INITIAL_REBALANCE_DELAY_MS_DEFAULT = 3_000

# Kafka: GROUP_MIN/MAX_SESSION_TIMEOUT_MS_DEFAULT (classic protocol).
GROUP_MIN_SESSION_TIMEOUT_MS_DEFAULT = 6_000
GROUP_MAX_SESSION_TIMEOUT_MS_DEFAULT = 1_800_000

# Kafka: GROUP_MAX_SIZE_DEFAULT (Integer.MAX_VALUE, i.e. unbounded).
GROUP_MAX_SIZE_DEFAULT = 2**31 - 1

# Kafka: OFFSET_METADATA_MAX_SIZE_DEFAULT; bounds the client-chosen metadata string kept
# in memory and in __consumer_offsets for every committed partition.
OFFSET_METADATA_MAX_BYTES_DEFAULT = 4_096

# Kafka: offsets.retention.minutes = 7 days; offsets.retention.check.interval.ms = 10 min.
OFFSETS_RETENTION_MS_DEFAULT = 7 * 24 * 60 * 60 * 1000
OFFSETS_RETENTION_CHECK_INTERVAL_MS_DEFAULT = 600_000

# Kafka: GroupCoordinator.NewMemberJoinTimeoutMs. A new member's JoinGroup cannot be
# heartbeated (the member has no id yet), so its request expires after this instead.
NEW_MEMBER_JOIN_TIMEOUT_MS_DEFAULT = 5 * 60 * 1000

# Kafka: log.cleaner.delete.retention.ms default (1 day): how long a tombstone survives
# compaction, so that a reader that was behind still sees the deletion.
TOMBSTONE_RETENTION_MS_DEFAULT = 24 * 60 * 60 * 1000


# Kafka 4.0's defaults for consumer groups (KIP-848): group.consumer.session.timeout.ms,
# group.consumer.heartbeat.interval.ms, group.consumer.assignors (the first is the
# default), group.consumer.max.size, group.consumer.migration.policy.
CONSUMER_GROUP_SESSION_TIMEOUT_MS_DEFAULT = 45_000
CONSUMER_GROUP_HEARTBEAT_INTERVAL_MS_DEFAULT = 5_000
CONSUMER_GROUP_ASSIGNORS_DEFAULT = ("uniform", "range")
CONSUMER_GROUP_MAX_SIZE_DEFAULT = 2**31 - 1
CONSUMER_GROUP_MIGRATION_POLICIES = ("disabled", "upgrade", "downgrade", "bidirectional")
# Kafka's REGEX_BATCH_REFRESH_INTERVAL_MS (a constant there): the least time between two
# resolutions of a group's regexes, which scan every topic name.
CONSUMER_GROUP_REGEX_REFRESH_INTERVAL_MS_DEFAULT = 10_000


@dataclass(frozen=True, slots=True)
class CoordinatorConfig:
    """Kafka's setting names in the comments."""

    # offsets.topic.num.partitions
    offsets_topic_num_partitions: int = OFFSETS_TOPIC_PARTITIONS_DEFAULT
    # group.initial.rebalance.delay.ms
    group_initial_rebalance_delay_ms: int = GROUP_INITIAL_REBALANCE_DELAY_MS_DEFAULT
    # group.min.session.timeout.ms / group.max.session.timeout.ms
    group_min_session_timeout_ms: int = GROUP_MIN_SESSION_TIMEOUT_MS_DEFAULT
    group_max_session_timeout_ms: int = GROUP_MAX_SESSION_TIMEOUT_MS_DEFAULT
    # group.max.size
    group_max_size: int = GROUP_MAX_SIZE_DEFAULT
    # offset.metadata.max.bytes
    offset_metadata_max_bytes: int = OFFSET_METADATA_MAX_BYTES_DEFAULT
    # offsets.retention.minutes (in ms) / offsets.retention.check.interval.ms
    offsets_retention_ms: int = OFFSETS_RETENTION_MS_DEFAULT
    offsets_retention_check_interval_ms: int = OFFSETS_RETENTION_CHECK_INTERVAL_MS_DEFAULT
    # not configurable in Kafka (GroupCoordinator.NewMemberJoinTimeoutMs)
    new_member_join_timeout_ms: int = NEW_MEMBER_JOIN_TIMEOUT_MS_DEFAULT
    # delete.retention.ms of __consumer_offsets (used by compaction)
    tombstone_retention_ms: int = TOMBSTONE_RETENTION_MS_DEFAULT
    # consumer groups (KIP-848): group.consumer.session.timeout.ms, .heartbeat.interval.ms,
    # .assignors, .max.size, .migration.policy; the regex refresh interval (see above)
    consumer_group_session_timeout_ms: int = CONSUMER_GROUP_SESSION_TIMEOUT_MS_DEFAULT
    consumer_group_heartbeat_interval_ms: int = CONSUMER_GROUP_HEARTBEAT_INTERVAL_MS_DEFAULT
    consumer_group_assignors: tuple[str, ...] = CONSUMER_GROUP_ASSIGNORS_DEFAULT
    consumer_group_max_size: int = CONSUMER_GROUP_MAX_SIZE_DEFAULT
    consumer_group_migration_policy: str = "bidirectional"
    consumer_group_regex_refresh_interval_ms: int = CONSUMER_GROUP_REGEX_REFRESH_INTERVAL_MS_DEFAULT

    def __post_init__(self) -> None:
        assert self.offsets_topic_num_partitions >= 1
        assert self.group_initial_rebalance_delay_ms >= 0
        assert 0 <= self.group_min_session_timeout_ms <= self.group_max_session_timeout_ms
        assert self.group_max_size >= 1
        assert self.offsets_retention_check_interval_ms >= 1
        assert 0 < self.consumer_group_heartbeat_interval_ms < self.consumer_group_session_timeout_ms
        assert self.consumer_group_assignors, "at least one server assignor"
        assert self.consumer_group_migration_policy in CONSUMER_GROUP_MIGRATION_POLICIES
