"""Transactions as Kafka's admin APIs show them: list, describe, producers, hanging, abort.

Theory of operation: what `kafka-transactions.sh` does, as functions over a `Cluster`
(`client.cluster`), shared by the `onceflow txn` / `producers` commands and the console.
confluent-kafka's AdminClient has none of these APIs, so each call asks the right broker
over the cluster's raw connections:

- `list_transactions`: ListTransactions to every broker (each coordinates some
  transactional ids), merged;
- `describe_transaction(s)`: FindCoordinator (transaction key), then DescribeTransactions
  there, several ids of one coordinator in one request;
- `describe_producers`: DescribeProducers to each partition's leader, in batches;
- `find_hanging`: a *hanging* transaction holds a partition's LSO back although its
  coordinator will never end it - typically a marker lost to a bug, or a producer that
  wrote without registering the partition. As Kafka's tool does, it takes every producer
  with an open transaction on the searched partitions (DescribeProducers) whose last
  write is older than `older_than_ms` (default: the longest transaction timeout a broker
  allows, so a live transaction would have been aborted already), maps the producer ids
  to transactional ids (ListTransactions) and keeps those whose coordinator does not
  list that partition in the transaction (DescribeTransactions), or does not know the
  producer at all;
- `init_producer_id` / `end_txn`: a transaction's coordinator calls made by a process that
  did not open the transaction (the Spark sink's driver completes its tasks' transactions):
  InitProducerId v6 with keepPreparedTxn (KIP-939) takes over an open two-phase-commit
  transaction under a new epoch; without KIP-939, EndTxn at the (producer id, epoch) the
  transaction was opened with ends it, as Flink's KafkaCommitter does through reflection;
- `write_abort_marker`: what `kafka-transactions.sh abort` does - the partition's leader
  writes an ABORT marker for that producer, epoch and coordinator epoch (WriteTxnMarkers).
  Only that partition's transaction is ended; use it for hanging transactions, never for
  live ones (their coordinator ends them).
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from confluent_kafka.admin import ClusterMetadata
from kio.schema.errors import ErrorCode

from onceflow.client.admin import ClientError, require_topic
from onceflow.client.cluster import Cluster, Partition
from onceflow.protocol.apis import ApiKey

T, K, V = TypeVar("T"), TypeVar("K"), TypeVar("V")

# Kafka's transaction.max.timeout.ms default: a transaction open longer than this would
# have been aborted by its coordinator, so it is hanging (find-hanging's default).
TRANSACTION_MAX_TIMEOUT_MS = 15 * 60 * 1000
# Partitions per DescribeProducers request (Kafka's tool uses the same batch size).
DESCRIBE_PRODUCERS_BATCH_MAX = 500
# Transactional ids per DescribeTransactions request (Kafka's admin client sends all of a
# coordinator's ids at once; a bound keeps one answer small).
DESCRIBE_TRANSACTIONS_BATCH_MAX = 500
# Coordinator errors worth a retry (loading after a restart, topic being created).
RETRY_ERRORS = frozenset({ErrorCode.coordinator_not_available,
                          ErrorCode.coordinator_load_in_progress, ErrorCode.not_coordinator})
RETRY_ATTEMPTS_MAX = 20
RETRY_BACKOFF_S = 0.25
ADMIN_TIMEOUT_S = 30.0
COORDINATOR_KEY_TYPE_TRANSACTION = 1
LIST_TRANSACTIONS_DURATION_MIN_VERSION = 1  # KIP-994
NO_OFFSET = -1
# Coordinator states in which a transaction is still open (its markers not all written).
OPEN_STATES = frozenset({"Ongoing", "PrepareCommit", "PrepareAbort", "PrepareEpochFence"})
NOT_AVAILABLE = "-"
# Versions this module fills in, per API (the broker's range picks the highest common).
VERSIONS: dict[ApiKey, tuple[int, int]] = {
    ApiKey.FIND_COORDINATOR: (1, 3),      # v4 batches keys; one key is all we need
    ApiKey.DESCRIBE_PRODUCERS: (0, 0),
    ApiKey.DESCRIBE_TRANSACTIONS: (0, 0),
    ApiKey.LIST_TRANSACTIONS: (0, 1),     # v1 adds the duration filter (KIP-994)
    ApiKey.WRITE_TXN_MARKERS: (1, 1),     # kio has no v0; v2 is transactions V2
    ApiKey.INIT_PRODUCER_ID: (3, 6),      # v3 carries producer id/epoch; v6 is KIP-939
    ApiKey.END_TXN: (0, 4),               # v5 (transactions V2) bumps the epoch: not ours
}
TWO_PHASE_COMMIT_MIN_VERSION = 6  # InitProducerId v6: enable2Pc, keepPreparedTxn (KIP-939)


# ---------------------------------------------------------------- values


@dataclasses.dataclass(frozen=True)
class ProducerState:
    """One active producer of a partition, as DescribeProducers reports it."""

    partition: Partition
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    last_sequence: int
    last_timestamp_ms: int
    txn_start_offset: int  # NO_OFFSET: no open transaction on this partition


@dataclasses.dataclass(frozen=True)
class ListedTransaction:
    transactional_id: str
    coordinator: int
    producer_id: int
    state: str


@dataclasses.dataclass(frozen=True)
class DescribedTransaction:
    transactional_id: str
    coordinator: int
    state: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    start_time_ms: int | None  # None when no transaction is open
    partitions: frozenset[Partition]


@dataclasses.dataclass(frozen=True)
class HangingTransaction:
    producer: ProducerState
    transactional_id: str | None
    reason: str


def error_name(code: ErrorCode | int) -> str:
    return ErrorCode(code).name.upper()

def _call(cluster: Cluster, node_id: int, api_key: ApiKey,
          versions: tuple[int, int] | None = None, **fields: Any) -> Any:
    """`cluster.call` at `VERSIONS[api_key]` unless told otherwise."""
    return cluster.call(node_id, api_key, versions or VERSIONS[api_key], **fields)


def find_coordinator(cluster: Cluster, transactional_id: str) -> int:
    """The node that coordinates `transactional_id` (FindCoordinator)."""
    for _ in range(RETRY_ATTEMPTS_MAX):
        answer = _call(cluster, cluster.node_ids()[0], ApiKey.FIND_COORDINATOR,
                       key=transactional_id, key_type=COORDINATOR_KEY_TYPE_TRANSACTION)
        if answer.error_code == ErrorCode.none:
            return answer.node_id
        if answer.error_code not in RETRY_ERRORS:
            raise ClientError(f"finding the coordinator of '{transactional_id}': "
                              f"{error_name(answer.error_code)}")
        time.sleep(RETRY_BACKOFF_S)
    raise ClientError(f"no coordinator for '{transactional_id}' is available")


def partitions_text(partitions: Iterable[Partition]) -> str:
    by_topic: dict[str, list[int]] = defaultdict(list)
    for topic, index in partitions:
        by_topic[topic].append(index)
    return " ".join(f"{t}:{','.join(map(str, sorted(ps)))}" for t, ps in sorted(by_topic.items()))


def now_ms() -> int:
    return int(time.time() * 1000)



# ---------------------------------------------------------------- the API calls


@dataclasses.dataclass(frozen=True)
class InitAnswer:
    """InitProducerId's answer; `ongoing_*` (v6) name the transaction kept open, -1 if none."""

    producer_id: int
    producer_epoch: int
    ongoing_producer_id: int = -1
    ongoing_producer_epoch: int = -1


