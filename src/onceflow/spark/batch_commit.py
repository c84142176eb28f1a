"""`atomicity=batch`: a micro-batch of the Kafka sink becomes visible all at once, or never.

Theory of operation (two-phase commit, the driver being the coordinator):

* Prepare, in each write task. The task writes its rows in a Kafka transaction under a
  transactional id of its own - `<prefix>-<query id>-<batch id>-<partition id>-<random>`,
  new for every attempt and every run, so no later attempt's `init_transactions()` can
  abort a transaction the driver may have decided to commit - flushes them (every row is
  acknowledged by the partition leaders, nothing is committed) and hands the open
  transaction over to the driver in its commit message as (transactional id, producer id,
  epoch). librdkafka cannot end another process's transaction, so the hand-over uses
  onceflow's own protocol layer (`onceflow.client.transactions`):
  - KIP-939 (`twoPhaseCommit=auto|true`, the broker has InitProducerId v6 and allows it):
    InitProducerId with enable2Pc and keepPreparedTxn takes the transaction over under
    epoch + 1 - the task's producer is fenced, and the broker no longer aborts the
    transaction on its timeout (a two-phase-commit transaction waits for its coordinator);
  - otherwise (Apache Kafka before KIP-939, or 2PC not allowed): the task reads its own
    transaction's producer id and epoch (DescribeTransactions), as Flink's KafkaSink does
    through reflection; the transaction stays under `kafka.transaction.timeout.ms`.
  The task's producer is then dropped without ending the transaction.
* Decide, on the driver, in `commit(messages, batch_id)`: record the decision durably
  first - one `BatchDecision` (batch id and every transaction to commit) in the progress
  topic, acknowledged by all in-sync replicas - then EndTxn(COMMIT) each transaction at
  its (producer id, epoch). A read_committed reader thus sees none of the batch until the
  first EndTxn, and all of it once the last one's markers are written (milliseconds).
* Recover. Every `commit` first reads the query's latest decision. If it is for this very
  batch, a previous run recorded it and died before Spark's commit log said so: that
  decision is completed and this run's prepared transactions are aborted (the replay
  never writes twice, whatever rows it computed). If it is for an earlier batch that this
  process has not seen completed, it is completed again (EndTxn is idempotent). Then every
  open transaction of this query that no decision names - attempts that failed, runs that
  died before deciding - is aborted (ListTransactions, DescribeTransactions, EndTxn ABORT).
  `abort` (Spark gave up the batch) aborts the batch's prepared transactions.

Nothing here skips a replayed partition by its id: a replay's rows are written again and
either committed (no decision existed) or aborted (one did), so non-deterministic
transformations and any write partitioning are exactly-once.

Costs per task: one InitProducerId v6 or DescribeTransactions after the flush; per batch on
the driver: the decision lookup and record, one EndTxn per transaction, one
ListTransactions per broker. docs/spark-kafka-sink.md has the failure cases and figures.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import uuid
from collections.abc import Iterable, Sequence

from kio.schema.errors import ErrorCode

from onceflow.client import transactions as txns
from onceflow.client.admin import ClientError
from onceflow.client.cluster import Cluster
from onceflow.spark.kafka_sink_options import RowLayout, SinkOptions
from onceflow.spark.progress import BatchDecision

logger = logging.getLogger(__name__)

PATH_KIP_939 = "kip939"   # the transaction was taken over with keepPreparedTxn
PATH_EPOCH = "epoch"      # completed by (transactional id, producer id, epoch)
ONGOING = "Ongoing"
COMPLETED_STATES = {True: "CompleteCommit", False: "CompleteAbort"}
# EndTxn answers that may mean "already ended" (a retry of a completed decision)
ALREADY_ENDED = frozenset({ErrorCode.invalid_txn_state, ErrorCode.producer_fenced,
                           ErrorCode.invalid_producer_epoch})
CLUSTER_REFRESH_TIMEOUT_S = 10.0


class BatchCommitError(RuntimeError):
    """A batch's transactions could not be prepared or committed as decided."""


def transactional_id(options: SinkOptions, query: str, batch: int, partition: int) -> str:
    """A new transactional id for one attempt of one write task (see the module docstring)."""
    return (f"{options.transactional_id_prefix}-{query}-{batch}-{partition}-"
            f"{uuid.uuid4().hex[:12]}")


