"""One line of documentation per config key, for DescribeConfigs' `documentation` (v3+,
include_documentation). The meaning is Kafka's; the words are onceflow's own. A broker
log.* key that defaults a topic config is documented from that topic config."""

from __future__ import annotations

from onceflow.broker.config_file import LOG_DEFAULT_KEYS

TOPIC_DOCS = {
    "cleanup.policy": "How old segments are cleaned: delete (by retention), compact (keep the "
                      "latest record per key) or both.",
    "compression.gzip.level": "Level used when the broker compresses with gzip.",
    "compression.lz4.level": "Level used when the broker compresses with lz4.",
    "compression.type": "Compression of stored batches; producer keeps what the producer sent.",
    "compression.zstd.level": "Level used when the broker compresses with zstd.",
    "delete.retention.ms": "How long tombstones and transaction markers stay in a compacted log.",
    "file.delete.delay.ms": "Wait before a deleted segment's files are removed from disk.",
    "flush.messages": "Records written between forced fsyncs of the log.",
    "flush.ms": "Time between forced fsyncs of the log.",
    "follower.replication.throttled.replicas": "Replicas whose follower fetches are throttled.",
    "index.interval.bytes": "Bytes between two offset index entries.",
    "leader.replication.throttled.replicas": "Replicas whose leader side is throttled.",
    "local.retention.bytes": "Size kept on local disk when tiered storage is on (-2: "
                             "retention.bytes).",
    "local.retention.ms": "Time kept on local disk when tiered storage is on (-2: retention.ms).",
    "max.compaction.lag.ms": "Longest a record may stay uncompacted.",
    "max.message.bytes": "Largest record batch the topic accepts.",
    "message.downconversion.enable": "Whether old fetch versions get down-converted batches.",
    "message.timestamp.after.max.ms": "How far in the future a record's timestamp may be.",
    "message.timestamp.before.max.ms": "How far in the past a record's timestamp may be.",
    "message.timestamp.type": "CreateTime (the producer's) or LogAppendTime (the broker's).",
    "min.cleanable.dirty.ratio": "Share of uncompacted bytes that makes a log worth compacting.",
    "min.compaction.lag.ms": "Shortest time a record stays uncompacted.",
    "min.insync.replicas": "Replicas that must have a write for acks=all to succeed.",
    "preallocate": "Whether segment files are preallocated on disk.",
    "remote.log.copy.disable": "Stop copying segments to tiered storage.",
    "remote.log.delete.on.disable": "Delete tiered segments when tiered storage is turned off.",
    "remote.storage.enable": "Whether the topic uses tiered storage.",
    "retention.bytes": "Size a partition may grow to before old segments go (-1: no limit).",
    "retention.ms": "Age after which old segments go (-1: no limit).",
    "segment.bytes": "Size at which a new log segment is started.",
    "segment.index.bytes": "Size of a segment's offset and time indexes.",
    "segment.jitter.ms": "Random delay added to segment.ms so segments do not roll together.",
    "segment.ms": "Age at which a new log segment is started even when not full.",
    "unclean.leader.election.enable": "Whether an out-of-sync replica may become leader.",
}