def supports_two_phase_commit(cluster: Cluster, transactional_id: str) -> bool:
    """Whether the id's coordinator answers InitProducerId v6 (KIP-939)."""
    node_id = find_coordinator(cluster, transactional_id)
    return cluster.answers(node_id, ApiKey.INIT_PRODUCER_ID,
                           (TWO_PHASE_COMMIT_MIN_VERSION, TWO_PHASE_COMMIT_MIN_VERSION))


def init_producer_id(cluster: Cluster, transactional_id: str, *, transaction_timeout_ms: int,
                     enable_2pc: bool = False, keep_prepared_txn: bool = False) -> InitAnswer:
    """InitProducerId for `transactional_id` at its coordinator; v6 when a flag is set (an
    older broker cannot honour them: ClientError). Retried while the coordinator is
    loading or busy (CONCURRENT_TRANSACTIONS: markers of the last transaction in flight)."""
    versions = ((TWO_PHASE_COMMIT_MIN_VERSION, TWO_PHASE_COMMIT_MIN_VERSION)
                if enable_2pc or keep_prepared_txn else None)
    retry = RETRY_ERRORS | {ErrorCode.concurrent_transactions}
    answer = None
    for _ in range(RETRY_ATTEMPTS_MAX):
        node_id = find_coordinator(cluster, transactional_id)
        answer = _call(cluster, node_id, ApiKey.INIT_PRODUCER_ID, versions,
                       transactional_id=transactional_id,
                       transaction_timeout=transaction_timeout_ms, producer_id=-1,
                       producer_epoch=-1, enable2_pc=enable_2pc,
                       keep_prepared_txn=keep_prepared_txn)
        if answer.error_code not in retry:
            break
        time.sleep(RETRY_BACKOFF_S)
    assert answer is not None
    if answer.error_code != ErrorCode.none:
        raise ClientError(f"InitProducerId of '{transactional_id}': "
                          f"{error_name(answer.error_code)}")
    return InitAnswer(answer.producer_id, answer.producer_epoch,
                      getattr(answer, "ongoing_txn_producer_id", -1),
                      getattr(answer, "ongoing_txn_producer_epoch", -1))