def query_prefix(options: SinkOptions, query: str) -> str:
    return f"{options.transactional_id_prefix}-{query}-"


# ---------------------------------------------------------------- clients kept per process

_CLUSTERS: dict[tuple, Cluster] = {}
_CLUSTERS_LOCK = threading.Lock()


def cluster_for(options: SinkOptions) -> Cluster:
    """One `Cluster` (admin client and raw connections) per process and settings."""
    key = (options.bootstrap, tuple(sorted(options.client_config().items())))
    with _CLUSTERS_LOCK:
        cluster = _CLUSTERS.get(key)
        if cluster is None:
            cluster = _CLUSTERS[key] = Cluster.connect(options.bootstrap,
                                                       options.client_config())
        return cluster


def close_clusters() -> None:
    with _CLUSTERS_LOCK:
        while _CLUSTERS:
            _CLUSTERS.popitem()[1].close()


# ---------------------------------------------------------------- the task: prepare


def hand_over(options: SinkOptions, txn_id: str) -> tuple[int, int, str]:
    """The open transaction of `txn_id` as (producer id, epoch, path) for the driver."""
    cluster = cluster_for(options)
    if options.two_phase_commit != "false":
        try:
            kept = txns.init_producer_id(cluster, txn_id,
                                         transaction_timeout_ms=options.transaction_timeout_ms,
                                         enable_2pc=True, keep_prepared_txn=True)
        except ClientError as error:
            if options.two_phase_commit == "true":
                raise BatchCommitError(f"twoPhaseCommit=true, but the broker refused KIP-939 "
                                       f"for {txn_id}: {error}") from None
            logger.debug("KIP-939 not available for %s (%s): completing by epoch", txn_id, error)
        else:
            if kept.ongoing_producer_id < 0:
                raise BatchCommitError(f"the transaction of {txn_id} was no longer open when "
                                       "it was handed over (aborted by its timeout?)")
            return kept.producer_id, kept.producer_epoch, PATH_KIP_939
    described = txns.describe_transaction(cluster, txn_id)
    if described is None or described.state != ONGOING:
        raise BatchCommitError(f"the transaction of {txn_id} was no longer open when it was "
                               f"handed over: {described}")
    return described.producer_id, described.producer_epoch, PATH_EPOCH


def write_prepared(options: SinkOptions, layout: RowLayout, query: str, partition: int,
                   batch: int, batches: Iterable, writer_factory, message_factory):
    """One streaming write task with atomicity=batch: rows written and flushed in a
    transaction left open and handed to the driver (the commit message names it)."""
    started = time.monotonic()
    batches = iter(batches)
    first = next(batches, None)
    if first is None:
        return message_factory(partition, batch, 0, "empty", None, _elapsed_ms(started),
                               query=query)
    txn_id = transactional_id(options, query, batch, partition)
    with writer_factory(options, txn_id) as writer:
        rows = writer.prepare(layout, itertools.chain([first], batches))
        try:
            producer_id, epoch, path = hand_over(options, txn_id)
        except BaseException:
            writer.abort_quietly()
            raise
    return message_factory(partition, batch, rows, "prepared", txn_id, _elapsed_ms(started),
                           query=query, producer_id=producer_id, producer_epoch=epoch,
                           path=path)


def _elapsed_ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


# ---------------------------------------------------------------- the driver: decide, recover


# query id -> the latest batch whose decision this process completed. Module level: Spark
# calls commit in a (reused) Python worker with a freshly unpickled writer.
_COMPLETED: dict[str, int] = {}


