"""AddPartitionsToTxn, AddOffsetsToTxn, EndTxn; DescribeTransactions, ListTransactions,
DescribeProducers; WriteTxnMarkers.

The handlers translate each request version onto the transaction coordinator's
version-independent calls (onceflow.txn holds the rules; broker/runtime/txn.py performs their
effects) and back:

- Every request about a transactional id is answered by the node that coordinates it
  (else NOT_COORDINATOR; COORDINATOR_NOT_AVAILABLE before `__transaction_state` exists).
- AddPartitionsToTxn v0-3 (clients) carry one transaction; v4+ (brokers, KIP-890) carry
  several, each maybe `verify_only` (is every partition in the open transaction?). As in
  Kafka, partitions of unknown topics fail the whole transaction before the coordinator
  sees it: UNKNOWN_TOPIC_OR_PARTITION for them, OPERATION_NOT_ATTEMPTED for the others;
  clients may not add internal topics (TOPIC_AUTHORIZATION_FAILED).
- AddOffsetsToTxn adds the group's `__consumer_offsets` partition (created if needed, as a
  FindCoordinator for the group would).
- EndTxn is answered once PrepareCommit/PrepareAbort is durable; the markers follow.
  EndTxn v5 (transactions V2) bumps the epoch with every commit or abort and answers the
  producer id and epoch to go on with (a new producer id at epoch exhaustion).
- PRODUCER_FENCED exists from v2 of these three APIs; older versions get
  INVALID_PRODUCER_EPOCH, as Kafka answers them. TRANSACTION_ABORTABLE exists from
  AddPartitionsToTxn v5; v4 verifications get INVALID_TXN_STATE instead.
- DescribeTransactions and ListTransactions answer for the ids this node coordinates;
  DescribeProducers for the partitions it leads (each partition's producer state).
- WriteTxnMarkers v1 is what Kafka's admin abortTransaction sends to a partition's leader
  to end a hanging transaction (`kafka-transactions.sh abort`, `onceflow txn abort`); the
  broker's own coordinator never needs it (it writes markers in-process). Each marker is
  appended like the coordinator's (producer state checks its epochs) and answered once
  durable.

Authorization (issue 13), as Kafka's KafkaApis: the producer APIs need Write on the
transactional id (TRANSACTIONAL_ID_AUTHORIZATION_FAILED), AddPartitionsToTxn Write on each
topic (TOPIC_AUTHORIZATION_FAILED, the other partitions OPERATION_NOT_ATTEMPTED),
AddOffsetsToTxn Read on the group (GROUP_AUTHORIZATION_FAILED); Describe/ListTransactions
need (or filter by) Describe on the id, DescribeProducers Read on the topic,
WriteTxnMarkers ClusterAction.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable

from kio.schema.errors import ErrorCode

from onceflow.broker.handlers import ApiKey, RequestContext, handles
from onceflow.broker.state import INTERNAL_TOPICS
from onceflow.security.acl import Operation, ResourceType
from onceflow.txn import DescribedTransaction, MarkerWrite, TopicPartition

E = ErrorCode
PRODUCER_FENCED_MIN_VERSION = 2  # AddPartitionsToTxn, AddOffsetsToTxn, EndTxn
BATCHED_MIN_VERSION = 4  # AddPartitionsToTxn v4+: transactions batched, verify_only
ABORTABLE_MIN_VERSION = 5  # AddPartitionsToTxn v5 knows TRANSACTION_ABORTABLE
END_TXN_V2_MIN_VERSION = 5  # EndTxn v5: transactions V2 (KIP-890 part 2)
# DescribeTransactions' start time is a non-nullable timestamp; Kafka sends -1 when no
# transaction started since InitProducerId. kio takes a datetime: this one encodes -1.
NO_START_TIME = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC) \
    - datetime.timedelta(milliseconds=1)


def old_fenced_error(error: ErrorCode, api_version: int, fenced_min_version: int) -> ErrorCode:
    """PRODUCER_FENCED for clients that know it, INVALID_PRODUCER_EPOCH for older ones."""
    if error is E.producer_fenced and api_version < fenced_min_version:
        return E.invalid_producer_epoch
    return error


# ---------------------------------------------------------------- AddPartitionsToTxn


def _precheck(ctx: RequestContext, transactional_id: str,
              partitions: list[TopicPartition]) -> dict[TopicPartition, ErrorCode] | None:
    """Kafka's checks before the coordinator: any failure fails every partition."""
    if not ctx.authorized(Operation.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id):
        return {tp: E.transactional_id_authorization_failed for tp in partitions}
    failed = {}
    for tp in partitions:
        if not ctx.authorized(Operation.WRITE, ResourceType.TOPIC, tp.topic):
            failed[tp] = E.topic_authorization_failed
        elif ctx.api_version < BATCHED_MIN_VERSION and tp.topic in INTERNAL_TOPICS:
            failed[tp] = E.topic_authorization_failed
        elif ctx.broker.partition(tp.topic, tp.partition) is None:
            failed[tp] = E.unknown_topic_or_partition
    if not failed:
        return None
    return {tp: failed.get(tp, E.operation_not_attempted) for tp in partitions}