def end_txn(cluster: Cluster, transactional_id: str, producer_id: int, producer_epoch: int,
            commit: bool) -> ErrorCode:
    """EndTxn for (id, producer id, epoch) at its coordinator, retried while the coordinator
    is loading or moving. Answers the final error: NONE, or e.g. INVALID_TXN_STATE (nothing
    open: already ended), PRODUCER_FENCED / INVALID_PRODUCER_EPOCH (a newer epoch exists)."""
    retry = RETRY_ERRORS | {ErrorCode.concurrent_transactions}
    error = ErrorCode.unknown_server_error
    for _ in range(RETRY_ATTEMPTS_MAX):
        node_id = find_coordinator(cluster, transactional_id)
        answer = _call(cluster, node_id, ApiKey.END_TXN, transactional_id=transactional_id,
                       producer_id=producer_id, producer_epoch=producer_epoch, committed=commit)
        error = ErrorCode(answer.error_code)
        if error not in retry:
            return error
        time.sleep(RETRY_BACKOFF_S)
    return error


def list_transactions(cluster: Cluster, *, states: Sequence[str] = (),
                      producer_ids: Sequence[int] = (),
                      older_than_ms: int = -1) -> list[ListedTransaction]:
    """Every broker's ListTransactions, merged."""
    # The duration filter exists from v1 on; an older broker must not silently drop it.
    versions = (LIST_TRANSACTIONS_DURATION_MIN_VERSION, VERSIONS[ApiKey.LIST_TRANSACTIONS][1]) \
        if older_than_ms >= 0 else None
    listed = []
    for node_id in cluster.node_ids():
        answer = _retrying(lambda n=node_id: _call(cluster, 
            n, ApiKey.LIST_TRANSACTIONS, versions, state_filters=list(states),
            producer_id_filters=list(producer_ids), duration_filter=older_than_ms),
            lambda a: {a.error_code})
        if answer.error_code != ErrorCode.none:
            raise ClientError(f"listing transactions on broker {node_id}: "
                           f"{error_name(answer.error_code)}")
        listed += [ListedTransaction(t.transactional_id, node_id, t.producer_id,
                                     t.transaction_state) for t in answer.transaction_states]
    return sorted(listed, key=lambda t: t.transactional_id)


def _retrying(ask: Callable[[], Any], errors: Callable[[Any], set[ErrorCode]]) -> Any:
    """`ask()` again while `errors(answer)` holds a coordinator error worth a retry."""
    for _ in range(RETRY_ATTEMPTS_MAX - 1):
        answer = ask()
        if not errors(answer) & RETRY_ERRORS:
            return answer
        time.sleep(RETRY_BACKOFF_S)
    return ask()


def describe_transaction(cluster: Cluster, transactional_id: str) -> DescribedTransaction | None:
    """The coordinator's view of `transactional_id`; None when it does not know the id."""
    node_id = find_coordinator(cluster, transactional_id)
    return describe_on(cluster, node_id, [transactional_id]).get(transactional_id)


