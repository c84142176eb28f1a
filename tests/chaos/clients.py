"""The chaos run's clients, each an OS process that the nemesis may SIGKILL.

    python -m tests.chaos.clients KIND --name N --incarnation I --bootstrap B --run-dir D ...

KIND is one of:

- `writer`: a transactional producer writing unique values `<name>.<incarnation>-<n>` to
  random partitions of the input topic, 1..VALUES_PER_TXN_MAX per transaction, aborting
  about one transaction in ABORT_RATIO and committing the others;
- `reader`: assigned every input partition from offset 0, it reads (read_committed, or
  read_uncommitted with --isolation) and journals each record;
- `group-reader`: a member of a consumer group on the input topic; it journals each
  record and commits the offsets after each batch (synchronously);
- `copier`: consume-transform-produce input -> output in transactions holding the
  output records and the input offsets (`send_offsets_to_transaction`).

The transactional id of a writer or a copier is its name, the same in every
incarnation: a restarted client's init_transactions fences its predecessor and aborts
what it left open. Every call that can block is journaled as `call`/`ret` lines.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import threading
import time
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from onceflow.examples.copier import first_offsets, next_offsets, transform
from tests.chaos.journal import Journal, journal_path

VALUES_PER_TXN_MAX = 4
ABORT_RATIO = 4           # one transaction in about this many is aborted on purpose
TXN_PAUSE_S = (0.0, 0.05)  # between a writer's transactions
CALL_TIMEOUT_S = 30.0      # every blocking client call gets this timeout
RETRIES_MAX = 20           # of a retriable commit/abort/init before the process gives up
TRANSACTION_TIMEOUT_MS = 10_000
BATCH_RECORDS_MAX = 200
POLL_TIMEOUT_S = 0.5
# Short client timeouts so that lost answers cost seconds, not a minute (docs/faults.md).
COMMON_CONFIG = {"socket.timeout.ms": 10_000, "reconnect.backoff.max.ms": 1_000}
# librdkafka >= 2.10 "re-bootstraps" when it has lost every broker connection (a broker
# SIGKILL): it decommissions the brokers it knew, but its coordinator cache keeps the
# decommissioned handle, and a TxnOffsetCommit waiting for that coordinator to come up
# waits forever: send_offsets_to_transaction(timeout=30) never returns, although the
# broker answered every request (docs/reliability.md, Liveness). `none` keeps the known
# brokers; `--rebootstrap` on the runner puts librdkafka's default back to show the hang.
NO_REBOOTSTRAP = {"metadata.recovery.strategy": "none"}


# A call given CALL_TIMEOUT_S that is still blocked this long will not return: librdkafka
# can wait forever for a coordinator it has decommissioned (docs/reliability.md,
# Liveness). The watchdog then ends the process, as a supervisor's health check would; the
# restarted incarnation's init_transactions aborts the stuck transaction.
WATCHDOG_S = CALL_TIMEOUT_S + 30.0
WATCHDOG_EXIT_CODE = 3
WATCHED_CALLS = ("init_transactions", "commit_transaction", "abort_transaction",
                 "send_offsets_to_transaction", "flush")


def watchdog(journal: Journal) -> None:
    while True:
        time.sleep(1.0)
        current = journal.current
        if current is not None and current[0] in WATCHED_CALLS \
                and time.monotonic() - current[1] > WATCHDOG_S:
            journal.write("watchdog", call=current[0], blocked_s=round(time.monotonic() - current[1], 1))
            os._exit(WATCHDOG_EXIT_CODE)


class Fatal(Exception):
    """The client cannot go on: exit, and let the supervisor start a new incarnation."""


def retrying(journal: Journal, name: str, fn, *args, **fields) -> None:
    """Call `fn` again while it fails with a retriable error (librdkafka asks for that of
    commit_transaction, abort_transaction, init_transactions, send_offsets_to_transaction)."""
    for _attempt in range(RETRIES_MAX):
        try:
            journal.call(name, fn, *args, **fields)
            return
        except KafkaException as exc:
            if not exc.args[0].retriable():
                raise
            time.sleep(0.1)
    raise Fatal(f"{name}: still retriable after {RETRIES_MAX} attempts")


def client_config(args: argparse.Namespace) -> dict:
    config = {"bootstrap.servers": args.bootstrap, **COMMON_CONFIG}
    if not args.rebootstrap:
        config.update(NO_REBOOTSTRAP)
    if args.debug:
        config["debug"] = args.debug
    return config


def transactional_producer(args: argparse.Namespace) -> Producer:
    return Producer({**client_config(args), "transactional.id": args.name,
                     "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS})


# --- writer ---


def run_writer(args: argparse.Namespace, journal: Journal) -> None:
    rng = random.Random(f"{args.seed}/{args.name}/{args.incarnation}")
    producer = transactional_producer(args)
    retrying(journal, "init_transactions", producer.init_transactions, CALL_TIMEOUT_S)
    serial = 0
    for txn in range(sys.maxsize):
        values = []
        for _ in range(rng.randint(1, VALUES_PER_TXN_MAX)):
            values.append((f"{args.name}.{args.incarnation}-{serial}", rng.randrange(args.partitions)))
            serial += 1
        abort = rng.randrange(ABORT_RATIO) == 0
        one_transaction(producer, journal, f"{args.incarnation}/{txn}", values, abort, args.input)
        time.sleep(rng.uniform(*TXN_PAUSE_S))


def one_transaction(producer: Producer, journal: Journal, txn: str, values: list[tuple[str, int]],
                    abort: bool, topic: str) -> None:
    """Write `values` in one transaction; journal its outcome: `committed`, `aborted`, or
    nothing (the process exits and the outcome is unknown to the checker)."""

    def delivered(error, message) -> None:
        journal.write("delivered", txn=txn, value=message.value().decode(),
                      partition=message.partition(),
                      offset=None if error else message.offset(),
                      error=error.name() if error else None)

    journal.write("txn", txn=txn, values=values, intent="abort" if abort else "commit")
    try:
        journal.call("begin_transaction", producer.begin_transaction, txn=txn)
        for value, partition in values:
            producer.produce(topic, value=value.encode(), partition=partition, on_delivery=delivered)
        if not abort:
            retrying(journal, "commit_transaction", producer.commit_transaction, CALL_TIMEOUT_S)
            journal.write("committed", txn=txn)
            return
        # Deliver the records before aborting, so that the log holds aborted records for
        # read_committed readers to skip (unsent ones would just be purged).
        journal.call("flush", producer.flush, CALL_TIMEOUT_S, txn=txn)
    except KafkaException as exc:
        if not exc.args[0].txn_requires_abort():
            raise Fatal(f"transaction {txn}: {exc}") from exc
    except BufferError:
        pass  # the queue is full (the broker is away): abort this one
    retrying(journal, "abort_transaction", producer.abort_transaction, CALL_TIMEOUT_S)
    producer.poll(0)  # the purged records' delivery reports
    journal.write("aborted", txn=txn)


# --- readers ---


def consumer(args: argparse.Namespace, **config) -> Consumer:
    return Consumer({**client_config(args), "isolation.level": args.isolation,
                     "enable.auto.commit": False, "auto.offset.reset": "earliest", **config})


def journal_records(journal: Journal, records: list[Message]) -> list[Message]:
    good = []
    for r in records:
        if r.error() is None:
            good.append(r)
            journal.write("read", partition=r.partition(), offset=r.offset(), value=r.value().decode())
        elif r.error().fatal() or r.error().code() == KafkaError._FATAL:
            # A consumer's fatal error (e.g. FENCED_INSTANCE_ID for a static member) comes
            # as _FATAL, not flagged fatal(): the consumer is dead, end the process.
            journal.write("consumer_error", error=r.error().name(), detail=r.error().str())
            raise KafkaException(r.error())
        else:
            journal.write("consumer_error", error=r.error().name())
    return good


def run_reader(args: argparse.Namespace, journal: Journal) -> None:
    reader = consumer(args, **{"group.id": f"{args.name}-unused"})
    reader.assign([TopicPartition(args.input, p, 0) for p in range(args.partitions)])
    journal.write("assigned", partitions=list(range(args.partitions)))
    while True:
        journal_records(journal, reader.consume(BATCH_RECORDS_MAX, POLL_TIMEOUT_S))


def run_group_reader(args: argparse.Namespace, journal: Journal) -> None:
    reader = consumer(args, **{"group.id": args.group, "session.timeout.ms": 6_000,
                               "heartbeat.interval.ms": 1_000})

    def assigned(_c, partitions) -> None:
        journal.write("assigned", partitions=[p.partition for p in partitions])

    def revoked(_c, partitions) -> None:
        journal.write("revoked", partitions=[p.partition for p in partitions])

    reader.subscribe([args.input], on_assign=assigned, on_revoke=revoked, on_lost=revoked)
    while True:
        records = journal_records(journal, reader.consume(BATCH_RECORDS_MAX, POLL_TIMEOUT_S))
        if not records:
            continue
        offsets = next_offsets(records)
        try:
            journal.call("commit", lambda: reader.commit(offsets=offsets, asynchronous=False),
                         offsets={tp.partition: tp.offset for tp in offsets})
        except KafkaException:
            pass  # journaled; the records are read again by whoever owns the partition


# --- copier ---


def run_copier(args: argparse.Namespace, journal: Journal) -> None:
    source = consumer(args, **{"group.id": args.group, "group.instance.id": args.name,
                               "session.timeout.ms": 6_000, "heartbeat.interval.ms": 1_000})
    producer = transactional_producer(args)
    retrying(journal, "init_transactions", producer.init_transactions, CALL_TIMEOUT_S)
    rebalances = [0]

    def changed(_c, partitions, event: str) -> None:
        rebalances[0] += 1
        journal.write(event, partitions=[p.partition for p in partitions])

    source.subscribe([args.input], on_assign=lambda c, p: changed(c, p, "assigned"),
                     on_revoke=lambda c, p: changed(c, p, "revoked"),
                     on_lost=lambda c, p: changed(c, p, "revoked"))
    batch = 0
    while True:
        before = rebalances[0]
        records = journal_records(journal, source.consume(BATCH_RECORDS_MAX, POLL_TIMEOUT_S))
        if rebalances[0] != before:
            rewind(source, records)  # read across a rebalance: read it again
        elif records:
            batch += 1
            copy_batch(source, producer, journal, f"{args.incarnation}/{batch}", records, args.output)


def copy_batch(source: Consumer, producer: Producer, journal: Journal, txn: str,
               records: list[Message], output: str) -> None:
    inputs = [(r.partition(), r.offset(), r.value().decode()) for r in records]
    journal.write("txn", txn=txn, inputs=inputs)
    metadata = source.consumer_group_metadata()
    try:
        journal.call("begin_transaction", producer.begin_transaction, txn=txn)
        for r in records:
            producer.produce(output, key=r.key(), value=transform(r.value()))
        offsets = next_offsets(records)
        retrying(journal, "send_offsets_to_transaction", producer.send_offsets_to_transaction,
                 offsets, metadata, CALL_TIMEOUT_S, txn=txn,
                 offsets={tp.partition: tp.offset for tp in offsets})
        retrying(journal, "commit_transaction", producer.commit_transaction, CALL_TIMEOUT_S)
        journal.write("committed", txn=txn)
        return
    except KafkaException as exc:
        if not exc.args[0].txn_requires_abort():
            raise Fatal(f"copier transaction {txn}: {exc}") from exc
    except BufferError:
        pass
    retrying(journal, "abort_transaction", producer.abort_transaction, CALL_TIMEOUT_S)
    journal.write("aborted", txn=txn)
    rewind(source, records)


def rewind(source: Consumer, records: list[Message]) -> None:
    owned = {(tp.topic, tp.partition) for tp in source.assignment()}
    for tp in first_offsets(records):
        if (tp.topic, tp.partition) in owned:
            source.seek(tp)


RUNNERS = {"writer": run_writer, "reader": run_reader, "group-reader": run_group_reader,
           "copier": run_copier}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=sorted(RUNNERS))
    parser.add_argument("--name", required=True)
    parser.add_argument("--incarnation", type=int, required=True)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--group", default="")
    parser.add_argument("--partitions", type=int, required=True)
    parser.add_argument("--isolation", default="read_committed")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-watchdog", action="store_true", help="let a stuck call block forever")
    parser.add_argument("--rebootstrap", action="store_true",
                        help="keep librdkafka's metadata.recovery.strategy=rebootstrap")
    parser.add_argument("--debug", default="", help="librdkafka debug contexts (into the client's log)")
    args = parser.parse_args()
    journal = Journal(journal_path(args.run_dir, args.name, args.incarnation))
    journal.write("start", kind=args.kind, pid=os.getpid())
    if not args.no_watchdog:
        threading.Thread(target=watchdog, args=(journal,), daemon=True).start()
    try:
        RUNNERS[args.kind](args, journal)
    except (Fatal, KafkaException) as exc:
        journal.write("exit", error=str(exc))
        sys.exit(1)


if __name__ == "__main__":
    main()