class BatchCommitter:
    """The driver's side; one per stream writer (kept across batches of one query run)."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def commit(self, messages: Sequence, batch_id: int, log) -> str:
        """Decide and commit batch `batch_id` (see the module docstring); a summary line."""
        query = next((m.query for m in messages if m is not None and m.query), None)
        if query is None:
            return "no task reported a query id: nothing to commit"
        prepared = [m for m in messages if m is not None and m.outcome == "prepared"]
        cluster = cluster_for(self.options)
        latest = log.latest_decision(query, self.options.transaction_timeout_ms)
        if latest is not None and latest.batch > batch_id:
            self._end_all(cluster, [_txn(m) for m in prepared], commit=False)
            raise BatchCommitError(
                f"batch {batch_id} of query {query}: a decision for the later batch "
                f"{latest.batch} is recorded already (was the checkpoint replaced by an older "
                "copy?); this batch's transactions were aborted")
        if latest is not None and latest.batch == batch_id:
            self._complete(cluster, latest)
            decided = {t for t, _, _ in latest.transactions}  # commit may be called again
            prepared = [m for m in prepared if m.transactional_id not in decided]
            self._end_all(cluster, [_txn(m) for m in prepared], commit=False)
            aborted = self.abort_orphans(cluster, query, latest)
            return (f"batch {batch_id} was decided by an earlier run: completed its "
                    f"{len(latest.transactions)} transactions, aborted {len(prepared)} of this "
                    f"run and {aborted} left open")
        if latest is not None and _COMPLETED.get(query, -1) < latest.batch:
            # normally completed already (Spark moved on only after commit returned), but
            # not seen by this process: EndTxn again costs little and cannot double
            self._complete(cluster, latest)
        decision = BatchDecision(query, batch_id, tuple(_txn(m) for m in prepared),
                                 int(time.time() * 1000))
        if any(m.path == PATH_EPOCH for m in prepared):
            self._check_open(cluster, prepared)
        log.record_decision(decision)
        self._complete(cluster, decision)
        aborted = self.abort_orphans(cluster, query, decision)
        return (f"committed {len(prepared)} transactions together"
                + (f", aborted {aborted} left open by failed attempts" if aborted else ""))

    def abort(self, messages: Sequence) -> None:
        prepared = [m for m in messages if m is not None and m.outcome == "prepared"]
        if prepared:
            self._end_all(cluster_for(self.options), [_txn(m) for m in prepared], commit=False)

    def abort_orphans(self, cluster: Cluster, query: str, decision: BatchDecision) -> int:
        """Abort every open transaction of `query` that `decision` does not name."""
        decided = {t for t, _, _ in decision.transactions}
        prefix = query_prefix(self.options, query)
        listed = [t for t in txns.list_transactions(cluster, states=[ONGOING])
                  if t.transactional_id.startswith(prefix) and t.transactional_id not in decided]
        if not listed:
            return 0
        described = txns.describe_listed(cluster, listed)
        orphans = [(d.transactional_id, d.producer_id, d.producer_epoch)
                   for d in described.values() if d.state == ONGOING]
        self._end_all(cluster, orphans, commit=False)
        return len(orphans)

    def _check_open(self, cluster: Cluster, prepared: Sequence) -> None:
        """Without KIP-939 the broker may abort a prepared transaction on its timeout:
        decide only while every one is still open at the epoch it was handed over with."""
        for message in prepared:
            described = txns.describe_transaction(cluster, message.transactional_id)
            if (described is None or described.state != ONGOING
                    or described.producer_epoch != message.producer_epoch):
                raise BatchCommitError(
                    f"the transaction of {message.transactional_id} is no longer open "
                    f"({described}): kafka.transaction.timeout.ms="
                    f"{self.options.transaction_timeout_ms} passed before the batch was "
                    "decided; the batch is replayed")

    def _complete(self, cluster: Cluster, decision: BatchDecision) -> None:
        self._end_all(cluster, decision.transactions, commit=True)
        _COMPLETED[decision.query] = max(_COMPLETED.get(decision.query, -1), decision.batch)

    @staticmethod
    def _end_all(cluster: Cluster, transactions: Iterable[tuple[str, int, int]],
                 commit: bool) -> None:
        for txn_id, producer_id, epoch in transactions:
            error = txns.end_txn(cluster, txn_id, producer_id, epoch, commit)
            if error == ErrorCode.none:
                continue
            if error in ALREADY_ENDED:
                described = txns.describe_transaction(cluster, txn_id)
                if described is not None and described.state == COMPLETED_STATES[commit]:
                    continue  # ended before (a retry, or a recovery of a completed decision)
                if not commit:
                    continue  # ended some other way (timeout, fencing): aborted is aborted
            raise BatchCommitError(
                f"EndTxn({'COMMIT' if commit else 'ABORT'}) of {txn_id} (producer id "
                f"{producer_id}, epoch {epoch}) failed: {txns.error_name(error)}")


def _txn(message) -> tuple[str, int, int]:
    return message.transactional_id, message.producer_id, message.producer_epoch
