"""The outbox relay: committed outbox rows to Kafka, each exactly once and in seq order.

    open:  init_transactions()       fences any older relay of this name (same
                                     transactional id) and aborts what it left open
           next = progress record    read_committed, up to the LSO (progress.py)
    loop:  rows = seq >= next ORDER BY seq LIMIT batch
           begin_transaction()
           produce rows, in order; produce {next_seq: last seq + 1} to the progress topic
           commit_transaction()      rows and progress are visible together or not at all
           next = last seq + 1       (optionally: delete the rows below next)

A crash anywhere before the commit leaves an open or aborted transaction: the next relay's
`init_transactions` aborts it and its progress record still says `next`, so the same rows
go out again - in a transaction that commits once. A crash after the commit leaves the new
`next` in Kafka. Either way each row is in the topics exactly once for read_committed
readers, in seq order per partition. A zombie relay (paused, then back) is fenced by the
epoch the newer one took: its produce or commit fails with a fatal error, RelayFenced.

Relying on `seq >= next` is sound only because seq follows commit order; how the outbox
table guarantees that, for PostgreSQL too, is explained in store.py.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping

from confluent_kafka import KafkaError, KafkaException, Producer

from onceflow import db
from onceflow.outbox import progress as progress_topic
from onceflow.outbox import store
from onceflow.outbox.progress import DEFAULT_PROGRESS_TOPIC, Progress

TRANSACTIONAL_ID_PREFIX = "onceflow-outbox-"
BATCH_ROWS_DEFAULT = 500
POLL_INTERVAL_MS_DEFAULT = 200
# An open transaction of a relay that vanished is aborted by the coordinator after this
# (a restarted relay aborts it at once); also the longest a batch may take.
TRANSACTION_TIMEOUT_MS = 60_000
KAFKA_CALL_TIMEOUT_S = 60.0
# Aborted batches in a row (e.g. a partition without a leader) before the relay gives up.
ABORTS_IN_A_ROW_MAX = 10
ABORT_BACKOFF_S = 0.5
FENCED_CODES = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
                          KafkaError.INVALID_PRODUCER_EPOCH})


class RelayError(Exception):
    """The relay cannot go on: say why in one sentence."""


class RelayFenced(RelayError):
    """A newer relay with the same name has taken over; this one must stop."""


@dataclasses.dataclass(frozen=True)
class RelayConfig:
    db_url: str
    bootstrap_servers: str
    name: str | None = None          # default: the outbox table's name
    table: str = store.DEFAULT_TABLE
    progress_topic: str = DEFAULT_PROGRESS_TOPIC
    batch_rows: int = BATCH_ROWS_DEFAULT
    poll_interval_ms: int = POLL_INTERVAL_MS_DEFAULT
    prune: bool = False              # delete rows once published
    # Client properties (security.protocol, sasl.*, ssl.*): the CLI's --command-config.
    client_properties: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @property
    def relay_name(self) -> str:
        return self.name or self.table

    @property
    def transactional_id(self) -> str:
        return TRANSACTIONAL_ID_PREFIX + self.relay_name


@dataclasses.dataclass(frozen=True)
class BatchReport:
    rows: int
    next_seq: int
    aborted: bool = False


class Relay:
    """One relay instance. `open()`, then `publish_batch()` or `run()`; `close()`."""

    def __init__(self, config: RelayConfig) -> None:
        if not 1 <= config.batch_rows <= store.ROWS_PER_READ_MAX:
            raise RelayError(f"batch size must be within 1..{store.ROWS_PER_READ_MAX}")
        self.config = config
        self.database: db.Database | None = None
        self.producer: Producer | None = None
        self.outbox_id = ""
        self.next_seq = 0
        self._staged_next: int | None = None
        self._aborts_in_a_row = 0

    def open(self) -> int:
        """Fence older relays of this name, read the progress; returns the next seq."""
        config = self.config
        self.database = db.connect(config.db_url)
        self.outbox_id = store.outbox_id(self.database, config.table)
        properties = config.client_properties
        progress_topic.ensure_topic(config.bootstrap_servers, config.progress_topic, properties)
        self.producer = Producer({
            **progress_topic.client_config(config.bootstrap_servers, properties),
            "transactional.id": config.transactional_id,
            "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS, "linger.ms": 5})
        self._kafka(lambda: self.producer.init_transactions(KAFKA_CALL_TIMEOUT_S))
        found = progress_topic.read(config.bootstrap_servers, config.progress_topic,
                                    config.relay_name, properties=properties)
        if found is not None and found.outbox_id != self.outbox_id:
            raise RelayError(
                f"relay '{config.relay_name}' has progress for outbox {found.outbox_id} "
                f"(table {found.table}), but {self.database.display} holds outbox "
                f"{self.outbox_id}: give each outbox its own relay name")
        self.next_seq = found.next_seq if found is not None else 0
        return self.next_seq

    def close(self) -> None:
        if self.producer is not None and self._staged_next is not None:
            try:  # leave nothing open (a successor would abort it anyway)
                self.producer.abort_transaction(KAFKA_CALL_TIMEOUT_S)
            except KafkaException:
                pass
        self._staged_next = None
        if self.database is not None:
            self.database.close()
            self.database = None

    def pending(self) -> list[store.OutboxRow]:
        return store.pending(self._db(), self.next_seq, self.config.batch_rows, self.config.table)

    def stage(self, rows: list[store.OutboxRow]) -> bool:
        """Begin a transaction and produce `rows` and the progress after them.
        False: Kafka refused the transaction (it is aborted; retry the same rows)."""
        if not rows:
            raise RelayError("nothing to stage")
        producer = self._producer()
        next_seq = rows[-1].seq + 1
        record = Progress(next_seq, self.outbox_id, self.config.table)

        def produce_all() -> None:
            producer.begin_transaction()
            self._staged_next = next_seq
            for row in rows:
                producer.produce(row.topic, value=row.value, key=row.key,
                                 headers=row.headers or None)
            producer.produce(self.config.progress_topic, key=self.config.relay_name.encode(),
                             value=record.encode())

        try:
            self._kafka(produce_all, retry=False)
        except _Abortable:
            return self._abandon()
        return True

    def commit(self) -> bool:
        """Commit the staged batch. False: Kafka aborted it (retry the same rows)."""
        producer = self._producer()
        try:
            self._kafka(lambda: producer.commit_transaction(KAFKA_CALL_TIMEOUT_S))
        except _Abortable:
            return self._abandon()
        self.next_seq, self._staged_next, self._aborts_in_a_row = self._staged_next, None, 0
        if self.config.prune:
            store.prune(self._db(), self.next_seq, self.config.table)
        return True

    def _abandon(self) -> bool:
        """Abort the open transaction; `next_seq` stays, so the rows go out again."""
        producer = self._producer()
        self._kafka(lambda: producer.abort_transaction(KAFKA_CALL_TIMEOUT_S))
        self._staged_next = None
        self._aborts_in_a_row += 1
        if self._aborts_in_a_row >= ABORTS_IN_A_ROW_MAX:
            raise RelayError(f"{ABORTS_IN_A_ROW_MAX} batches in a row were aborted by "
                             f"Kafka; giving up")
        return False

    def publish_batch(self) -> BatchReport:
        """Publish up to `batch_rows` pending rows in one transaction."""
        rows = self.pending()
        if not rows:
            return BatchReport(0, self.next_seq)
        if self.stage(rows) and self.commit():
            return BatchReport(len(rows), self.next_seq)
        time.sleep(ABORT_BACKOFF_S)
        return BatchReport(0, self.next_seq, aborted=True)

    def run(self, once: bool = False, should_stop: Callable[[], bool] = lambda: False,
            on_batch: Callable[[BatchReport], None] = lambda _report: None) -> None:
        """Publish until `should_stop()`; with `once`, until the outbox is drained."""
        while not should_stop():
            report = self.publish_batch()
            on_batch(report)
            if report.rows == 0 and not report.aborted:
                if once:
                    return
                time.sleep(self.config.poll_interval_ms / 1000)

    def _db(self) -> db.Database:
        if self.database is None:
            raise RelayError("the relay is not open")
        return self.database

    def _producer(self) -> Producer:
        if self.producer is None:
            raise RelayError("the relay is not open")
        return self.producer

    def _kafka(self, call: Callable[[], object], retry: bool = True) -> None:
        """Run a transactional producer call; sort its errors into fenced, fatal, abortable
        and retriable (retried, when `retry`, for up to KAFKA_CALL_TIMEOUT_S)."""
        deadline = time.monotonic() + KAFKA_CALL_TIMEOUT_S
        while True:
            try:
                call()
                return
            except KafkaException as exc:
                error = exc.args[0]
                if error.code() in FENCED_CODES:
                    raise RelayFenced(f"relay '{self.config.relay_name}' was fenced by a newer "
                                      f"instance ({error.str()}); stopping") from None
                if error.fatal():
                    raise RelayError(f"fatal Kafka producer error: {error.str()}") from None
                if error.txn_requires_abort():
                    raise _Abortable(error.str()) from None
                if not (retry and error.retriable()) or time.monotonic() > deadline:
                    raise RelayError(f"Kafka: {error.name()}: {error.str()}") from None
                time.sleep(ABORT_BACKOFF_S)


class _Abortable(Exception):
    """The transaction must be aborted (then the batch is retried)."""
