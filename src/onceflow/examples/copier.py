"""An exactly-once copier: consume, transform, produce, commit - as one transaction.

This is the consume-transform-produce loop of Kafka's exactly-once design, written
with confluent-kafka. Each batch of input records becomes one transaction holding the
output records *and* the input offsets, so after any crash - of this process or of the
broker - a `read_committed` reader of the output sees every input record reflected
exactly once. Copy it and change `transform`.

    python -m onceflow.examples.copier --bootstrap 127.0.0.1:9092 \\
        --input orders --output orders-copy --group copier --instance 1

Run several instances with different `--instance` values to share the input
partitions; restart a dead instance with the *same* value. `--group-protocol consumer`
uses Kafka 4's consumer group protocol (KIP-848: the broker assigns partitions
incrementally, no group-wide pause); the default is the classic protocol. Why the same: the
instance names both the transactional id (the restarted copier aborts what its
predecessor left open, and fences it if it is still alive) and the static group
member (the restart takes the old member's place at once instead of waiting for its
session to time out).

The loop, and what each error means:

- a batch is copied in one transaction; its offsets are those after its records;
- an *abortable* error (a rebalance made our generation stale, a timed-out
  transaction, ...) aborts the transaction and rewinds to the batch's first offsets,
  so the batch is copied again later, by us or by the partition's new owner;
- a *retriable* error of the commit is retried;
- anything else (we were fenced by a newer instance, a fatal producer error) ends the
  process: let your supervisor restart it.
"""

from __future__ import annotations

import argparse
import sys

from confluent_kafka import Consumer, KafkaException, Message, Producer, TopicPartition

# Records per transaction. Larger batches mean fewer transactions (each costs a few
# round trips and one marker per partition) but more work redone after an abort.
BATCH_RECORDS_MAX = 500
POLL_TIMEOUT_S = 1.0
# A copier that dies and is not restarted holds read_committed readers of the output
# back until the broker aborts its open transaction: keep that short. Our transactions
# last well under a second.
TRANSACTION_TIMEOUT_MS = 10_000
COMMIT_ATTEMPTS_MAX = 10


def transform(value: bytes) -> bytes:
    return value.upper()


class Copier:
    """One consumer and one transactional producer copying `input_topic` to `output_topic`."""

    def __init__(self, bootstrap: str, input_topic: str, output_topic: str, group: str,
                 instance: str, group_protocol: str = "classic",
                 consumer_config: dict | None = None) -> None:
        self.output_topic = output_topic
        self.rebalances = 0  # changes while a batch is read: that batch is dropped
        self.consumer = Consumer({
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "group.protocol": group_protocol,     # "consumer": KIP-848 (Kafka 4)
            "group.instance.id": f"{group}-{instance}",  # static member: see the docstring
            "enable.auto.commit": False,          # offsets go into the transaction instead
            "isolation.level": "read_committed",  # never copy aborted records
            "auto.offset.reset": "earliest",
            **(consumer_config or {}),
        })
        self.producer = Producer({
            "bootstrap.servers": bootstrap,
            "transactional.id": f"{group}-{instance}",  # stable across restarts
            "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
        })
        self.producer.init_transactions()
        self.consumer.subscribe([input_topic], on_assign=self.assigned,
                                on_revoke=self.revoked, on_lost=self.revoked)

    def assigned(self, _consumer: Consumer, _partitions: list[TopicPartition]) -> None:
        self.rebalances += 1

    def revoked(self, _consumer: Consumer, _partitions: list[TopicPartition]) -> None:
        self.rebalances += 1

    def run(self) -> None:
        while True:
            records = self.poll_batch()
            if records:
                # The membership the batch was read under, taken now, not at commit time:
                # a consumer fenced meanwhile may have rejoined in the background (the
                # consumer protocol does so without waiting for the application) and a
                # fresh snapshot would let offsets of partitions it lost pass KIP-447's
                # check; this one is stale then, and the commit is refused.
                self.copy(records, self.consumer.consumer_group_metadata())

    def poll_batch(self) -> list[Message]:
        """The next records of our partitions. A batch read across a rebalance may mix
        records of the old and the new assignment, so it is not copied but read again:
        we rewind to where it started."""
        before = self.rebalances
        records = []
        for record in self.consumer.consume(BATCH_RECORDS_MAX, POLL_TIMEOUT_S):
            error = record.error()
            if error is None:
                records.append(record)
            elif error.fatal():
                raise KafkaException(error)
            else:  # informational (the client retries): say so, never drop it silently
                print(f"copier: consumer: {error}", file=sys.stderr, flush=True)
        if self.rebalances != before:
            self.rewind(records)
            return []
        return records

    def copy(self, records: list[Message], group_metadata: object) -> None:
        """Copy one batch in one transaction, or abort it and rewind."""
        self.producer.begin_transaction()
        try:
            for record in records:
                self.producer.produce(self.output_topic, key=record.key(),
                                      value=transform(record.value()))
            self.producer.send_offsets_to_transaction(next_offsets(records), group_metadata)
            self.commit()
        except KafkaException as exc:
            if not exc.args[0].txn_requires_abort():
                raise  # fenced or fatal: a newer instance has taken over, or we must exit
            self.producer.abort_transaction()
            self.rewind(records)

    def commit(self) -> None:
        for attempt in range(1, COMMIT_ATTEMPTS_MAX + 1):
            try:
                self.producer.commit_transaction()
                return
            except KafkaException as exc:
                if not exc.args[0].retriable() or attempt == COMMIT_ATTEMPTS_MAX:
                    raise

    def rewind(self, records: list[Message]) -> None:
        """Go back to the first offset of the batch on each partition we still own."""
        owned = {(tp.topic, tp.partition) for tp in self.consumer.assignment()}
        for tp in first_offsets(records):
            if (tp.topic, tp.partition) in owned:
                self.consumer.seek(tp)


def next_offsets(records: list[Message]) -> list[TopicPartition]:
    """Per partition, the offset after the last record: what the group commits."""
    last: dict[tuple[str, int], int] = {}
    for r in records:
        last[(r.topic(), r.partition())] = max(r.offset(), last.get((r.topic(), r.partition()), -1))
    return [TopicPartition(topic, partition, offset + 1) for (topic, partition), offset in last.items()]


def first_offsets(records: list[Message]) -> list[TopicPartition]:
    """Per partition, the offset of the first record: where an aborted batch restarts."""
    first: dict[tuple[str, int], int] = {}
    for r in records:
        first.setdefault((r.topic(), r.partition()), r.offset())
    return [TopicPartition(topic, partition, offset) for (topic, partition), offset in first.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--group", default="copier")
    parser.add_argument("--instance", default="0")
    parser.add_argument("--group-protocol", default="classic", choices=("classic", "consumer"))
    args = parser.parse_args()
    Copier(args.bootstrap, args.input, args.output, args.group, args.instance,
           args.group_protocol).run()


if __name__ == "__main__":
    main()