def describe_listed(cluster: Cluster,
                    listed: Sequence[ListedTransaction]) -> dict[str, DescribedTransaction]:
    """DescribeTransactions of every listed id, one request per coordinator."""
    by_coordinator: dict[int, list[str]] = defaultdict(list)
    for transaction in listed:
        by_coordinator[transaction.coordinator].append(transaction.transactional_id)
    return _per_node(by_coordinator, DESCRIBE_TRANSACTIONS_BATCH_MAX,
                     lambda node_id, ids: describe_on(cluster, node_id, ids))


def _per_node(by_node: dict[int, list[T]], batch_max: int,
              ask: Callable[[int, list[T]], dict[K, V]]) -> dict[K, V]:
    """`ask(node, items)` for each node's items in batches of at most `batch_max`, merged."""
    found: dict[K, V] = {}
    for node_id, items in sorted(by_node.items()):
        for start in range(0, len(items), batch_max):
            found.update(ask(node_id, items[start:start + batch_max]))
    return found


def describe_on(cluster: Cluster, node_id: int,
                transactional_ids: Sequence[str]) -> dict[str, DescribedTransaction]:
    """DescribeTransactions on coordinator `node_id`; ids it does not know are left out."""
    answer = _retrying(lambda: _call(cluster, node_id, ApiKey.DESCRIBE_TRANSACTIONS,
                                     transactional_ids=list(transactional_ids)),
                       lambda a: {t.error_code for t in a.transaction_states})
    found = {}
    for state in answer.transaction_states:
        if state.error_code == ErrorCode.transactional_id_not_found:
            continue
        if state.error_code != ErrorCode.none:
            raise ClientError(f"describing '{state.transactional_id}': "
                              f"{error_name(state.error_code)}")
        start = state.transaction_start_time
        found[state.transactional_id] = DescribedTransaction(
            state.transactional_id, node_id, state.transaction_state, state.producer_id,
            state.producer_epoch, int(state.transaction_timeout.total_seconds() * 1000),
            None if start is None else int(start.timestamp() * 1000),
            frozenset((t.topic, p) for t in state.topics for p in t.partitions))
    return found


def describe_producers(cluster: Cluster,
                       partitions: Sequence[Partition]) -> dict[Partition, list[ProducerState]]:
    """DescribeProducers of each partition, asked of its leader in batches."""
    by_leader: dict[int, list[Partition]] = defaultdict(list)
    for partition in partitions:
        by_leader[cluster.leader(partition)].append(partition)
    return _per_node(by_leader, DESCRIBE_PRODUCERS_BATCH_MAX,
                     lambda leader, owned: _describe_producers_on(cluster, leader, owned))


def _describe_producers_on(cluster: Cluster, leader: int,
                           partitions: Sequence[Partition]) -> dict[Partition, list[ProducerState]]:
    by_topic: dict[str, list[int]] = defaultdict(list)
    for topic, index in partitions:
        by_topic[topic].append(index)
    answer = _call(cluster, leader, ApiKey.DESCRIBE_PRODUCERS, topics=[
        {"name": t, "partition_indexes": indexes} for t, indexes in by_topic.items()])
    found = {}
    for topic in answer.topics:
        for p in topic.partitions:
            if p.error_code != ErrorCode.none:
                raise ClientError(f"describing producers of {topic.name}-{p.partition_index}: "
                               f"{error_name(p.error_code)}")
            found[(topic.name, p.partition_index)] = [ProducerState(
                (topic.name, p.partition_index), s.producer_id, s.producer_epoch,
                s.coordinator_epoch, s.last_sequence, s.last_timestamp,
                s.current_txn_start_offset) for s in p.active_producers]
    return found


