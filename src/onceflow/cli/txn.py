"""`onceflow txn list|describe|find-hanging|abort` and `onceflow producers describe`.

Theory of operation: these are the commands of Kafka's `kafka-transactions.sh`, for
people. confluent-kafka's AdminClient has none of their APIs, so each command reads the
cluster metadata through an AdminClient (`clients.connect_admin`: which brokers, which
partition leaders; it fails fast when nothing answers) and then asks the right broker
itself, over `wire.Connection`:

- `txn list`: ListTransactions to every broker (each coordinates some transactional
  ids), merged into one table;
- `txn describe ID`: FindCoordinator (transaction key), then DescribeTransactions there;
- `producers describe T P`: DescribeProducers to the partition's leader, with the
  partition's log end and last stable offset (LSO) from ListOffsets;
- `txn find-hanging`: a *hanging* transaction holds a partition's LSO back although its
  coordinator will never end it - typically a marker lost to a bug, or a producer that
  wrote without registering the partition. As Kafka's tool does, it takes every producer
  with an open transaction on the searched partitions (DescribeProducers) whose last
  write is older than `--older-than-ms` (default: the longest transaction timeout a
  broker allows, so a live transaction would have been aborted already), maps the
  producer ids to transactional ids (ListTransactions) and keeps those whose
  coordinator does not list that partition in the transaction (DescribeTransactions),
  or does not know the producer at all;
- `txn abort`: what `kafka-transactions.sh abort` does - find the producer whose open
  transaction starts at `--start-offset` on the partition (DescribeProducers) and send
  the partition's leader WriteTxnMarkers with an ABORT marker for that producer, epoch
  and coordinator epoch. Only that partition's transaction is ended; use it for hanging
  transactions, never for live ones (their coordinator ends them).
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Annotated, Any, Self

import typer
from confluent_kafka import IsolationLevel, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ClusterMetadata, OffsetSpec
from kio.schema.errors import ErrorCode
from rich.table import Table

from onceflow.cli.clients import (
    BOOTSTRAP_DEFAULT,
    BootstrapOption,
    CliError,
    connect_admin,
    exits_cleanly,
    require_topic,
    stdout,
)
from onceflow.client.wire import Connection, WireError
from onceflow.protocol.apis import ApiKey

# Kafka's transaction.max.timeout.ms default: a transaction open longer than this would
# have been aborted by its coordinator, so it is hanging (find-hanging's default).
TRANSACTION_MAX_TIMEOUT_MS = 15 * 60 * 1000
# Partitions per DescribeProducers request (Kafka's tool uses the same batch size).
DESCRIBE_PRODUCERS_BATCH_MAX = 500
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
}

txn_app = typer.Typer(name="txn", no_args_is_help=True,
                      help="List, describe and abort transactions; find hanging ones.")
producers_app = typer.Typer(name="producers", no_args_is_help=True,
                            help="Describe the producers a partition knows.")

Partition = tuple[str, int]


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


# ---------------------------------------------------------------- the cluster


class Cluster:
    """The metadata of the cluster and one `wire.Connection` per broker asked."""

    def __init__(self, bootstrap_servers: str) -> None:
        self.admin, self.metadata = connect_admin(bootstrap_servers)
        self._connections: dict[int, Connection] = {}

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        for connection in self._connections.values():
            connection.close()

    def node_ids(self) -> list[int]:
        return sorted(self.metadata.brokers)

    def call(self, node_id: int, api_key: ApiKey, versions: tuple[int, int] | None = None,
             **fields: Any) -> Any:
        """One request to one broker, at the highest version of `versions` (default:
        `VERSIONS[api_key]`) the broker answers."""
        try:
            return self._connection(node_id).call(api_key, versions or VERSIONS[api_key],
                                                  **fields)
        except WireError as exc:
            raise CliError(str(exc)) from None

    def _connection(self, node_id: int) -> Connection:
        if node_id not in self._connections:
            broker = self.metadata.brokers.get(node_id)
            if broker is None:
                raise CliError(f"broker {node_id} is not in the cluster metadata")
            self._connections[node_id] = Connection(broker.host, broker.port)
        return self._connections[node_id]

    def leader(self, partition: Partition) -> int:
        topic, index = partition
        if index not in require_topic(self.metadata, topic):
            raise CliError(f"topic '{topic}' has no partition {index}")
        leader = self.metadata.topics[topic].partitions[index].leader
        if leader < 0:
            raise CliError(f"partition {topic}-{index} has no leader")
        return leader

    def coordinator(self, transactional_id: str) -> int:
        """The node that coordinates `transactional_id` (FindCoordinator)."""
        for _ in range(RETRY_ATTEMPTS_MAX):
            answer = self.call(self.node_ids()[0], ApiKey.FIND_COORDINATOR, key=transactional_id,
                               key_type=COORDINATOR_KEY_TYPE_TRANSACTION)
            if answer.error_code == ErrorCode.none:
                return answer.node_id
            if answer.error_code not in RETRY_ERRORS:
                raise CliError(f"finding the coordinator of '{transactional_id}': "
                               f"{error_name(answer.error_code)}")
            time.sleep(RETRY_BACKOFF_S)
        raise CliError(f"no coordinator for '{transactional_id}' is available")

    def offsets(self, partitions: Iterable[Partition],
                isolation: IsolationLevel) -> dict[Partition, int]:
        """Latest offsets: the log end (read_uncommitted) or the LSO (read_committed)."""
        return list_latest(self.admin, partitions, isolation)


def list_latest(admin: AdminClient, partitions: Iterable[Partition],
                isolation: IsolationLevel) -> dict[Partition, int]:
    request = {TopicPartition(t, p): OffsetSpec.latest() for t, p in partitions}
    if not request:
        return {}
    found = {}
    futures = admin.list_offsets(request, isolation_level=isolation,
                                 request_timeout=ADMIN_TIMEOUT_S)
    for tp, future in futures.items():
        try:
            found[(tp.topic, tp.partition)] = future.result(timeout=ADMIN_TIMEOUT_S).offset
        except KafkaException:  # shown as "-": the other columns still help
            continue
    return found


def error_name(code: ErrorCode | int) -> str:
    return ErrorCode(code).name.upper()


# ---------------------------------------------------------------- the API calls


def list_transactions(cluster: Cluster, *, states: Sequence[str] = (),
                      producer_ids: Sequence[int] = (),
                      older_than_ms: int = -1) -> list[ListedTransaction]:
    """Every broker's ListTransactions, merged."""
    # The duration filter exists from v1 on; an older broker must not silently drop it.
    versions = (LIST_TRANSACTIONS_DURATION_MIN_VERSION, VERSIONS[ApiKey.LIST_TRANSACTIONS][1]) \
        if older_than_ms >= 0 else None
    listed = []
    for node_id in cluster.node_ids():
        answer = _retrying(lambda n=node_id: cluster.call(
            n, ApiKey.LIST_TRANSACTIONS, versions, state_filters=list(states),
            producer_id_filters=list(producer_ids), duration_filter=older_than_ms),
            lambda a: {a.error_code})
        if answer.error_code != ErrorCode.none:
            raise CliError(f"listing transactions on broker {node_id}: "
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
    node_id = cluster.coordinator(transactional_id)
    answer = _retrying(lambda: cluster.call(node_id, ApiKey.DESCRIBE_TRANSACTIONS,
                                            transactional_ids=[transactional_id]),
                       lambda a: {t.error_code for t in a.transaction_states})
    (state,) = answer.transaction_states
    if state.error_code == ErrorCode.transactional_id_not_found:
        return None
    if state.error_code != ErrorCode.none:
        raise CliError(f"describing '{transactional_id}': {error_name(state.error_code)}")
    start = state.transaction_start_time
    return DescribedTransaction(
        transactional_id, node_id, state.transaction_state, state.producer_id,
        state.producer_epoch, int(state.transaction_timeout.total_seconds() * 1000),
        None if start is None else int(start.timestamp() * 1000),
        frozenset((t.topic, p) for t in state.topics for p in t.partitions))


def describe_producers(cluster: Cluster,
                       partitions: Sequence[Partition]) -> dict[Partition, list[ProducerState]]:
    """DescribeProducers of each partition, asked of its leader in batches."""
    by_leader: dict[int, list[Partition]] = defaultdict(list)
    for partition in partitions:
        by_leader[cluster.leader(partition)].append(partition)
    found: dict[Partition, list[ProducerState]] = {}
    for leader, owned in sorted(by_leader.items()):
        for start in range(0, len(owned), DESCRIBE_PRODUCERS_BATCH_MAX):
            found.update(_describe_producers_on(cluster, leader,
                                                owned[start:start + DESCRIBE_PRODUCERS_BATCH_MAX]))
    return found


def _describe_producers_on(cluster: Cluster, leader: int,
                           partitions: Sequence[Partition]) -> dict[Partition, list[ProducerState]]:
    by_topic: dict[str, list[int]] = defaultdict(list)
    for topic, index in partitions:
        by_topic[topic].append(index)
    answer = cluster.call(leader, ApiKey.DESCRIBE_PRODUCERS, topics=[
        {"name": t, "partition_indexes": indexes} for t, indexes in by_topic.items()])
    found = {}
    for topic in answer.topics:
        for p in topic.partitions:
            if p.error_code != ErrorCode.none:
                raise CliError(f"describing producers of {topic.name}-{p.partition_index}: "
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
    answer = cluster.call(cluster.leader(producer.partition), ApiKey.WRITE_TXN_MARKERS, markers=[{
        "producer_id": producer.producer_id, "producer_epoch": producer.producer_epoch,
        "transaction_result": False, "coordinator_epoch": coordinator_epoch,
        "topics": [{"name": topic, "partition_indexes": [index]}]}])
    errors = [p.error_code for m in answer.markers for t in m.topics for p in t.partitions]
    if errors != [ErrorCode.none]:
        detail = ", ".join(error_name(e) for e in errors) or "no result for the partition"
        raise CliError(f"aborting the transaction of producer {producer.producer_id} on "
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
            raise CliError("--partition needs --topic")
        return [(t, p) for t in sorted(metadata.topics) for p in sorted(metadata.topics[t].partitions)]
    indexes = require_topic(metadata, topic)
    if partition is None:
        return [(topic, p) for p in indexes]
    if partition not in indexes:
        raise CliError(f"topic '{topic}' has no partition {partition}")
    return [(topic, partition)]


# ---------------------------------------------------------------- tables


def _offset(value: int | None) -> str:
    return NOT_AVAILABLE if value is None or value < 0 else str(value)


def listed_table(listed: Sequence[ListedTransaction]) -> Table:
    table = Table("transactional id", "coordinator", "producer id", "state",
                  title=f"{len(listed)} transaction{'' if len(listed) == 1 else 's'}")
    for t in listed:
        table.add_row(t.transactional_id, str(t.coordinator), str(t.producer_id), t.state)
    return table


def described_table(d: DescribedTransaction, now_ms: int) -> Table:
    table = Table("field", "value", title=f"transaction '{d.transactional_id}'")
    is_open = d.state in OPEN_STATES and d.start_time_ms is not None
    open_ms = max(now_ms - d.start_time_ms, 0) if is_open else None
    rows = [("state", d.state), ("coordinator", str(d.coordinator)),
            ("producer id", str(d.producer_id)), ("producer epoch", str(d.producer_epoch)),
            ("timeout ms", str(d.timeout_ms)),
            ("started at ms", _offset(d.start_time_ms)), ("open for ms", _offset(open_ms)),
            ("partitions", partitions_text(d.partitions) or NOT_AVAILABLE)]
    for name, value in rows:
        table.add_row(name, value)
    return table


def partitions_text(partitions: Iterable[Partition]) -> str:
    by_topic: dict[str, list[int]] = defaultdict(list)
    for topic, index in partitions:
        by_topic[topic].append(index)
    return " ".join(f"{t}:{','.join(map(str, sorted(ps)))}" for t, ps in sorted(by_topic.items()))


def producers_table(partition: Partition, states: Sequence[ProducerState], log_end: int | None,
                    stable: int | None) -> Table:
    table = Table("producer id", "epoch", "coordinator epoch", "last sequence",
                  "last timestamp ms", "open transaction from",
                  title=f"{partition[0]}-{partition[1]}: {len(states)} active producer"
                        f"{'' if len(states) == 1 else 's'}",
                  caption=f"log end {_offset(log_end)}, last stable offset {_offset(stable)}")
    for s in sorted(states, key=lambda s: s.producer_id):
        table.add_row(str(s.producer_id), str(s.producer_epoch), str(s.coordinator_epoch),
                      str(s.last_sequence), str(s.last_timestamp_ms), _offset(s.txn_start_offset))
    return table


def hanging_table(hanging: Sequence[HangingTransaction], stable: dict[Partition, int],
                  now_ms: int) -> Table:
    table = Table("topic", "partition", "producer id", "epoch", "coordinator epoch",
                  "start offset", "last stable offset", "idle ms", "transactional id", "why",
                  title=f"{len(hanging)} hanging transaction{'' if len(hanging) == 1 else 's'}")
    for h in hanging:
        p = h.producer
        table.add_row(p.partition[0], str(p.partition[1]), str(p.producer_id),
                      str(p.producer_epoch), str(p.coordinator_epoch), str(p.txn_start_offset),
                      _offset(stable.get(p.partition)), str(now_ms - p.last_timestamp_ms),
                      h.transactional_id or NOT_AVAILABLE, h.reason)
    if hanging:
        first = hanging[0].producer
        table.caption = (f"abort one with: onceflow txn abort --topic {first.partition[0]} "
                         f"--partition {first.partition[1]} --start-offset {first.txn_start_offset}")
    return table


# ---------------------------------------------------------------- commands


def now_ms() -> int:
    return int(time.time() * 1000)


@txn_app.command("list")
@exits_cleanly
def list_(
    bootstrap_servers: BootstrapOption = BOOTSTRAP_DEFAULT,
    state: Annotated[list[str] | None, typer.Option(
        help="Only transactions in this state (Ongoing, PrepareCommit, ...); repeatable.")] = None,
    producer_id: Annotated[list[int] | None, typer.Option(
        help="Only this producer id; repeatable.")] = None,
    older_than_ms: Annotated[int, typer.Option(
        help="Only transactions open longer than this (brokers with ListTransactions v1+).")] = -1,
) -> None:
    """List the transactional ids every coordinator knows, with their states."""
    with Cluster(bootstrap_servers) as cluster:
        listed = list_transactions(cluster, states=state or (), producer_ids=producer_id or (),
                                   older_than_ms=older_than_ms)
    stdout().print(listed_table(listed))


@txn_app.command("describe")
@exits_cleanly
def describe(
    transactional_id: Annotated[str, typer.Argument(help="Transactional id.")],
    bootstrap_servers: BootstrapOption = BOOTSTRAP_DEFAULT,
) -> None:
    """Show a transactional id's state, producer, timeout, start time and partitions."""
    with Cluster(bootstrap_servers) as cluster:
        described = describe_transaction(cluster, transactional_id)
    if described is None:
        raise CliError(f"unknown transactional id '{transactional_id}'")
    stdout().print(described_table(described, now_ms()))


@txn_app.command("find-hanging")
@exits_cleanly
def find_hanging_command(
    bootstrap_servers: BootstrapOption = BOOTSTRAP_DEFAULT,
    topic: Annotated[str | None, typer.Option(help="Search only this topic.")] = None,
    partition: Annotated[int | None, typer.Option(help="Search only this partition.")] = None,
    older_than_ms: Annotated[int, typer.Option(
        min=0, help="Only transactions whose last write is older than this.")]
        = TRANSACTION_MAX_TIMEOUT_MS,
) -> None:
    """Find open transactions that hold an LSO back and that no coordinator will end."""
    with Cluster(bootstrap_servers) as cluster:
        partitions = searched_partitions(cluster.metadata, topic, partition)
        hanging = find_hanging(cluster, partitions, older_than_ms, now_ms())
        stable = cluster.offsets({h.producer.partition for h in hanging},
                                 IsolationLevel.READ_COMMITTED)
    stdout().print(hanging_table(hanging, stable, now_ms()))


@txn_app.command("abort")
@exits_cleanly
def abort(
    topic: Annotated[str, typer.Option(help="Topic of the hanging transaction.")],
    partition: Annotated[int, typer.Option(help="Partition of the hanging transaction.")],
    bootstrap_servers: BootstrapOption = BOOTSTRAP_DEFAULT,
    start_offset: Annotated[int | None, typer.Option(
        help="First offset of the transaction (see find-hanging or producers describe).")] = None,
    producer_id: Annotated[int | None, typer.Option(help="Instead of --start-offset.")] = None,
    producer_epoch: Annotated[int | None, typer.Option(help="With --producer-id.")] = None,
    coordinator_epoch: Annotated[int | None, typer.Option(help="With --producer-id.")] = None,
) -> None:
    """Abort a hanging transaction on one partition (writes an ABORT marker there)."""
    key = (topic, partition)
    with Cluster(bootstrap_servers) as cluster:
        target = abort_target(cluster, key, start_offset, producer_id, producer_epoch,
                              coordinator_epoch)
        write_abort_marker(cluster, target)
        stable = cluster.offsets([key], IsolationLevel.READ_COMMITTED).get(key)
    stdout().print(f"aborted the transaction of producer {target.producer_id} (epoch "
                   f"{target.producer_epoch}) on {topic}-{partition}; last stable offset now "
                   f"{_offset(stable)}", highlight=False)


def abort_target(cluster: Cluster, partition: Partition, start_offset: int | None,
                 producer_id: int | None, producer_epoch: int | None,
                 coordinator_epoch: int | None) -> ProducerState:
    """The producer state to abort, from --start-offset or from the explicit ids."""
    if start_offset is None:
        if producer_id is None or producer_epoch is None or coordinator_epoch is None:
            raise CliError("name the transaction with --start-offset, or with --producer-id, "
                           "--producer-epoch and --coordinator-epoch")
        return ProducerState(partition, producer_id, producer_epoch, coordinator_epoch,
                             -1, -1, NO_OFFSET)
    states = describe_producers(cluster, [partition]).get(partition, [])
    for state in states:
        if state.txn_start_offset == start_offset:
            return state
    raise CliError(f"no open transaction starts at offset {start_offset} on "
                   f"{partition[0]}-{partition[1]}")


@producers_app.command("describe")
@exits_cleanly
def describe_producers_command(
    topic: Annotated[str, typer.Argument(help="Topic.")],
    partition: Annotated[int, typer.Argument(help="Partition.")],
    bootstrap_servers: BootstrapOption = BOOTSTRAP_DEFAULT,
) -> None:
    """Show a partition's active producers: ids, epochs, sequences, open transactions."""
    key = (topic, partition)
    with Cluster(bootstrap_servers) as cluster:
        states = describe_producers(cluster, [key]).get(key, [])
        log_end = cluster.offsets([key], IsolationLevel.READ_UNCOMMITTED).get(key)
        stable = cluster.offsets([key], IsolationLevel.READ_COMMITTED).get(key)
    stdout().print(producers_table(key, states, log_end, stable))