_BROKER_OWN_DOCS = {
    "broker.id": "This node's id.",
    "node.id": "This node's id (KRaft's name for broker.id).",
    "process.roles": "The roles this node plays: broker (onceflow keeps its own metadata).",
    "listeners": "The addresses this node listens on, as NAME://host:port, comma-separated.",
    "advertised.listeners": "The addresses Metadata gives clients for this node, per listener.",
    "listener.security.protocol.map": "Each listener's security protocol, as NAME:PROTOCOL.",
    "log.dirs": "The directory holding this node's logs and metadata.",
    "num.partitions": "Partitions of an automatically created topic.",
    "default.replication.factor": "Replication factor of an automatically created topic.",
    "auto.create.topics.enable": "Create a topic when a client first uses it.",
    "socket.request.max.bytes": "Largest request a client may send.",
    "log.retention.check.interval.ms": "Time between two retention passes over every log.",
    "log.flush.offset.checkpoint.interval.ms": "Time between two writes of every log's "
                                               "recovery point to the recovery checkpoint.",
    "quota.window.num": "Samples kept to measure a client's rate.",
    "quota.window.size.seconds": "Length of one quota sample.",
    "log.cleaner.enable": "Run the log cleaner that compacts logs.",
    "log.max.open.files": "Segment files kept open at once (onceflow's own).",
    "log.cleaner.backoff.ms": "Sleep of the log cleaner when nothing is to be cleaned.",
    "log.cleaner.dedupe.buffer.size": "Memory for the cleaner's key map.",
    "log.cleaner.io.max.bytes.per.second": "I/O rate limit of the log cleaner.",
    "max.incremental.fetch.session.cache.slots": "Incremental fetch sessions kept at once.",
    "producer.id.expiration.ms": "Idle time after which a producer id's state is dropped.",
    "producer.id.expiration.check.interval.ms": "Time between checks for idle producer ids.",
    "offsets.topic.num.partitions": "Partitions of __consumer_offsets.",
    "offsets.topic.segment.bytes": "Segment size of __consumer_offsets.",
    "group.initial.rebalance.delay.ms": "Wait for more members before a new classic group's "
                                        "first rebalance.",
    "group.min.session.timeout.ms": "Shortest session timeout a classic group member may ask.",
    "group.max.session.timeout.ms": "Longest session timeout a classic group member may ask.",
    "transaction.state.log.num.partitions": "Partitions of __transaction_state.",
    "transaction.state.log.segment.bytes": "Segment size of __transaction_state.",
    "transaction.max.timeout.ms": "Longest transaction timeout a producer may ask.",
    "transaction.two.phase.commit.enable": "Allow two-phase commit transactions (KIP-939).",
    "transactional.id.expiration.ms": "Idle time after which a transactional id is forgotten.",
    "group.consumer.session.timeout.ms": "Session timeout of consumer group (KIP-848) members.",
    "group.consumer.heartbeat.interval.ms": "Heartbeat interval of consumer group members.",
    "group.consumer.min.session.timeout.ms": "Lowest consumer.session.timeout.ms of a group.",
    "group.consumer.max.session.timeout.ms": "Highest consumer.session.timeout.ms of a group.",
    "group.consumer.min.heartbeat.interval.ms": "Lowest consumer.heartbeat.interval.ms of a "
                                                "group.",
    "group.consumer.max.heartbeat.interval.ms": "Highest consumer.heartbeat.interval.ms of a "
                                                "group.",
    "max.connections": "Connections the broker accepts at once.",
    "max.connections.per.ip": "Connections the broker accepts at once from one address.",
    "max.connections.per.ip.overrides": "Per-address exceptions to max.connections.per.ip, as host:count,host:count.",
}

_UNIT_NAMES = {60_000: "minutes", 3_600_000: "hours"}


def _log_default_doc(key: str) -> str:
    topic_key, unit = LOG_DEFAULT_KEYS[key]
    unit_text = f" (in {_UNIT_NAMES[unit]})" if unit in _UNIT_NAMES else ""
    return f"Default of {topic_key} for topics without their own{unit_text}: " + \
        TOPIC_DOCS[topic_key][0].lower() + TOPIC_DOCS[topic_key][1:]


BROKER_DOCS = {key: _log_default_doc(key) for key in LOG_DEFAULT_KEYS} | _BROKER_OWN_DOCS

GROUP_DOCS = {
    "consumer.session.timeout.ms": "This group's member session timeout (overrides "
                                   "group.consumer.session.timeout.ms).",
    "consumer.heartbeat.interval.ms": "This group's heartbeat interval (overrides "
                                      "group.consumer.heartbeat.interval.ms).",
}

CLIENT_METRICS_DOCS = {
    "metrics": "Metric name prefixes the matching clients are asked to push (* for all).",
    "interval.ms": "How often the matching clients push their metrics.",
    "match": "Client selectors, name=regex (client_id, client_software_name ...).",
}
