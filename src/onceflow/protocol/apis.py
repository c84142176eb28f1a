"""The one table of APIs and versions the broker advertises.

Theory of operation: `SUPPORTED` maps an API key to the inclusive version range
the broker answers. It drives three things and nothing else may duplicate it:
the ApiVersions response, `codec.decode_request` (a request outside the table
raises UnsupportedVersion) and the codec caches. Adding an API is one line here
plus its handler; tests/protocol check that kio has a schema for every version
listed.

Clients pick, per API, the highest version in both their range and ours, so the
minimum decides which old clients still work and the maximum decides which
newer semantics the handlers must implement.

Client facts the ranges rest on (read from the clients' sources):

- librdkafka 2.16 (confluent-kafka): Produce up to v10, Fetch up to v16; it
  turns features on by overlap with the advertised ranges
  (rdkafka_feature.c): message format v2 needs Produce 3 and Fetch 4 in range
  (before librdkafka 2.11.1 the check was on exactly those versions, so the
  minimums must not exceed 3 and 4); zstd needs Produce 7 and Fetch 10 in range
  (before 2.11.1: exactly 7 and 10), else the producer silently sends
  uncompressed batches; gzip and snappy need only message format v2. LZ4 is tied
  to FindCoordinator being advertised (any version; exactly v0 before 2.11.1),
  so until FindCoordinator is in this table librdkafka sends lz4-configured
  topics uncompressed.
- kafka-python 3.x: Produce up to v9, Fetch up to v12 (v4+ for read_committed),
  ApiVersions up to v4 with the UNSUPPORTED_VERSION retry loop.
- aiokafka 0.14: Produce up to v7, Fetch up to v11, ApiVersions v0.
- Java 3.x/4.x: Produce/Fetch minimums are 3/4 in 4.x; Fetch above v12 only when
  every fetched topic has a topic id, otherwise it caps itself at v12.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ("FEATURES", "SUPPORTED", "ApiKey", "Feature", "is_supported")


class ApiKey(enum.IntEnum):
    """Kafka API keys (names as in Kafka's message JSON specs, snake case upper)."""

    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    DELETE_RECORDS = 21
    INIT_PRODUCER_ID = 22
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    WRITE_TXN_MARKERS = 27
    TXN_OFFSET_COMMIT = 28
    DESCRIBE_CONFIGS = 32
    ALTER_CONFIGS = 33
    DESCRIBE_ACLS = 29
    CREATE_ACLS = 30
    DELETE_ACLS = 31
    DESCRIBE_LOG_DIRS = 35
    SASL_AUTHENTICATE = 36
    CREATE_PARTITIONS = 37
    DELETE_GROUPS = 42
    ELECT_LEADERS = 43
    INCREMENTAL_ALTER_CONFIGS = 44
    ALTER_PARTITION_REASSIGNMENTS = 45
    LIST_PARTITION_REASSIGNMENTS = 46
    OFFSET_DELETE = 47
    DESCRIBE_CLIENT_QUOTAS = 48
    ALTER_CLIENT_QUOTAS = 49
    DESCRIBE_USER_SCRAM_CREDENTIALS = 50
    ALTER_USER_SCRAM_CREDENTIALS = 51
    DESCRIBE_CLUSTER = 60
    DESCRIBE_PRODUCERS = 61
    DESCRIBE_TRANSACTIONS = 65
    LIST_TRANSACTIONS = 66
    CONSUMER_GROUP_HEARTBEAT = 68
    CONSUMER_GROUP_DESCRIBE = 69
    LIST_CONFIG_RESOURCES = 74
    DESCRIBE_TOPIC_PARTITIONS = 75


# api_key -> (min_version, max_version), both inclusive.
SUPPORTED: dict[int, tuple[int, int]] = {
    # v3 is the first with record format v2 (and Kafka 4.0's minimum). The range
    # holds 3 and 7, which librdkafka needs for format v2 and for zstd. v12 is
    # transactions V2 (KIP-890 part 2: the broker adds partitions to the transaction);
    # v13 (Kafka 4.1) names topics by id (an unknown id answers UNKNOWN_TOPIC_ID).
    ApiKey.PRODUCE: (3, 13),
    # v4 is the first with isolation_level and record format v2 (Kafka 4.0's
    # minimum; librdkafka needs 4 in range for format v2, 10 for zstd). v13+ names
    # topics by id (UNKNOWN_TOPIC_ID for an id the broker does not know; Java uses
    # v13+ only when every fetched topic has an id, else caps itself at v12), v15
    # replaces replica_id with replica_state, v16 answers NOT_LEADER_OR_FOLLOWER
    # with the leader and its endpoint (KIP-951), v17 adds the replica directory id
    # (inter-broker). v18 (a replica's high watermark) is not offered.
    ApiKey.FETCH: (4, 17),
    # v0 was removed in Kafka 4.0; v1 is the first with timestamps (KIP-79). v7 knows
    # MAX_TIMESTAMP (-3), v8 EARLIEST_LOCAL (-4), v9 LATEST_TIERED (-5), v10 a timeout
    # for remote storage (KIP-1075).
    ApiKey.LIST_OFFSETS: (1, 10),
    # v0-13 as Kafka 4.x; aiokafka still uses low versions. v12 looks topics up by id
    # (the Java admin client's describeTopics), v13 adds a top-level error code.
    ApiKey.METADATA: (0, 13),
    # v0 for aiokafka (it only speaks v0) and for the UNSUPPORTED_VERSION retry of
    # newer clients; v3+ carries the client software name and version (KIP-511).
    ApiKey.API_VERSIONS: (0, 4),
    ApiKey.CREATE_TOPICS: (2, 7),
    ApiKey.DELETE_TOPICS: (1, 6),
    ApiKey.DELETE_RECORDS: (0, 2),
    ApiKey.DESCRIBE_CONFIGS: (1, 4),
    ApiKey.CREATE_PARTITIONS: (0, 3),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: (0, 1),
    # Legacy replace-all AlterConfigs (kafka-python's alter_configs, older tools).
    ApiKey.ALTER_CONFIGS: (0, 2),
    # v0 was removed in Kafka 4.0 (KIP-896); v4 adds the filesystem's total/usable bytes.
    ApiKey.DESCRIBE_LOG_DIRS: (1, 4),
    ApiKey.ELECT_LEADERS: (0, 2),
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: (0, 0),
    ApiKey.LIST_PARTITION_REASSIGNMENTS: (0, 0),
    # KIP-966; the Java admin client (3.9+) describes topics with it when advertised.
    ApiKey.DESCRIBE_TOPIC_PARTITIONS: (0, 0),
    # v0 is Kafka 3.7's ListClientMetricsResources (client-metrics subscriptions only);
    # v1 (KIP-1142, Kafka 4.1) lists every config resource, filtered by type.
    ApiKey.LIST_CONFIG_RESOURCES: (0, 1),
    # v2: include_fenced_brokers / is_fenced (nodes taken down count as fenced).
    ApiKey.DESCRIBE_CLUSTER: (0, 2),
    # Advertised from the start: librdkafka enables lz4 only when FindCoordinator
    # is advertised (v0 must be in range for librdkafka < 2.11.1). v4 batches keys
    # (KIP-699); v5 (TRANSACTION_ABORTABLE) and v6 (share groups) are not needed yet.
    ApiKey.FIND_COORDINATOR: (0, 4),
    # Consumer groups (classic protocol). Ranges start at v0 (or kio's first version)
    # because aiokafka stops at JoinGroup v5, SyncGroup v3, Heartbeat v1, LeaveGroup v1,
    # OffsetCommit v3 and OffsetFetch v3, and librdkafka at JoinGroup v5, SyncGroup v3,
    # Heartbeat v3, LeaveGroup v1, OffsetCommit/OffsetFetch v9, FindCoordinator v2;
    # kafka-python 3 at JoinGroup v7, SyncGroup v5, OffsetCommit/OffsetFetch v8; the Java
    # 3.x/4.x client goes to the maximums below (OffsetCommit/OffsetFetch v10 name topics
    # by id, which the handlers resolve).
    ApiKey.JOIN_GROUP: (0, 9),
    ApiKey.SYNC_GROUP: (0, 5),
    ApiKey.HEARTBEAT: (0, 4),
    ApiKey.LEAVE_GROUP: (0, 5),
    ApiKey.OFFSET_COMMIT: (2, 10),   # kio has no v0/v1 (ZooKeeper-era, removed in Kafka 4)
    ApiKey.OFFSET_FETCH: (1, 10),    # kio has no v0 (ZooKeeper-era)
    ApiKey.DESCRIBE_GROUPS: (0, 6),
    ApiKey.LIST_GROUPS: (0, 5),
    ApiKey.DELETE_GROUPS: (0, 2),
    ApiKey.OFFSET_DELETE: (0, 0),
    # v0 must be in range: librdkafka turns its idempotent producer on only when
    # InitProducerId v0 is advertised (rdkafka_feature.c) and aiokafka sends only v0.
    # librdkafka 2.16 sends up to v4 (v3+ carries the current PID/epoch, KIP-360),
    # recent Java clients (3.8+, 4.x) v5, which only signals that the client
    # understands TRANSACTION_ABORTABLE (KIP-890), older ones v4; kafka-python 3.0
    # knows v0-6 and takes the highest both sides have. v6 (KIP-939 two-phase commit)
    # is not offered: nothing implements 2PC.
    ApiKey.INIT_PRODUCER_ID: (0, 6),
    # Transactions (issue 5) and transactions V2 (issue 16, KIP-890 part 2: EndTxn v5
    # answers the bumped epoch, TxnOffsetCommit v5 and Produce v12 have the broker add the
    # partition), which Java 4.x uses when the transaction.version feature is 2 (FEATURES
    # below). Clients send: librdkafka 2.16
    # AddPartitionsToTxn v0, AddOffsetsToTxn v0, EndTxn v0-1, TxnOffsetCommit v0-3;
    # kafka-python 3.0 AddPartitionsToTxn/AddOffsetsToTxn/EndTxn/TxnOffsetCommit v0-3;
    # aiokafka 0.14 v0 of each; Java 3.x/4.x AddPartitionsToTxn up to v3 (v4+ is
    # inter-broker: batched transactions, verify_only), AddOffsetsToTxn/EndTxn/
    # TxnOffsetCommit up to v4 (v4: TRANSACTION_ABORTABLE). The coordinator writes its
    # markers inside the broker; WriteTxnMarkers v1 (kio has no v0; v2 is transactions
    # V2) serves the admin's abortTransaction of a hanging transaction.
    ApiKey.ADD_PARTITIONS_TO_TXN: (0, 5),
    ApiKey.ADD_OFFSETS_TO_TXN: (0, 4),
    ApiKey.END_TXN: (0, 5),
    ApiKey.TXN_OFFSET_COMMIT: (0, 5),
    ApiKey.WRITE_TXN_MARKERS: (1, 1),
    # Admin APIs (Java AdminClient, kafka-transactions.sh, `onceflow txn`): ListTransactions
    # v1 adds the duration filter, v2 (Kafka 4.0) the transactional id pattern.
    ApiKey.DESCRIBE_PRODUCERS: (0, 0),
    ApiKey.DESCRIBE_TRANSACTIONS: (0, 0),
    ApiKey.LIST_TRANSACTIONS: (0, 2),
    # The consumer group protocol (KIP-848). ConsumerGroupHeartbeat v0: the coordinator
    # makes member ids (Java 3.7-3.9, preview); v1 (Kafka 4.0): the client makes them and
    # may subscribe with a regex - librdkafka 2.16 sends only v1. ConsumerGroupDescribe v1
    # adds the member type (KIP-1099).
    ApiKey.CONSUMER_GROUP_HEARTBEAT: (0, 1),
    # Security (issue 13). SaslHandshake v1 and SaslAuthenticate: tokens framed as
    # requests (KIP-152); after a v0 handshake the tokens come raw (size-prefixed, no
    # header), as Kafka 4 still accepts (security/sasl.py). v2 of
    # SaslAuthenticate carries the session lifetime (KIP-368). ACL APIs from v1 (prefixed
    # patterns, KIP-290; v0 is gone from Kafka 4); the SCRAM APIs have only v0.
    ApiKey.SASL_HANDSHAKE: (0, 1),
    ApiKey.SASL_AUTHENTICATE: (0, 2),
    ApiKey.DESCRIBE_ACLS: (1, 3),
    ApiKey.CREATE_ACLS: (1, 3),
    ApiKey.DELETE_ACLS: (1, 3),
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: (0, 0),
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: (0, 0),
    ApiKey.CONSUMER_GROUP_DESCRIBE: (0, 1),
    # Client quotas (issue 15, KIP-546): v1 is v0 with flexible versions.
    ApiKey.DESCRIBE_CLIENT_QUOTAS: (0, 1),
    ApiKey.ALTER_CLIENT_QUOTAS: (0, 1),
}


@dataclass(frozen=True, slots=True)
class Feature:
    """A feature flag of ApiVersions v3+ (KIP-584): the levels this broker supports, and
    the level it finalizes unless the broker's configuration says otherwise (`level_of`).
    Kafka leaves out finalized features at level 0."""

    name: str
    min_level: int
    max_level: int
    default_level: int


# The features clients act on. group.version 1 = the consumer group protocol is enabled
# (Kafka 4.0's default). transaction.version 2 = transactions V2 (KIP-890 part 2): a Java
# 4.x producer then sends Produce v12, TxnOffsetCommit v5 and EndTxn v5 and bumps its epoch
# per transaction; finalized at 1 by default (`--transaction-version 2` raises it), see
# docs/transactions.md. metadata.version (Kafka's MetadataVersion feature levels) is what
# admin tools show as the cluster's version: 22 = 4.0-IV0 (the consumer group protocol's
# bootstrap level, what onceflow implements); 24 = 4.0-IV2, the level Kafka requires for
# transaction.version 2, finalized when that is on (BrokerConfig.feature_levels). 23
# (4.0-IV1, eligible leader replicas) has nothing a client can tell apart here; 25
# (4.0-IV3, async remote ListOffsets) is not offered. 7 (3.3-IV3) is Kafka 4.0's minimum.
FEATURES: tuple[Feature, ...] = (
    Feature("metadata.version", 7, 24, 22),
    Feature("group.version", 0, 1, 1),
    Feature("transaction.version", 0, 2, 1),
)


def is_supported(api_key: int, api_version: int) -> bool:
    """True when the broker advertises `api_version` of `api_key`."""
    version_range = SUPPORTED.get(api_key)
    return version_range is not None and version_range[0] <= api_version <= version_range[1]