async def _add_transaction(ctx: RequestContext, transactional_id: str, producer_id: int,
                           producer_epoch: int, topics: Iterable, verify_only: bool,
                           ) -> dict[TopicPartition, ErrorCode]:
    partitions = list(dict.fromkeys(TopicPartition(t.name, p) for t in topics
                                    for p in t.partitions))
    failed = _precheck(ctx, transactional_id, partitions)
    if failed is not None:
        return failed
    runtime = ctx.txns
    error = runtime.route(transactional_id, ctx.node_id)
    if error is not None:
        return {tp: error for tp in partitions}
    if verify_only:
        verified = runtime.coordinator.verify_partitions(
            transactional_id=transactional_id, producer_id=producer_id,
            producer_epoch=producer_epoch, partitions=partitions)
        if ctx.api_version < ABORTABLE_MIN_VERSION:
            verified = {tp: E.invalid_txn_state if e is E.transaction_abortable else e
                        for tp, e in verified.items()}
        return verified
    result = await runtime.persist(runtime.coordinator.add_partitions_to_txn(
        transactional_id=transactional_id, producer_id=producer_id,
        producer_epoch=producer_epoch, partitions=partitions, now_ms=ctx.now_ms()))
    error = old_fenced_error(result.error, ctx.api_version, PRODUCER_FENCED_MIN_VERSION)
    return {tp: error for tp in partitions}


def _topic_results(errors: dict[TopicPartition, ErrorCode]) -> list[dict]:
    topics: dict[str, list[dict]] = {}
    for tp, error in errors.items():
        topics.setdefault(tp.topic, []).append(
            {"partition_index": tp.partition, "partition_error_code": error})
    return [{"name": name, "results_by_partition": results} for name, results in topics.items()]


@handles(ApiKey.ADD_PARTITIONS_TO_TXN)
async def add_partitions_to_txn(ctx: RequestContext, body) -> dict:
    if ctx.api_version < BATCHED_MIN_VERSION:
        errors = await _add_transaction(
            ctx, body.v3_and_below_transactional_id, body.v3_and_below_producer_id,
            body.v3_and_below_producer_epoch, body.v3_and_below_topics, verify_only=False)
        return {"throttle_time": 0, "results_by_topic_v3_and_below": _topic_results(errors)}
    results = []
    for txn in body.transactions:
        errors = await _add_transaction(ctx, txn.transactional_id, txn.producer_id,
                                        txn.producer_epoch, txn.topics, txn.verify_only)
        results.append({"transactional_id": txn.transactional_id,
                        "topic_results": _topic_results(errors)})
    return {"throttle_time": 0, "error_code": E.none, "results_by_transaction": results}


# ---------------------------------------------------------------- AddOffsetsToTxn, EndTxn


