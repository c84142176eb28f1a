"""A fake broker for the transaction coordinator: in-memory logs, a fake clock, fault knobs.

It plays the broker's part of the contract in txn/coordinator.py: append each `Append` to an
in-memory `__transaction_state` partition (offsets assigned) and hand the outcomes to
`complete`; write each `MarkerWrite`'s markers into in-memory data partitions and report
to `markers_written`; keep going while follow-ups come back. Knobs: `fail_next` makes the
next appends fail, `marker_errors` makes the next marker write of a partition fail,
`hold_markers` keeps markers unwritten (a crash between Prepare* and the markers), and
`restarted()` builds a new broker over the same logs (what SIGKILL leaves).
"""

from __future__ import annotations

import itertools
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.groups.records import LogRecord
from onceflow.groups.records import partition_for as group_partition_for
from onceflow.txn.records import decode_key
from onceflow.txn import (
    Appended,
    AppendFailed,
    MarkerWrite,
    Result,
    TopicPartition,
    TransactionCoordinator,
    TxnConfig,
    TxnMarker,
)

E = ErrorCode
TIMEOUT_MS = 60_000
FAST = TxnConfig(abort_timed_out_cleanup_interval_ms=1_000,
                 remove_expired_cleanup_interval_ms=10_000,
                 transactional_id_expiration_ms=3_600_000)
OFFSETS_PARTITIONS = 50


