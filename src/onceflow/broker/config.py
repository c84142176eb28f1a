"""Broker settings, with Kafka's names and defaults where Kafka has the setting."""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path

from onceflow.security.listeners import Listener, parse_advertised, parse_listeners
from onceflow.storage.checkpoint import RECOVERY_CHECKPOINT_INTERVAL_MS

# socket.request.max.bytes: the largest frame a peer may send. Checked before the
# body is read, so a hostile length prefix costs nothing.
FRAME_BYTES_MAX = 100 * 1024 * 1024

# How many requests of one connection may be in the broker at once (decoded, not
# yet answered). Kafka mutes a connection after one; we let a few overlap so one
# producer's fsync waits are shared (group commit), while appends keep their order.
CONNECTION_REQUESTS_IN_FLIGHT_MAX = 8

# Fetch long polls wait at most this long whatever the client asks (max_wait_ms
# comes from the peer, so it is bounded too).
FETCH_WAIT_MS_MAX = 30_000


@dataclasses.dataclass(frozen=True, slots=True)
class BrokerConfig:
    data_dir: Path
    host: str = "127.0.0.1"                 # bind address
    port: int = 9092                        # first node's port; 0 = pick free ports
    advertised_host: str | None = None      # advertised.listeners host (default: host)
    advertised_port: int | None = None      # first node's advertised port (default: port)
    nodes: int = 1                          # node ids 0..nodes-1 on consecutive ports
    cluster_id: str = "onceflow-cluster"
    # Durability: with fsync on, an acks=all produce is answered only after its bytes
    # are on disk (group-committed). Off: answered after the write to the page cache,
    # which survives a process crash but not a power loss.
    fsync: bool = True
    frame_bytes_max: int = FRAME_BYTES_MAX
    auto_create_topics: bool = True         # auto.create.topics.enable
    num_partitions: int = 1                 # num.partitions (auto-created topics)
    default_replication_factor: int = 1     # default.replication.factor
    message_max_bytes: int = 1_048_588      # message.max.bytes (topic default)
    retention_check_interval_ms: int = 300_000  # log.retention.check.interval.ms
    # log.flush.offset.checkpoint.interval.ms: how often every log's recovery point goes to
    # the recovery checkpoint (storage/checkpoint.py), bounding what a crash re-validates.
    recovery_checkpoint_interval_ms: int = RECOVERY_CHECKPOINT_INTERVAL_MS
    # The log cleaner of compacted user topics (issue 14), Kafka's names and defaults:
    log_cleaner_enable: bool = True                      # log.cleaner.enable
    log_cleaner_backoff_ms: int = 15_000                 # log.cleaner.backoff.ms
    log_cleaner_dedupe_buffer_size: int = 134_217_728    # log.cleaner.dedupe.buffer.size
    # log.cleaner.io.max.bytes.per.second (Kafka: Double.MAX_VALUE, no limit)
    log_cleaner_io_max_bytes_per_second: float = float("inf")
    # Topic config defaults from the broker's log.* keys (log.retention.hours=1 gives
    # ("retention.ms", "3600000")), under every topic's own configs; see config_file.py.
    log_defaults: tuple[tuple[str, str], ...] = ()
    # log.max.open.files: onceflow's own key (Kafka keeps every segment open): at most this
    # many segment files open at once; idle ones are closed and reopened on use.
    log_max_open_files: int = 1000
    static_keys: frozenset[str] = frozenset()  # Kafka keys set by --config (DescribeConfigs)
    fetch_session_cache_slots: int = 1000   # max.incremental.fetch.session.cache.slots
    producer_id_expiration_ms: int = 86_400_000  # producer.id.expiration.ms (1 day)
    producer_id_expiration_check_interval_ms: int = 600_000  # producer.id.expiration.check.interval.ms
    # Opt-in HTTP admin endpoint (fault injection, Prometheus /metrics); None = off, 0 = any port.
    admin_port: int | None = None
    # Consumer groups (issue 4): Kafka's names and defaults; tests shrink them.
    offsets_topic_num_partitions: int = 50               # offsets.topic.num.partitions
    offsets_topic_segment_bytes: int = 104_857_600       # offsets.topic.segment.bytes
    group_initial_rebalance_delay_ms: int = 3_000        # group.initial.rebalance.delay.ms
    # onceflow's own (issue 15): create __consumer_offsets and __transaction_state in the
    # background right after start, so the first group or transaction does not wait for
    # their partitions; False creates them on first use (FindCoordinator), as Kafka does.
    internal_topics_at_start: bool = True
    group_min_session_timeout_ms: int = 6_000            # group.min.session.timeout.ms
    group_max_session_timeout_ms: int = 1_800_000        # group.max.session.timeout.ms
    offsets_retention_ms: int = 7 * 24 * 3_600_000       # offsets.retention.minutes
    offsets_compaction_interval_ms: int = 15_000         # log.cleaner.backoff.ms
    # Transactions (issue 5): Kafka's names and defaults; tests shrink them.
    transaction_state_num_partitions: int = 50           # transaction.state.log.num.partitions
    transaction_state_segment_bytes: int = 104_857_600   # transaction.state.log.segment.bytes
    transaction_max_timeout_ms: int = 900_000            # transaction.max.timeout.ms
    # transaction.two.phase.commit.enable (KIP-939): InitProducerId with enable2Pc allowed
    transaction_two_phase_commit_enable: bool = False
    transactional_id_expiration_ms: int = 7 * 24 * 3_600_000  # transactional.id.expiration.ms
    # transaction.abort.timed.out.transaction.cleanup.interval.ms
    transaction_abort_timed_out_cleanup_interval_ms: int = 10_000
    # transaction.remove.expired.transaction.cleanup.interval.ms
    transaction_remove_expired_cleanup_interval_ms: int = 3_600_000
    # The finalized transaction.version feature (ApiVersions): 2 tells Java 4.x producers
    # to use transactions V2 (KIP-890 part 2). The broker speaks V2 to any client that
    # sends its requests either way; see docs/transactions.md.
    transaction_version: int = 1
    # Client quotas (issue 15): the rate window, Kafka's names and defaults.
    quota_window_num: int = 11                           # quota.window.num
    quota_window_size_seconds: int = 1                   # quota.window.size.seconds
    # Consumer groups of the consumer group protocol (issue 16, KIP-848), Kafka's names:
    consumer_group_session_timeout_ms: int = 45_000      # group.consumer.session.timeout.ms
    consumer_group_heartbeat_interval_ms: int = 5_000    # group.consumer.heartbeat.interval.ms
    # The bounds of a group's own consumer.session.timeout.ms / consumer.heartbeat.interval.ms
    # (GROUP config resources), Kafka's names and defaults:
    consumer_group_min_session_timeout_ms: int = 45_000   # group.consumer.min.session.timeout.ms
    consumer_group_max_session_timeout_ms: int = 60_000   # group.consumer.max.session.timeout.ms
    consumer_group_min_heartbeat_interval_ms: int = 5_000  # group.consumer.min.heartbeat.interval.ms
    consumer_group_max_heartbeat_interval_ms: int = 15_000  # group.consumer.max.heartbeat.interval.ms
    consumer_group_assignors: tuple[str, ...] = ("uniform", "range")  # group.consumer.assignors
    consumer_group_migration_policy: str = "bidirectional"  # group.consumer.migration.policy
    # least time between two resolutions of a group's regexes (Kafka: 10 s, a constant)
    consumer_group_regex_refresh_interval_ms: int = 10_000

    # Security (issue 13), Kafka's names. listeners: None = one PLAINTEXT listener on
    # host:port (the `--port` shorthand).
    listeners: str | None = None                         # listeners
    listener_security_protocol_map: str | None = None    # listener.security.protocol.map
    advertised_listeners: str | None = None              # advertised.listeners
    ssl_certfile: Path | None = None                     # ssl.keystore.location (PEM)
    ssl_keyfile: Path | None = None                      # its private key (PEM)
    ssl_cafile: Path | None = None                       # ssl.truststore.location (PEM)
    ssl_client_auth: str = "none"                        # ssl.client.auth
    ssl_principal_mapping_rules: str = "DEFAULT"         # ssl.principal.mapping.rules
    # connections.max.reauth.ms: 0 = no re-authentication (KIP-368), Kafka's default.
    connections_max_reauth_ms: int = 0
    sasl_mechanisms: tuple[str, ...] = ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN")  # sasl.enabled.mechanisms
    add_scram: tuple[str, ...] = ()                      # kafka-storage --add-scram values
    authorizer: bool = False                             # authorizer.class.name set
    super_users: tuple[str, ...] = ()                    # super.users
    allow_everyone_if_no_acl_found: bool = False         # allow.everyone.if.no.acl.found
    admin_token: str | None = None   # the admin port wants `Authorization: Bearer <token>`
    admin_tls: bool = False          # the admin port speaks HTTPS (the listeners' certificate)
    # connection.failed.authentication.delay.ms: a failed login is answered this late.
    connection_failed_authentication_delay_ms: int = 100
    # A SASL connection not logged in within this long is closed (no Kafka setting of this
    # name; Kafka's connections.max.idle.ms bounds idle connections).
    sasl_authentication_timeout_ms: int = 30_000
    # Connection limits (issue 19), Kafka's names and defaults (Integer.MAX_VALUE: none);
    # read at accept time through connection_quotas.connection_limits.
    max_connections: int = 2**31 - 1                     # max.connections
    max_connections_per_ip: int = 2**31 - 1              # max.connections.per.ip
    max_connections_per_ip_overrides: str = ""           # max.connections.per.ip.overrides

    def listener_list(self) -> tuple[Listener, ...]:
        """The configured listeners (parsed; raises ListenerError on bad syntax)."""
        if self.listeners is None:
            return (Listener("PLAINTEXT", "PLAINTEXT", self.host, self.port),)
        return parse_listeners(self.listeners, self.listener_security_protocol_map)

    def advertised_endpoint(self, listener: Listener, node_id: int,
                            bound_port: int) -> tuple[str, int]:
        """The host and port clients of `listener` are told to use for `node_id`."""
        advertised = parse_advertised(self.advertised_listeners, self.listener_list())
        if listener.name in advertised:
            host, port = advertised[listener.name]
            return (host or "127.0.0.1"), (port + node_id if port else bound_port)
        if self.listeners is None:
            return self.advertised(node_id, bound_port)
        host = listener.host
        return ("127.0.0.1" if host in ("0.0.0.0", "::", "") else host), bound_port

    def feature_levels(self) -> dict[str, int]:
        """Finalized feature levels that differ from protocol.apis.FEATURES' defaults."""
        # Kafka requires metadata.version 4.0-IV2 (24) for transaction.version 2.
        return {"transaction.version": self.transaction_version,
                "metadata.version": 24 if self.transaction_version >= 2 else 22}

    def advertised(self, node_id: int, bound_port: int) -> tuple[str, int]:
        """The host and port clients are told to use for `node_id`."""
        host = self.advertised_host or self.host
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        if self.advertised_port is not None:
            return host, self.advertised_port + node_id
        return host, bound_port


def new_cluster_id() -> str:
    return str(uuid.uuid4())