@handles(ApiKey.ADD_OFFSETS_TO_TXN)
async def add_offsets_to_txn(ctx: RequestContext, body) -> dict:
    runtime = ctx.txns
    if not ctx.authorized(Operation.WRITE, ResourceType.TRANSACTIONAL_ID, body.transactional_id):
        return {"throttle_time": 0, "error_code": E.transactional_id_authorization_failed}
    if not ctx.authorized(Operation.READ, ResourceType.GROUP, body.group_id):
        return {"throttle_time": 0, "error_code": E.group_authorization_failed}
    error = runtime.route(body.transactional_id, ctx.node_id)
    if error is None:
        await ctx.groups.ensure_topic()  # the partition the markers will go to
        result = await runtime.persist(runtime.coordinator.add_offsets_to_txn(
            transactional_id=body.transactional_id, producer_id=body.producer_id,
            producer_epoch=body.producer_epoch, group_id=body.group_id, now_ms=ctx.now_ms()))
        error = old_fenced_error(result.error, ctx.api_version, PRODUCER_FENCED_MIN_VERSION)
    return {"throttle_time": 0, "error_code": error}


@handles(ApiKey.END_TXN)
async def end_txn(ctx: RequestContext, body) -> dict:
    """EndTxn; v5 is transactions V2: every end bumps the epoch, answered with it."""
    runtime = ctx.txns
    error = runtime.route(body.transactional_id, ctx.node_id)
    if not ctx.authorized(Operation.WRITE, ResourceType.TRANSACTIONAL_ID, body.transactional_id):
        error = E.transactional_id_authorization_failed
    producer_id = producer_epoch = -1
    if error is None:
        result = await runtime.persist(runtime.coordinator.end_txn(
            transactional_id=body.transactional_id, producer_id=body.producer_id,
            producer_epoch=body.producer_epoch, commit=body.committed, now_ms=ctx.now_ms(),
            transactions_v2=ctx.api_version >= END_TXN_V2_MIN_VERSION))
        error = old_fenced_error(result.error, ctx.api_version, PRODUCER_FENCED_MIN_VERSION)
        producer_id, producer_epoch = result.producer_id, result.producer_epoch
    return {"throttle_time": 0, "error_code": error, "producer_id": producer_id,
            "producer_epoch": producer_epoch}


# ---------------------------------------------------------------- admin APIs


def _described(txn: DescribedTransaction) -> dict:
    if txn.error is not E.none:  # Kafka sets only the id and the error; the rest is 0
        return {"error_code": txn.error, "transactional_id": txn.transactional_id,
                "transaction_state": "", "transaction_timeout": 0,
                "transaction_start_time": 0, "producer_id": 0, "producer_epoch": 0,
                "topics": []}
    start = txn.transaction_start_time_ms
    return {
        "error_code": txn.error, "transactional_id": txn.transactional_id,
        "transaction_state": txn.transaction_state,
        "transaction_timeout": txn.transaction_timeout_ms,
        "transaction_start_time": NO_START_TIME if start < 0 else start,
        "producer_id": txn.producer_id, "producer_epoch": txn.producer_epoch,
        "topics": [{"topic": topic, "partitions": list(partitions)}
                   for topic, partitions in txn.topics],
    }


@handles(ApiKey.DESCRIBE_TRANSACTIONS)
async def describe_transactions(ctx: RequestContext, body) -> dict:
    runtime = ctx.txns
    states = []
    for transactional_id in body.transactional_ids:
        error = runtime.route(transactional_id, ctx.node_id) if transactional_id else None
        if not ctx.authorized(Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID,
                              transactional_id):
            error = E.transactional_id_authorization_failed
        if error is not None:
            described = DescribedTransaction(transactional_id, error)
        else:
            (described,) = runtime.coordinator.describe_transactions([transactional_id])
        states.append(_described(described))
    return {"throttle_time": 0, "transaction_states": states}


