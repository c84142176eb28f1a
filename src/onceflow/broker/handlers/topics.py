"""CreateTopics, DeleteTopics, CreatePartitions.

Validation follows Kafka: invalid names -> INVALID_TOPIC_EXCEPTION, existing ->
TOPIC_ALREADY_EXISTS, partitions < 1 -> INVALID_PARTITIONS, a replication factor
above the number of nodes -> INVALID_REPLICATION_FACTOR, bad configs ->
INVALID_CONFIG. `validate_only` checks everything and creates nothing.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from onceflow.broker.handlers import ApiKey, RequestContext, handles
from onceflow.broker.handlers.configs import describe_topic_configs, layers_of, topic_config_error
from onceflow.broker.state import INTERNAL_TOPICS, BrokerState, replication_factor, topic_name_error
from onceflow.security.acl import Operation, ResourceType
from onceflow.storage.layout import LogFailedError
from onceflow.storage.store import TopicInfo

# A bound on what a peer can make us allocate: Kafka has no hard limit, but each
# partition is a directory with open files here.
PARTITIONS_PER_TOPIC_MAX = 10_000


# What CreateTopics v5+ reports of each config (a subset of DescribeConfigs' entry).
_CREATED_CONFIG_FIELDS = ("name", "value", "read_only", "config_source", "is_sensitive")


class TopicError(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _check_new_topic(state: BrokerState, name, partitions: int, rf: int, configs) -> None:
    if reason := topic_name_error(name):
        raise TopicError(ErrorCode.invalid_topic_exception, reason)
    if state.topic(name) is not None:
        raise TopicError(ErrorCode.topic_already_exists, f"Topic '{name}' already exists.")
    if not 1 <= partitions <= PARTITIONS_PER_TOPIC_MAX:
        raise TopicError(ErrorCode.invalid_partitions, f"Number of partitions must be in [1, {PARTITIONS_PER_TOPIC_MAX}].")
    nodes = len(state.cluster.nodes)
    if rf < 1 or rf > nodes:
        raise TopicError(
            ErrorCode.invalid_replication_factor,
            f"Replication factor: {rf} larger than available brokers: {nodes}." if rf > nodes
            else "Replication factor must be larger than 0.",
        )
    if reason := topic_config_error(configs):
        raise TopicError(ErrorCode.invalid_config, reason)


def create_topic(
    state: BrokerState, name, partitions: int, rf: int, configs: dict[str, str], now_ms: int,
    validate_only: bool = False,
) -> TopicInfo | None:
    """Create a topic (-1 = broker default for partitions and replication factor)."""
    partitions = state.config.num_partitions if partitions == -1 else partitions
    rf = state.config.default_replication_factor if rf == -1 else rf
    _check_new_topic(state, name, partitions, rf, configs)
    if validate_only:
        return None
    try:
        return state.store.create_topic(name, partitions, configs, replication_factor=rf)
    except (OSError, LogFailedError) as exc:  # EMFILE, ENOSPC ...: not a closed socket
        reason = exc.strerror if isinstance(exc, OSError) else "storage error"
        raise TopicError(ErrorCode.kafka_storage_error,
                         f"Creating the logs of '{name}' failed: {reason}") from exc


def _manual_assignment(state: BrokerState, topic) -> dict[int, list[int]]:
    """CreateTopics' explicit replicas per partition, checked as Kafka's controller does
    (raises TopicError)."""
    if topic.replication_factor != -1:
        raise TopicError(ErrorCode.invalid_request, "A manual partition assignment was "
                         "specified, but replication factor was not set to -1.")
    if topic.num_partitions != -1:
        raise TopicError(ErrorCode.invalid_request, "A manual partition assignment was "
                         "specified, but numPartitions was not set to -1.")
    assigned: dict[int, list[int]] = {}
    rf = None
    for assignment in topic.assignments:
        index = assignment.partition_index
        if index in assigned:
            raise TopicError(ErrorCode.invalid_replica_assignment,
                             f"Found multiple manual partition assignments for partition {index}")
        replicas = [int(r) for r in assignment.broker_ids]
        if problem := state.cluster.assignment_error(replicas, rf):
            raise TopicError(ErrorCode.invalid_replica_assignment, problem)
        rf = len(replicas)
        assigned[index] = replicas
    if sorted(assigned) != list(range(len(assigned))):
        raise TopicError(ErrorCode.invalid_replica_assignment,
                         "partitions should be a consecutive 0-based integer sequence")
    return assigned


def _create_one(ctx: RequestContext, topic, validate_only: bool) -> dict:
    configs = {c.name: c.value for c in topic.configs}
    partitions, rf = topic.num_partitions, topic.replication_factor
    result = {"name": topic.name, "topic_id": None, "error_code": ErrorCode.none,
              "error_message": None, "configs": []}
    if not (ctx.authorized_cluster(Operation.CREATE)
            or ctx.authorized(Operation.CREATE, ResourceType.TOPIC, topic.name)):
        return {**result, "error_code": ErrorCode.topic_authorization_failed,
                "error_message": "Authorization failed."}
    try:
        assigned = _manual_assignment(ctx.broker, topic) if topic.assignments else None
        if assigned is not None:  # the partition count and factor come from the assignment
            partitions, rf = len(assigned), len(assigned[0])
        info = create_topic(ctx.broker, topic.name, partitions, rf, configs, ctx.now_ms(), validate_only)
    except TopicError as exc:
        return {**result, "error_code": exc.code, "error_message": exc.message}
    if info is not None and assigned is not None:
        ctx.broker.cluster.assign_many(info.name, assigned)
    info = info or ctx.broker.topic(topic.name)
    if info is not None:
        result["topic_id"] = info.topic_id
        result["configs"] = [{k: entry[k] for k in _CREATED_CONFIG_FIELDS}
                             for entry in describe_topic_configs(info, None, layers_of(ctx))]
    result["num_partitions"] = partitions if partitions != -1 else ctx.broker.config.num_partitions
    result["replication_factor"] = rf if rf != -1 else ctx.broker.config.default_replication_factor
    return result


@handles(ApiKey.CREATE_TOPICS)
async def create_topics(ctx: RequestContext, body) -> dict:
    validate_only = getattr(body, "validate_only", False)
    results: list[dict] = []
    try:
        with ctx.broker.store.batch():  # one metadata write and fsync for the request
            results.extend(_create_one(ctx, t, validate_only) for t in body.topics)
    except (OSError, LogFailedError):  # the one write failed: none of the new topics exists
        for result in results:
            if result["error_code"] == ErrorCode.none and not validate_only:
                result.update(error_code=ErrorCode.kafka_storage_error, topic_id=None,
                              error_message="Writing the topic metadata failed.")
    return {"throttle_time": 0, "topics": results}


def _delete_one(ctx: RequestContext, name, topic_id) -> dict:
    state = ctx.broker
    info = state.topic(name) if name else state.topic_by_id(topic_id)
    result = {"name": name, "topic_id": topic_id, "error_message": None}
    if (name or info is not None) and not ctx.authorized(
            Operation.DELETE, ResourceType.TOPIC, name or info.name):
        return {**result, "error_code": ErrorCode.topic_authorization_failed}
    if info is None:
        code = ErrorCode.unknown_topic_id if name is None else ErrorCode.unknown_topic_or_partition
        return {**result, "error_code": code}
    if info.name in INTERNAL_TOPICS:
        return {**result, "error_code": ErrorCode.invalid_request,
                "error_message": f"Cannot delete internal topic {info.name}"}
    state.forget_topic(info.name)
    state.store.delete_topic(info.name)
    state.cluster.forget_topic(info.name)
    return {**result, "name": info.name, "topic_id": info.topic_id, "error_code": ErrorCode.none}


@handles(ApiKey.DELETE_TOPICS)
async def delete_topics(ctx: RequestContext, body) -> dict:
    if hasattr(body, "topic_names"):  # v0-5 name the topics; v6 sends (name | id) pairs
        wanted = [(name, None) for name in body.topic_names]
    else:
        wanted = [(t.name, t.topic_id) for t in body.topics]
    return {"throttle_time": 0, "responses": [_delete_one(ctx, n, i) for n, i in wanted]}


def _grow_one(ctx: RequestContext, topic, validate_only: bool) -> dict:
    state = ctx.broker
    info = state.topic(topic.name)
    result = {"name": topic.name, "error_code": ErrorCode.none, "error_message": None}
    if not ctx.authorized(Operation.ALTER, ResourceType.TOPIC, topic.name):
        return {**result, "error_code": ErrorCode.topic_authorization_failed}
    if info is None:
        return {**result, "error_code": ErrorCode.unknown_topic_or_partition}
    if not info.num_partitions < topic.count <= PARTITIONS_PER_TOPIC_MAX:
        return {**result, "error_code": ErrorCode.invalid_partitions,
                "error_message": f"Topic currently has {info.num_partitions} partitions, "
                                 f"{topic.count} would not increase the number of partitions."}
    assigned = None
    if topic.assignments is not None:
        additional = topic.count - info.num_partitions
        if len(topic.assignments) != additional:
            return {**result, "error_code": ErrorCode.invalid_replica_assignment,
                    "error_message": f"Attempted to add {additional} additional partition(s), "
                                     f"but only {len(topic.assignments)} assignment(s) were "
                                     "specified."}
        rf = len(state.cluster.replicas(info.name, 0, replication_factor(info)))
        assigned = {}
        for offset, assignment in enumerate(topic.assignments):
            replicas = [int(r) for r in assignment.broker_ids]
            if problem := state.cluster.assignment_error(replicas, rf):
                return {**result, "error_code": ErrorCode.invalid_replica_assignment,
                        "error_message": problem}
            assigned[info.num_partitions + offset] = replicas
    if not validate_only:
        state.store.create_partitions(topic.name, topic.count)
        if assigned:
            state.cluster.assign_many(topic.name, assigned)
    return result


@handles(ApiKey.CREATE_PARTITIONS)
async def create_partitions(ctx: RequestContext, body) -> dict:
    return {"throttle_time": 0,
            "results": [_grow_one(ctx, t, body.validate_only) for t in body.topics]}
