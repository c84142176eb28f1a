"""Metadata and DescribeCluster: brokers, controller, topics and their leaders.

Unknown topics named in a Metadata request are created when the broker allows it
(`auto.create.topics.enable`) and the client asks for it, as Kafka does; internal
topics are never auto-created.
"""

from __future__ import annotations

import uuid
import weakref

from kio.schema.errors import ErrorCode

from onceflow.broker.handlers import ApiKey, RequestContext, handles
from onceflow.broker.handlers.operations import authorized_operations, cluster_operations
from onceflow.broker.handlers.topics import create_topic
from onceflow.broker.state import INTERNAL_TOPICS, BrokerState, replication_factor, topic_name_error
from onceflow.security.acl import Operation, ResourceType
from onceflow.storage.store import TopicInfo

# Kafka's sentinel for "authorized operations not requested".
AUTHORIZED_OPERATIONS_OMITTED = -(2**31)
_ZERO_ID = uuid.UUID(int=0)


def brokers(state: BrokerState, listener: str | None = None) -> list[dict]:
    """Live nodes with their addresses on `listener` (None: the first listener's)."""
    nodes = state.cluster.live_nodes()
    return [{"node_id": n.node_id, "host": h, "port": p, "rack": None}
            for n, (h, p) in zip(nodes, (n.endpoint(listener) for n in nodes))]


def _partition(state: BrokerState, info: TopicInfo, index: int) -> dict:
    replicas = state.cluster.replicas(info.name, index, replication_factor(info))
    live = [r for r in replicas if state.cluster.nodes[r].up]
    return {
        "error_code": ErrorCode.none,
        "partition_index": index,
        "leader_id": state.leader(info, index),
        "leader_epoch": state.cluster.leader_epoch,
        "replica_nodes": replicas,
        "isr_nodes": live or [state.leader(info, index)],
        "offline_replicas": [r for r in replicas if r not in live],
    }


def _topic(state: BrokerState, info: TopicInfo) -> dict:
    return {
        "error_code": ErrorCode.none,
        "name": info.name,
        "topic_id": info.topic_id,
        "is_internal": info.name in INTERNAL_TOPICS,
        "partitions": _partitions(state, info),
        "topic_authorized_operations": AUTHORIZED_OPERATIONS_OMITTED,
    }


# Per broker state: topic name -> (layout, its partition dicts). An answer for every topic
# lists every partition; building 10,000 partition dicts per request cost about as much as
# encoding them, and the garbage collector's full passes grew with them (issue 19). The
# layout is everything a partition dict is computed from: the topic (a new id when it is
# created again), its partition count and replication factor, and the cluster's leadership
# (leader_epoch moves with every reassignment and node up or down; the up flags as well).
# The dicts are shared by answers and never changed; a changed layout builds new ones.
_PARTITIONS: weakref.WeakKeyDictionary[BrokerState, dict[str, tuple[tuple, list[dict]]]] = (
    weakref.WeakKeyDictionary())


def _partitions(state: BrokerState, info: TopicInfo) -> list[dict]:
    cluster = state.cluster
    layout = (info.topic_id, info.num_partitions, replication_factor(info), cluster.leader_epoch,
              tuple(node.up for node in cluster.nodes))
    cache = _PARTITIONS.get(state)
    if cache is None:
        cache = _PARTITIONS[state] = {}
    found = cache.get(info.name)
    if found is not None and found[0] == layout:
        return found[1]
    partitions = [_partition(state, info, i) for i in range(info.num_partitions)]
    cache[info.name] = (layout, partitions)
    return partitions


def _forget_deleted(state: BrokerState, listed: dict[str, TopicInfo]) -> None:
    """After an answer for every topic: drop the cached partitions of deleted topics."""
    cache = _PARTITIONS.get(state)
    if cache is not None and len(cache) > len(listed):
        for name in [name for name in cache if name not in listed]:
            del cache[name]


def _missing(name: str | None, topic_id, error: ErrorCode) -> dict:
    return {"error_code": error, "name": name, "topic_id": topic_id, "partitions": []}


