"""Writing a decided transaction's markers: soft progress between Prepare* and Complete*.

Theory of operation
-------------------
Once PrepareCommit/PrepareAbort is durable the outcome is decided; what is left is to write
a COMMIT/ABORT control batch into every partition of the transaction and then record
Complete*. Which partitions already have their marker is *not* written to
`__transaction_state` (Kafka does not either): the markers themselves are in the data
partitions, and writing one twice is harmless (the partition's producer state finds no open
transaction the second time, so nothing changes). So after a restart, loading the log finds
the id in Prepare* and simply writes every marker again.

A `MarkerJob` is that progress for one id: `remaining` partitions (no durable marker yet),
the subset `in_flight` (handed to the broker, outcome not reported), and whether the
Complete* record is being appended. While a job exists the id has a pending transition
(requests answer CONCURRENT_TRANSACTIONS), as in Kafka where the Complete* transition is
prepared as soon as Prepare* is durable.

The per-partition outcome of a marker write decides what happens next, as Kafka's
TransactionMarkerRequestCompletionHandler does: done; retry later; give up on the job
(the producer or the coordinator was fenced - the id stays in Prepare* until the partition
is loaded again); or a broken invariant (raise).
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

from onceflow.txn.api import MarkerWrite, TopicPartition

E = ErrorCode


class MarkerOutcome(enum.Enum):
    DONE = "done"
    RETRY = "retry"
    CANCEL = "cancel"


_OUTCOMES: dict[ErrorCode, MarkerOutcome] = {
    E.none: MarkerOutcome.DONE,
    # the partition cannot hold markers; the producer could not have written to it either
    E.unsupported_for_message_format: MarkerOutcome.DONE,
    E.unsupported_version: MarkerOutcome.DONE,
    # The partition does not exist. Kafka retries this (its metadata may lag) and skips a
    # partition that has no leader at all ("likely deleted"); our broker's own store is
    # authoritative, so it reports this only for a deleted partition: skip it.
    E.unknown_topic_or_partition: MarkerOutcome.DONE,
    E.not_leader_or_follower: MarkerOutcome.RETRY,
    E.not_enough_replicas: MarkerOutcome.RETRY,
    E.not_enough_replicas_after_append: MarkerOutcome.RETRY,
    E.request_timed_out: MarkerOutcome.RETRY,
    E.kafka_storage_error: MarkerOutcome.RETRY,
    # the producer's epoch or the coordinator's epoch moved on: this job is obsolete
    E.invalid_producer_epoch: MarkerOutcome.CANCEL,
    E.transaction_coordinator_fenced: MarkerOutcome.CANCEL,
}


def marker_outcome(error: ErrorCode) -> MarkerOutcome:
    """Raises RuntimeError for errors Kafka treats as fatal (CORRUPT_MESSAGE,
    MESSAGE_TOO_LARGE, ...): a marker we built was refused, which is our bug."""
    outcome = _OUTCOMES.get(error)
    if outcome is None:
        raise RuntimeError(f"unexpected error {error.name} writing a transaction marker")
    return outcome


_job_seq = itertools.count()


@dataclass(eq=False, slots=True)
class MarkerJob:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: bool
    coordinator_epoch: int
    remaining: set[TopicPartition]
    transaction_version: int = 0  # the markers' epoch check (producer_state)
    in_flight: set[TopicPartition] = field(default_factory=set)
    completing: bool = False  # the Complete* record is being appended
    seq: int = field(default_factory=lambda: next(_job_seq))  # names this job's timers

    def send(self, partitions: set[TopicPartition]) -> MarkerWrite:
        """Hand these remaining partitions to the broker."""
        assert partitions <= self.remaining and not partitions & self.in_flight
        self.in_flight |= partitions
        return MarkerWrite(self.transactional_id, self.producer_id, self.producer_epoch,
                           self.commit, self.coordinator_epoch, tuple(sorted(partitions)),
                           self.transaction_version)

    def waiting(self) -> set[TopicPartition]:
        """Remaining partitions not in flight: those to retry."""
        return self.remaining - self.in_flight

    def matches(self, write: MarkerWrite) -> bool:
        """Is `write` one of this job's (not of a job this id had before a reload)?"""
        return (write.transactional_id == self.transactional_id
                and write.producer_id == self.producer_id
                and write.producer_epoch == self.producer_epoch
                and write.commit == self.commit
                and write.coordinator_epoch == self.coordinator_epoch)

    def record(self, write: MarkerWrite,
               errors: dict[TopicPartition, ErrorCode]) -> MarkerOutcome | None:
        """Apply the outcomes of `write`; CANCEL if the job is obsolete, RETRY if some
        partitions must be written again, None otherwise."""
        missing = set(write.partitions) - set(errors)
        assert not missing, f"no outcome reported for markers of {sorted(missing)}"
        verdict = None
        for tp in write.partitions:
            if tp not in self.in_flight:
                continue  # reported twice: the first report counted
            self.in_flight.discard(tp)
            outcome = marker_outcome(errors[tp])
            if outcome is MarkerOutcome.DONE:
                self.remaining.discard(tp)
            elif outcome is MarkerOutcome.CANCEL:
                verdict = MarkerOutcome.CANCEL
            elif verdict is None:
                verdict = MarkerOutcome.RETRY
        return verdict

    def all_written(self) -> bool:
        return not self.remaining and not self.in_flight