def write_abort_marker(cluster: Cluster, producer: ProducerState) -> None:
    """WriteTxnMarkers(ABORT) for `producer` on its partition, to the partition's leader."""
    topic, index = producer.partition
    # A producer whose first transaction hangs was never given a coordinator epoch by a
    # marker (-1); 0 is at most any real coordinator epoch (Kafka's tool does the same).
    coordinator_epoch = max(producer.coordinator_epoch, 0)
    answer = _call(cluster, cluster.leader(producer.partition), ApiKey.WRITE_TXN_MARKERS, markers=[{
        "producer_id": producer.producer_id, "producer_epoch": producer.producer_epoch,
        "transaction_result": False, "coordinator_epoch": coordinator_epoch,
        "topics": [{"name": topic, "partition_indexes": [index]}]}])
    errors = [p.error_code for m in answer.markers for t in m.topics for p in t.partitions]
    if errors != [ErrorCode.none]:
        detail = ", ".join(error_name(e) for e in errors) or "no result for the partition"
        raise ClientError(f"aborting the transaction of producer {producer.producer_id} on "
                       f"{topic}-{index}: {detail}")


# ---------------------------------------------------------------- hanging transactions


def open_transactions(producers: dict[Partition, list[ProducerState]], older_than_ms: int,
                      now_ms: int) -> list[ProducerState]:
    """Producers with an open transaction whose last write is older than `older_than_ms`."""
    return [state for states in producers.values() for state in states
            if state.txn_start_offset != NO_OFFSET
            and now_ms - state.last_timestamp_ms > older_than_ms]


def hanging_transactions(candidates: Sequence[ProducerState],
                         transactional_ids: dict[int, str],
                         descriptions: dict[str, DescribedTransaction | None],
                         ) -> list[HangingTransaction]:
    """The candidates their coordinator will not end (see the module docstring)."""
    hanging = []
    for state in candidates:
        transactional_id = transactional_ids.get(state.producer_id)
        description = descriptions.get(transactional_id) if transactional_id else None
        if transactional_id is None:
            reason = "no coordinator knows this producer id"
        elif description is None:
            reason = "its transactional id is gone"
        elif description.producer_id != state.producer_id:
            reason = f"its transactional id now has producer id {description.producer_id}"
        elif state.partition not in description.partitions:
            reason = f"the coordinator's transaction ({description.state}) excludes this partition"
        else:
            continue  # the coordinator will write this partition's marker
        hanging.append(HangingTransaction(state, transactional_id, reason))
    return hanging


def find_hanging(cluster: Cluster, partitions: Sequence[Partition], older_than_ms: int,
                 now_ms: int) -> list[HangingTransaction]:
    candidates = open_transactions(describe_producers(cluster, partitions), older_than_ms,
                                   now_ms)
    if not candidates:
        return []
    producer_ids = sorted({c.producer_id for c in candidates})
    ids = {t.producer_id: t.transactional_id
           for t in list_transactions(cluster, producer_ids=producer_ids)}
    descriptions = {tid: describe_transaction(cluster, tid) for tid in set(ids.values())}
    return hanging_transactions(candidates, ids, descriptions)


def searched_partitions(metadata: ClusterMetadata, topic: str | None,
                        partition: int | None) -> list[Partition]:
    if topic is None:
        if partition is not None:
            raise ClientError("--partition needs --topic")
        return [(t, p) for t in sorted(metadata.topics) for p in sorted(metadata.topics[t].partitions)]
    indexes = require_topic(metadata, topic)
    if partition is None:
        return [(topic, p) for p in indexes]
    if partition not in indexes:
        raise ClientError(f"topic '{topic}' has no partition {partition}")
    return [(topic, partition)]



def abort_target(cluster: Cluster, partition: Partition, start_offset: int | None,
                 producer_id: int | None, producer_epoch: int | None,
                 coordinator_epoch: int | None) -> ProducerState:
    """The producer state to abort, from --start-offset or from the explicit ids."""
    if start_offset is None:
        if producer_id is None or producer_epoch is None or coordinator_epoch is None:
            raise ClientError("name the transaction with --start-offset, or with --producer-id, "
                           "--producer-epoch and --coordinator-epoch")
        return ProducerState(partition, producer_id, producer_epoch, coordinator_epoch,
                             -1, -1, NO_OFFSET)
    states = describe_producers(cluster, [partition]).get(partition, [])
    for state in states:
        if state.txn_start_offset == start_offset:
            return state
    raise ClientError(f"no open transaction starts at offset {start_offset} on "
                   f"{partition[0]}-{partition[1]}")


