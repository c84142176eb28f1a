"""DescribeLogDirs and ElectLeaders: the admin views of where partitions live and who leads.

Every partition lives in the broker's one log directory (`log.dirs`, the data dir); sizes are
the bytes of the partition's segments on disk, offset_lag is 0 and is_future false (there is
no replica movement between directories). total/usable bytes are those of the directory's
filesystem. With `nodes=N` each node reports the partitions it holds a replica of.

ElectLeaders: the leader of a partition is its first live replica (broker/cluster.py), so a
preferred leader that is up already leads (ELECTION_NOT_NEEDED) and one that is down cannot
(PREFERRED_LEADER_NOT_AVAILABLE); an unclean election is never needed as long as a node is
live. As in Kafka, asking for all partitions (null) lists only those an election changed:
none.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from kio.schema.errors import ErrorCode

from onceflow.broker.handlers import ApiKey, RequestContext, handles
from onceflow.broker.state import replication_factor
from onceflow.security.acl import Operation

ELECTION_PREFERRED, ELECTION_UNCLEAN = 0, 1
_MESSAGES = {
    ErrorCode.election_not_needed: "Leader election not needed for topic partition.",
    ErrorCode.preferred_leader_not_available: "The preferred leader was not available.",
    ErrorCode.cluster_authorization_failed: "Cluster authorization failed.",
}


def _wanted(ctx: RequestContext, topics) -> dict[str, list[int]]:
    """Topic -> partitions to describe on this node (all when `topics` is null)."""
    state = ctx.broker
    held = {}
    for name, info in state.topics().items():
        rf = replication_factor(info)
        held[name] = [i for i in range(info.num_partitions)
                      if ctx.node_id in state.cluster.replicas(name, i, rf)]
    if topics is None:
        return {name: parts for name, parts in held.items() if parts}
    wanted: dict[str, list[int]] = {}
    for topic in topics:
        parts = [p for p in topic.partitions if p in held.get(topic.topic, ())]
        if parts:
            wanted.setdefault(topic.topic, []).extend(p for p in parts
                                                      if p not in wanted.get(topic.topic, ()))
    return wanted


@handles(ApiKey.DESCRIBE_LOG_DIRS)
async def describe_log_dirs(ctx: RequestContext, body) -> dict:
    if not ctx.authorized_cluster(Operation.DESCRIBE):
        return {"throttle_time": 0, "error_code": ErrorCode.cluster_authorization_failed,
                "results": []}
    log_dir = str(Path(ctx.broker.config.data_dir).resolve())
    topics = []
    for name, parts in _wanted(ctx, body.topics).items():
        partitions = []
        for index in parts:
            partition = ctx.broker.partition(name, index)
            if partition is not None:
                partitions.append({"partition_index": index,
                                   "partition_size": partition.log.size_bytes,
                                   "offset_lag": 0, "is_future_key": False})
        topics.append({"name": name, "partitions": partitions})
    usage = shutil.disk_usage(log_dir)
    result = {"error_code": ErrorCode.none, "log_dir": log_dir, "topics": topics,
              "total_bytes": usage.total, "usable_bytes": usage.free}
    return {"throttle_time": 0, "error_code": ErrorCode.none, "results": [result]}


def _elect_one(ctx: RequestContext, topic: str, index: int, election_type: int) -> ErrorCode:
    info = ctx.broker.topic(topic)
    if info is None or not 0 <= index < info.num_partitions:
        return ErrorCode.unknown_topic_or_partition
    if election_type == ELECTION_UNCLEAN:
        return ErrorCode.election_not_needed  # the first live node always leads
    preferred = ctx.broker.cluster.replicas(topic, index, replication_factor(info))[0]
    if ctx.broker.leader(info, index) == preferred:
        return ErrorCode.election_not_needed
    return ErrorCode.preferred_leader_not_available


def _result(index: int, code: ErrorCode, topic: str) -> dict:
    message = _MESSAGES.get(code)
    if code == ErrorCode.unknown_topic_or_partition:
        message = f"No such partition as {topic}-{index}"
    return {"partition_id": index, "error_code": code, "error_message": message}


@handles(ApiKey.ELECT_LEADERS)
async def elect_leaders(ctx: RequestContext, body) -> dict:
    election_type = getattr(body, "election_type", ELECTION_PREFERRED)
    denied = not ctx.authorized_cluster(Operation.ALTER)
    if election_type not in (ELECTION_PREFERRED, ELECTION_UNCLEAN) and not denied:
        return {"throttle_time": 0, "error_code": ErrorCode.invalid_request,
                "replica_election_results": []}
    results = []
    if body.topic_partitions is None:
        if denied:
            return {"throttle_time": 0, "error_code": ErrorCode.cluster_authorization_failed,
                    "replica_election_results": []}
        # Every partition already has the leader an election would give it: none listed.
        results = [{"topic": name, "partition_result": []} for name in ctx.broker.topics()]
    else:
        for topic in body.topic_partitions:
            partitions = []
            for index in topic.partitions:
                code = (ErrorCode.cluster_authorization_failed if denied
                        else _elect_one(ctx, topic.topic, index, election_type))
                partitions.append(_result(index, code, topic.topic))
            results.append({"topic": topic.topic, "partition_result": partitions})
    top = ErrorCode.cluster_authorization_failed if denied else ErrorCode.none
    return {"throttle_time": 0, "error_code": top, "replica_election_results": results}
