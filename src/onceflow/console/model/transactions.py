"""Transactions: every transactional id, the open ones that hold an LSO back, the hanging
ones, and the two ways to abort.

Theory of operation: `transactions_view` is ListTransactions on every broker, then
DescribeTransactions per coordinator (state, producer id/epoch, timeout, start time,
partitions). For each open transaction the partitions it writes get their LSO and high
watermark (ListOffsets) and their producers (DescribeProducers): the transaction holds a
partition's LSO back when its producer's open transaction there starts at the LSO.

Aborting. A transaction its coordinator knows is aborted the way Kafka itself aborts
one that outlived its timeout: `abort_by_fencing` initialises a producer with the same
transactional id (InitProducerId), and the coordinator aborts the open transaction on
every partition at once and bumps the epoch, so the old producer instance is fenced and
cannot commit afterwards. Writing ABORT markers behind a live coordinator's back instead
would break the transaction's atomicity (its commit could still land elsewhere). A
*hanging* transaction - open on a partition its coordinator will never end - is aborted
with WriteTxnMarkers on that partition (`abort_hanging`), as `kafka-transactions.sh
abort` does. Both first check that the transaction shown on the page is still the one
open, so an abort of a transaction that has just completed is refused with a message
instead of fencing a healthy producer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from confluent_kafka import IsolationLevel, KafkaException

from onceflow.client.admin import ClientError, describe_kafka_error
from onceflow.client.cluster import Partition
from onceflow.client.transactions import (
    NO_OFFSET,
    OPEN_STATES,
    DescribedTransaction,
    HangingTransaction,
    ProducerState,
    abort_target,
    describe_listed,
    describe_producers,
    describe_transaction,
    find_hanging,
    list_transactions,
    searched_partitions,
    write_abort_marker,
)
from onceflow.console.backend import Backend

# The only state in which a transaction can still be aborted: in the Prepare* states its
# outcome is decided and being written.
ABORTABLE_STATE = "Ongoing"
# How long the fencing producer may take to initialise (the coordinator first writes the
# ABORT markers of the open transaction, which clients see as CONCURRENT_TRANSACTIONS).
FENCE_TIMEOUT_S = 30.0


@dataclasses.dataclass(frozen=True, slots=True)
class Held:
    partition: Partition
    last_stable: int
    high_watermark: int | None


@dataclasses.dataclass(frozen=True, slots=True)
class TransactionRow:
    described: DescribedTransaction     # the coordinator's view
    age_ms: int | None                  # how long the open transaction has been open
    holds: tuple[Held, ...]             # partitions whose LSO it holds back

    @property
    def open(self) -> bool:
        return self.described.state in OPEN_STATES

    @property
    def abortable(self) -> bool:
        return self.described.state == ABORTABLE_STATE

    @property
    def age_ratio(self) -> float | None:
        """Age against the timeout: at 1.0 the coordinator aborts it."""
        if self.age_ms is None or self.described.timeout_ms <= 0:
            return None
        return self.age_ms / self.described.timeout_ms


@dataclasses.dataclass
class TransactionsView:
    rows: list[TransactionRow]
    notes: list[str]

    @property
    def open_count(self) -> int:
        return sum(row.open for row in self.rows)


def transactions_view(backend: Backend, now_ms: int) -> TransactionsView:
    cluster = backend.cluster()
    listed = list_transactions(cluster)
    described = describe_listed(cluster, listed)
    open_ones = [d for d in described.values() if d.state in OPEN_STATES]
    holds = _holds(backend, open_ones)
    rows = []
    for item in listed:
        d = described.get(item.transactional_id)
        if d is None:
            continue  # expired between the two requests
        age = now_ms - d.start_time_ms if d.state in OPEN_STATES and d.start_time_ms else None
        rows.append(TransactionRow(d, None if age is None else max(age, 0),
                                   tuple(holds.get(d.transactional_id, ()))))
    rows.sort(key=lambda r: (not r.open, -(r.age_ms or 0), r.described.transactional_id))
    return TransactionsView(rows, [])


def _holds(backend: Backend, open_ones: Iterable[DescribedTransaction]) -> dict[str, list[Held]]:
    open_list = list(open_ones)
    partitions = sorted({p for d in open_list for p in d.partitions})
    if not partitions:
        return {}
    cluster = backend.cluster()
    stable = cluster.offsets(partitions, IsolationLevel.READ_COMMITTED)
    ends = cluster.offsets(partitions, IsolationLevel.READ_UNCOMMITTED)
    producers = describe_producers(cluster, partitions)
    found: dict[str, list[Held]] = {}
    for d in open_list:
        for partition in sorted(d.partitions):
            lso = stable.get(partition)
            if lso is None:
                continue
            if any(s.producer_id == d.producer_id and s.txn_start_offset == lso
                   for s in producers.get(partition, [])):
                found.setdefault(d.transactional_id, []).append(
                    Held(partition, lso, ends.get(partition)))
    return found


def hanging_view(backend: Backend, older_than_ms: int,
                 now_ms: int) -> list[tuple[HangingTransaction, int | None]]:
    """Hanging transactions on every partition, with the LSO each holds."""
    cluster = backend.cluster()
    partitions = searched_partitions(cluster.metadata, None, None)
    hanging = find_hanging(cluster, partitions, older_than_ms, now_ms)
    stable = cluster.offsets({h.producer.partition for h in hanging},
                             IsolationLevel.READ_COMMITTED)
    return [(h, stable.get(h.producer.partition)) for h in hanging]


def abort_by_fencing(backend: Backend, transactional_id: str, producer_id: int,
                     producer_epoch: int) -> DescribedTransaction:
    """Abort the open transaction of `transactional_id` (see the module docstring).

    Refused (ClientError) unless the coordinator still shows that producer id and epoch
    with an open transaction. Returns the description before the abort.
    """
    cluster = backend.cluster()
    described = describe_transaction(cluster, transactional_id)
    if described is None:
        raise ClientError(f"no coordinator knows '{transactional_id}' any more")
    if described.state != ABORTABLE_STATE:
        # PrepareCommit/PrepareAbort: already ending (a fence now would wait for the
        # commit and then fence a healthy producer); anything else: nothing open.
        raise ClientError(f"'{transactional_id}' has no open transaction any more (it is "
                          f"{described.state}): nothing was aborted")
    if (described.producer_id, described.producer_epoch) != (producer_id, producer_epoch):
        raise ClientError(f"'{transactional_id}' now belongs to producer {described.producer_id} "
                          f"epoch {described.producer_epoch}, not the one shown "
                          f"({producer_id}/{producer_epoch}): reload and try again")
    producer = backend.producer(**{"transactional.id": transactional_id,
                                   "transaction.timeout.ms": max(described.timeout_ms, 1000)})
    try:
        producer.init_transactions(FENCE_TIMEOUT_S)
    except KafkaException as exc:
        raise ClientError(f"aborting '{transactional_id}': "
                          f"{describe_kafka_error(exc.args[0])}") from None
    finally:
        producer.flush(0)
    return described


def abort_hanging(backend: Backend, partition: Partition, start_offset: int) -> ProducerState:
    """WriteTxnMarkers(ABORT) for the transaction open at `start_offset` on `partition`."""
    cluster = backend.cluster()
    target = abort_target(cluster, partition, start_offset, None, None, None)
    if target.txn_start_offset == NO_OFFSET:
        raise ClientError("no open transaction there")
    write_abort_marker(cluster, target)
    return target