def _lookup(ctx: RequestContext, requested, allow_create: bool) -> dict:
    state = ctx.broker
    name = getattr(requested, "name", None)
    topic_id = getattr(requested, "topic_id", None)
    if topic_id is not None and topic_id != _ZERO_ID:
        info = state.topic_by_id(topic_id)
        if info is not None and not ctx.authorized(Operation.DESCRIBE, ResourceType.TOPIC,
                                                   info.name):
            return _missing(None, topic_id, ErrorCode.topic_authorization_failed)
        return _topic(state, info) if info else _missing(None, topic_id, ErrorCode.unknown_topic_id)
    if topic_name_error(name):
        return _missing(name, None, ErrorCode.invalid_topic_exception)
    if not ctx.authorized(Operation.DESCRIBE, ResourceType.TOPIC, name):
        return _missing(name, None, ErrorCode.topic_authorization_failed)
    info = state.topic(name)
    if info is None and allow_create and name not in INTERNAL_TOPICS:
        if not (ctx.authorized_cluster(Operation.CREATE)
                or ctx.authorized(Operation.CREATE, ResourceType.TOPIC, name)):
            return _missing(name, None, ErrorCode.topic_authorization_failed)
        create_topic(state, name, -1, -1, {}, ctx.now_ms())
        info = state.topic(name)
    if info is None:
        return _missing(name, None, ErrorCode.unknown_topic_or_partition)
    return _topic(state, info)


@handles(ApiKey.METADATA)
async def metadata(ctx: RequestContext, body) -> dict:
    state = ctx.broker
    requested = body.topics
    if requested is None or (ctx.api_version == 0 and not requested):
        listed = state.topics()
        topics = [_topic(state, info) for info in listed.values()
                  if ctx.authorized(Operation.DESCRIBE, ResourceType.TOPIC, info.name)]
        _forget_deleted(state, listed)
    else:
        allow = state.config.auto_create_topics and getattr(body, "allow_auto_topic_creation", True)
        topics = [_lookup(ctx, t, allow) for t in requested]
    if getattr(body, "include_topic_authorized_operations", False):  # v8+ (issue 15)
        topics = [{**t, "topic_authorized_operations": authorized_operations(
            ctx, ResourceType.TOPIC, t["name"])} if t["error_code"] == ErrorCode.none else t
            for t in topics]
    return {
        "throttle_time": 0,
        "error_code": ErrorCode.none,
        "brokers": brokers(state, ctx.listener),
        "cluster_id": state.config.cluster_id,
        "controller_id": state.cluster.controller_id,
        "topics": topics,
        "cluster_authorized_operations": (
            cluster_operations(ctx)
            if getattr(body, "include_cluster_authorized_operations", False)  # v8-10
            else AUTHORIZED_OPERATIONS_OMITTED),
    }


def _fenced(state: BrokerState, listener: str | None, include: bool) -> list[dict]:
    """DescribeCluster v2 with include_fenced_brokers: nodes taken down (fault injection)
    are reported as Kafka reports fenced brokers."""
    if not include:
        return []
    return [{"broker_id": n.node_id, "host": n.endpoint(listener)[0],
             "port": n.endpoint(listener)[1], "rack": None, "is_fenced": True}
            for n in state.cluster.nodes if not n.up]


@handles(ApiKey.DESCRIBE_CLUSTER)
async def describe_cluster(ctx: RequestContext, body) -> dict:
    state = ctx.broker
    return {
        "throttle_time": 0,
        "error_code": ErrorCode.none,
        "cluster_id": state.config.cluster_id,
        "controller_id": state.cluster.controller_id,
        "brokers": [
            {"broker_id": b["node_id"], "host": b["host"], "port": b["port"], "rack": None,
             "is_fenced": False}
            for b in brokers(state, ctx.listener)
        ] + _fenced(state, ctx.listener, getattr(body, "include_fenced_brokers", False)),
        "cluster_authorized_operations": (
            cluster_operations(ctx) if body.include_cluster_authorized_operations
            else AUTHORIZED_OPERATIONS_OMITTED),
    }
