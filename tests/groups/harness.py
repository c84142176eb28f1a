"""A fake broker for the coordinator: in-memory __consumer_offsets and a fake clock.

It plays the broker's part of the contract in coordinator.py: append each `Append` to
an in-memory log (offsets assigned), hand the outcomes to `complete`, and keep going
while follow-up appends come back. `fail_next` makes the next append fail.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.groups import (
    Appended,
    AppendFailed,
    CoordinatorConfig,
    GroupCoordinator,
    JoinGroupResult,
    JoinProtocol,
    LogEntry,
    LogRecord,
    MemberAssignment,
    MemberIdentity,
    PartitionCommit,
    Result,
    TopicCommit,
    TxnMarker,
)

FAST = CoordinatorConfig(
    group_initial_rebalance_delay_ms=100,
    group_min_session_timeout_ms=10,
)
SESSION_MS = 10_000
REBALANCE_MS = 30_000
RANGE = JoinProtocol("range", b"range-meta")


class Box:
    """Captures the answer of a JoinGroup/SyncGroup (answered exactly once)."""

    def __init__(self) -> None:
        self.answers: list[Any] = []

    def __call__(self, answer: Any) -> None:
        self.answers.append(answer)

    @property
    def done(self) -> bool:
        return bool(self.answers)

    @property
    def value(self) -> Any:
        assert len(self.answers) == 1, f"expected one answer, got {self.answers}"
        return self.answers[0]


@dataclass
class FakeBroker:
    config: CoordinatorConfig = FAST
    now_ms: int = 1_000_000
    partitions: tuple[int, ...] | None = None  # loaded partitions; None = all
    logs: dict[int, list[LogEntry]] = field(default_factory=lambda: defaultdict(list))
    next_offset: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    fail_next: list[ErrorCode] = field(default_factory=list)
    uuids: int = 0

    def __post_init__(self) -> None:
        self.coord = GroupCoordinator(self.config, new_uuid=self._uuid)
        wanted = self.partitions
        for p in range(self.config.offsets_topic_num_partitions) if wanted is None else wanted:
            self.coord.load_partition(p, [], self.now_ms)

    def _uuid(self) -> str:
        self.uuids += 1
        return f"uuid{self.uuids}"

    # ---------------------------------------------------------- the broker's contract

    def persist(self, result: Result) -> Any:
        response = None
        first = True
        while first or result.appends:
            outcomes = [self._append(a) for a in result.appends]
            result = self.coord.complete(result, outcomes, self.now_ms)
            if first:
                response, first = result.response, False
        return response

    def _append(self, append) -> Appended | AppendFailed:
        if self.fail_next:
            return AppendFailed(self.fail_next.pop(0))
        base = self.next_offset[append.partition]
        log = self.logs[append.partition]
        for i, record in enumerate(append.records):
            log.append(LogRecord(base + i, self.now_ms, append.producer_id, record.key,
                                 record.value))
        self.next_offset[append.partition] = base + len(append.records)
        return Appended(base, self.now_ms)

    def write_marker(self, partition: int, producer_id: int, commit: bool) -> None:
        offset = self.next_offset[partition]
        self.logs[partition].append(TxnMarker(offset, self.now_ms, producer_id, commit))
        self.next_offset[partition] = offset + 1
        self.coord.complete_txn(producer_id, commit, [partition])

    def advance(self, ms: int) -> None:
        self.now_ms += ms
        self.persist(self.coord.tick(self.now_ms))

    def settle(self, *boxes: Box, step_ms: int | None = None, steps_max: int = 100) -> None:
        """Advance the clock until every box is answered (initial delays may extend)."""
        for _ in range(steps_max):
            if all(b.done for b in boxes):
                return
            self.advance(step_ms or self.config.group_initial_rebalance_delay_ms)
        raise AssertionError("boxes never answered")

    def restarted(self) -> FakeBroker:
        """A new broker over the same log (what a restart or SIGKILL leaves)."""
        other = FakeBroker(self.config, self.now_ms, partitions=())
        other.logs, other.next_offset = self.logs, self.next_offset
        other.partitions = self.partitions
        for p in (range(self.config.offsets_topic_num_partitions)
                  if self.partitions is None else self.partitions):
            other.coord.load_partition(p, list(self.logs.get(p, [])), self.now_ms)
        return other

    # ---------------------------------------------------------- client calls

    def join(self, group: str, member_id: str = "", *, instance: str | None = None,
             protocols=(RANGE,), api_version: int = 9, session_ms: int = SESSION_MS,
             rebalance_ms: int = REBALANCE_MS, client_id: str = "client",
             protocol_type: str = "consumer") -> Box:
        box = Box()
        result = self.coord.join_group(
            group_id=group, member_id=member_id, group_instance_id=instance, client_id=client_id,
            client_host="/127.0.0.1", session_timeout_ms=session_ms,
            rebalance_timeout_ms=rebalance_ms, protocol_type=protocol_type,
            protocols=protocols, api_version=api_version, now_ms=self.now_ms, respond=box)
        self.persist(result)
        return box

    def join_dynamic(self, group: str, **kw) -> Box:
        """JoinGroup v4+: the MEMBER_ID_REQUIRED round trip, then the real join."""
        first = self.join(group, **kw)
        assert first.value.error is ErrorCode.member_id_required
        return self.join(group, first.value.member_id, **kw)

    def sync(self, group: str, generation: int, member_id: str, assignments=None, *,
             instance: str | None = None) -> Box:
        box = Box()
        pairs = [MemberAssignment(m, a) for m, a in (assignments or {}).items()]
        result = self.coord.sync_group(
            group_id=group, generation_id=generation, member_id=member_id,
            group_instance_id=instance, protocol_type="consumer", protocol_name=None,
            assignments=pairs, now_ms=self.now_ms, respond=box)
        self.persist(result)
        return box

    def heartbeat(self, group: str, generation: int, member_id: str,
                  instance: str | None = None) -> ErrorCode:
        result = self.coord.heartbeat(group_id=group, generation_id=generation,
                                      member_id=member_id, group_instance_id=instance,
                                      now_ms=self.now_ms)
        return self.persist(result).error

    def commit(self, group: str, offsets: dict[tuple[str, int], int], *, generation: int = -1,
               member_id: str = "", instance: str | None = None, api_version: int = 8,
               metadata: str | None = "", leader_epoch: int = -1):
        result = self.coord.offset_commit(
            group_id=group, generation_id=generation, member_id=member_id,
            group_instance_id=instance, topics=topics(offsets, metadata, leader_epoch),
            api_version=api_version, now_ms=self.now_ms)
        return self.persist(result)

    def txn_commit(self, group: str, producer_id: int, offsets: dict[tuple[str, int], int], *,
                   generation: int = -1, member_id: str = "", instance: str | None = None):
        result = self.coord.txn_offset_commit(
            group_id=group, producer_id=producer_id, producer_epoch=0, generation_id=generation,
            member_id=member_id, group_instance_id=instance, topics=topics(offsets),
            now_ms=self.now_ms)
        return self.persist(result)

    def leave(self, group: str, *member_ids: str):
        members = [MemberIdentity(m) for m in member_ids]
        return self.persist(self.coord.leave_group(group_id=group, members=members,
                                                   now_ms=self.now_ms))

    def delete_offsets(self, group: str, offsets: dict[tuple[str, int], int]):
        return self.persist(self.coord.offset_delete(group_id=group, topics=topics(offsets),
                                                     now_ms=self.now_ms))

    def fetch(self, group: str, wanted=None, require_stable: bool = False) -> dict:
        """{(topic, partition): (offset, leader_epoch, metadata, error)}"""
        result = self.coord.offset_fetch(group_id=group, topics=wanted,
                                         require_stable=require_stable)
        assert result.error is ErrorCode.none, result
        return {(t.name, p.partition_index): (p.committed_offset, p.committed_leader_epoch,
                                              p.metadata, p.error)
                for t in result.topics for p in t.partitions}

    def state(self, group: str) -> str:
        return self.coord.describe_groups([group])[0].group_state

    def form_group(self, group: str, n: int, **kw) -> list[JoinGroupResult]:
        """n dynamic members join and sync; returns their join answers (Stable group)."""
        boxes = [self.join_dynamic(group, **kw) for _ in range(n)]
        self.settle(*boxes)
        joins = [b.value for b in boxes]
        leader = next(j for j in joins if j.members)
        assignment = {j.member_id: f"assignment-{j.member_id}".encode() for j in joins}
        syncs = [self.sync(group, j.generation_id, j.member_id,
                           assignment if j is leader else None) for j in joins]
        assert all(s.value.error is ErrorCode.none for s in syncs), [s.answers for s in syncs]
        return joins


def topics(offsets: dict[tuple[str, int], int], metadata: str | None = "",
           leader_epoch: int = -1) -> list[TopicCommit]:
    by_topic: dict[str, list[PartitionCommit]] = defaultdict(list)
    for (topic, partition), offset in offsets.items():
        by_topic[topic].append(PartitionCommit(partition, offset, leader_epoch, metadata))
    return [TopicCommit(t, tuple(ps)) for t, ps in by_topic.items()]


def errors_of(response) -> set[ErrorCode]:
    return {p.error for t in response.topics for p in t.partitions}