@handles(ApiKey.LIST_TRANSACTIONS)
async def list_transactions(ctx: RequestContext, body) -> dict:
    runtime = ctx.txns
    answer = {"throttle_time": 0, "error_code": E.none, "unknown_state_filters": [],
              "transaction_states": []}
    if runtime.topic() is None:
        return answer
    result = runtime.coordinator.list_transactions(
        state_filters=body.state_filters, producer_id_filters=body.producer_id_filters,
        duration_filter_ms=getattr(body, "duration_filter", -1),
        transactional_id_pattern=getattr(body, "transactional_id_pattern", None),
        now_ms=ctx.now_ms())
    ours = [t for t in result.transactions  # each node lists the ids it coordinates
            if runtime.coordinator_node(t.transactional_id) == ctx.node_id
            and ctx.authorized(Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID,
                               t.transactional_id)]
    return {**answer, "error_code": result.error,
            "unknown_state_filters": list(result.unknown_state_filters),
            "transaction_states": [{"transactional_id": t.transactional_id,
                                    "producer_id": t.producer_id,
                                    "transaction_state": t.transaction_state} for t in ours]}


def _producers_of(ctx: RequestContext, topic: str, index: int) -> dict:
    answer = {"partition_index": index, "error_code": E.none, "error_message": None,
              "active_producers": []}
    state = ctx.broker
    if not ctx.authorized(Operation.READ, ResourceType.TOPIC, topic):
        return {**answer, "error_code": E.topic_authorization_failed}
    info = state.topic(topic)
    partition = state.partition(topic, index) if info else None
    if partition is None:
        return {**answer, "error_code": E.unknown_topic_or_partition}
    if state.leader(info, index) != ctx.node_id:
        return {**answer, "error_code": E.not_leader_or_follower}
    return {**answer, "active_producers": [
        {"producer_id": p.producer_id, "producer_epoch": p.producer_epoch,
         "last_sequence": p.last_sequence, "last_timestamp": p.last_timestamp_ms,
         "coordinator_epoch": p.coordinator_epoch,
         "current_txn_start_offset": p.current_txn_start_offset}
        for p in partition.producers.describe()]}


@handles(ApiKey.DESCRIBE_PRODUCERS)
async def describe_producers(ctx: RequestContext, body) -> dict:
    return {"throttle_time": 0, "topics": [
        {"name": t.name, "partitions": [_producers_of(ctx, t.name, i) for i in t.partition_indexes]}
        for t in body.topics]}


async def _write_marker(ctx: RequestContext, marker) -> dict[TopicPartition, ErrorCode]:
    errors: dict[TopicPartition, ErrorCode] = {}
    writable = []
    if not ctx.authorized_cluster(Operation.CLUSTER_ACTION):
        return {TopicPartition(t.name, i): E.cluster_authorization_failed
                for t in marker.topics for i in t.partition_indexes}
    for topic in marker.topics:
        info = ctx.broker.topic(topic.name)
        for index in topic.partition_indexes:
            tp = TopicPartition(topic.name, index)
            if info is None or ctx.broker.partition(topic.name, index) is None:
                errors[tp] = E.unknown_topic_or_partition
            elif ctx.broker.leader(info, index) != ctx.node_id:
                errors[tp] = E.not_leader_or_follower
            else:
                writable.append(tp)
    if writable:
        write = MarkerWrite("", marker.producer_id, marker.producer_epoch,
                            marker.transaction_result, marker.coordinator_epoch,
                            tuple(writable))
        errors.update(await ctx.txns.write_markers_and_wait(write))
    return errors


@handles(ApiKey.WRITE_TXN_MARKERS)
async def write_txn_markers(ctx: RequestContext, body) -> dict:
    results = []
    for marker in body.markers:
        errors = await _write_marker(ctx, marker)
        topics: dict[str, list[dict]] = {}
        for tp, error in errors.items():
            topics.setdefault(tp.topic, []).append(
                {"partition_index": tp.partition, "error_code": error})
        results.append({"producer_id": marker.producer_id, "topics": [
            {"name": name, "partitions": partitions} for name, partitions in topics.items()]})
    return {"markers": results}