@dataclass
class FakeBroker:
    config: TxnConfig = FAST
    now_ms: int = 1_000_000
    logs: dict[int, list[LogRecord]] = field(default_factory=lambda: defaultdict(list))
    next_offset: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    # data partitions: every marker written, in order
    data: dict[TopicPartition, list[TxnMarker]] = field(default_factory=lambda: defaultdict(list))
    pids: Any = field(default_factory=lambda: itertools.count(1000))
    fail_next: list[ErrorCode] = field(default_factory=list)
    marker_errors: dict[TopicPartition, list[ErrorCode]] = field(
        default_factory=lambda: defaultdict(list))
    hold_markers: bool = False
    held: list[MarkerWrite] = field(default_factory=list)
    coordinator_epoch: int = 0
    load: bool = True

    def __post_init__(self) -> None:
        self.coord = TransactionCoordinator(
            self.config, allocate_producer_id=lambda: next(self.pids),
            group_partition_for=lambda g: group_partition_for(g, OFFSETS_PARTITIONS))
        if self.load:
            for p in range(self.config.transaction_state_num_partitions):
                self.persist(self.coord.load_partition(p, list(self.logs.get(p, [])), self.now_ms,
                                                       self.coordinator_epoch))

    # ---------------------------------------------------------- the broker's contract

    def persist(self, result: Result) -> Any:
        """Drive `result` and every follow-up to the end; returns the first response."""
        todo: deque[Result] = deque([result])
        response, first = None, True
        while todo:
            res = todo.popleft()
            if res.appends:
                outcomes = [self._append(a) for a in res.appends]
                done = self.coord.complete(res, outcomes, self.now_ms)
                if first:
                    response = done.response
                if done.appends or done.markers:
                    todo.append(Result(None, done.appends, done.markers))
            elif first:
                response = res.response
            first = False
            for write in res.markers:
                if self.hold_markers:
                    self.held.append(write)
                else:
                    todo.append(self.write_markers(write))
        return response

    def _append(self, append) -> Appended | AppendFailed:
        if self.fail_next:
            return AppendFailed(self.fail_next.pop(0))
        base = self.next_offset[append.partition]
        for i, record in enumerate(append.records):
            self.logs[append.partition].append(
                LogRecord(base + i, self.now_ms, -1, record.key, record.value))
        self.next_offset[append.partition] = base + len(append.records)
        return Appended(base, self.now_ms)

    def write_markers(self, write: MarkerWrite) -> Result:
        errors = {}
        for marker in write.markers():
            tp = TopicPartition(marker.topic, marker.partition)
            queued = self.marker_errors.get(tp)
            errors[tp] = queued.pop(0) if queued else E.none
            if errors[tp] is E.none:
                self.data[tp].append(marker)
        return self.coord.markers_written(write, errors, self.now_ms)

    def inject(self, record) -> None:
        """Append a record by hand, as if an earlier run had written it (then restart)."""
        partition = self.coord.partition_for(self.coord_key(record))
        offset = self.next_offset[partition]
        self.logs[partition].append(LogRecord(offset, self.now_ms, -1, record.key, record.value))
        self.next_offset[partition] = offset + 1

    @staticmethod
    def coord_key(record) -> str:
        return decode_key(record.key)

    def release_markers(self) -> None:
        held, self.held, self.hold_markers = self.held, [], False
        for write in held:
            self.persist(self.write_markers(write))

    def advance(self, ms: int) -> None:
        self.now_ms += ms
        self.persist(self.coord.tick(self.now_ms))

    def restarted(self, coordinator_epoch: int | None = None) -> FakeBroker:
        """A new broker over the same logs; loading writes the markers of Prepare* ids."""
        return FakeBroker(self.config, self.now_ms, self.logs, self.next_offset, self.data,
                          self.pids, coordinator_epoch=(self.coordinator_epoch + 1
                                                        if coordinator_epoch is None
                                                        else coordinator_epoch))

    # ---------------------------------------------------------- client calls

    def init(self, txn_id: str | None, timeout_ms: int = TIMEOUT_MS, pid: int = -1,
             epoch: int = -1):
        return self.persist(self.coord.init_producer_id(
            transactional_id=txn_id, transaction_timeout_ms=timeout_ms, producer_id=pid,
            producer_epoch=epoch, now_ms=self.now_ms))

    def add(self, txn_id: str, pid: int, epoch: int, *partitions: tuple[str, int]) -> ErrorCode:
        return self.persist(self.coord.add_partitions_to_txn(
            transactional_id=txn_id, producer_id=pid, producer_epoch=epoch,
            partitions=partitions, now_ms=self.now_ms)).error

    def add_offsets(self, txn_id: str, pid: int, epoch: int, group: str) -> ErrorCode:
        return self.persist(self.coord.add_offsets_to_txn(
            transactional_id=txn_id, producer_id=pid, producer_epoch=epoch, group_id=group,
            now_ms=self.now_ms)).error

    def end(self, txn_id: str, pid: int, epoch: int, commit: bool = True) -> ErrorCode:
        return self.persist(self.coord.end_txn(
            transactional_id=txn_id, producer_id=pid, producer_epoch=epoch, commit=commit,
            now_ms=self.now_ms)).error

    def state(self, txn_id: str) -> str:
        return self.coord.describe_transactions([txn_id])[0].transaction_state

    def meta(self, txn_id: str):
        return self.coord.metadata(txn_id)

    def producer(self, txn_id: str, timeout_ms: int = TIMEOUT_MS) -> tuple[int, int]:
        """InitProducerId until it succeeds; returns (pid, epoch)."""
        for _ in range(5):
            answer = self.init(txn_id, timeout_ms)
            if answer.error is E.none:
                return answer.producer_id, answer.producer_epoch
            assert answer.error is E.concurrent_transactions, answer
        raise AssertionError("InitProducerId never succeeded")

    def durable_state(self) -> dict:
        """Every loaded id's metadata as a replay of the log would give it."""
        return {p: {t: m.durable() for t, m in shard.txns.items()}
                for p, shard in self.coord._shards.items() if shard.txns}


def replayed_state(broker: FakeBroker) -> dict:
    """Load the broker's log into a fresh coordinator (markers held) and return its state."""
    fresh = FakeBroker(broker.config, broker.now_ms, broker.logs, broker.next_offset,
                       defaultdict(list), broker.pids, hold_markers=True, load=False)
    for p in range(broker.config.transaction_state_num_partitions):
        fresh.coord.load_partition(p, list(broker.logs.get(p, [])), broker.now_ms)
    return fresh.durable_state()
