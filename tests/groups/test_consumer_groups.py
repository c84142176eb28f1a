"""Consumer groups (KIP-848) in the sans-IO coordinator, with the fake broker of harness.py.

- records round-trip in Kafka 4.0's layout;
- assignors: `uniform` balances within one partition and keeps partitions in place,
  `range` gives consecutive ranges;
- reconciliation: revoke before assign, unreleased partitions handed over later;
- a random walk of joins, heartbeats, leaves and session expiries by well-behaved members
  never lets two members hold a partition, converges to a Stable group owning every
  partition, and a reload of the log gives the same group (loading is the same replay);
- prepare does not mutate: a failed append leaves the group as it was.
"""

from __future__ import annotations

import random
import uuid

import pytest
from kio.schema.errors import ErrorCode

from onceflow.groups.consumer import records as cr
from onceflow.groups.consumer.assignors import MemberSpec, range_, uniform
from onceflow.groups.consumer.heartbeat import HeartbeatRequest
from onceflow.groups.consumer.member import (
    NO_PARTITION_EPOCH,
    ConsumerMember,
    MemberState,
    reconcile,
)
from onceflow.groups.consumer.records import TopicMetadata
from onceflow.groups.consumer.target import TopicsImage
from tests.groups.harness import FakeBroker

E = ErrorCode
T1, T2 = uuid.UUID(int=1), uuid.UUID(int=2)
IMAGE = TopicsImage(1, {"a": TopicMetadata(T1, "a", 6), "b": TopicMetadata(T2, "b", 3)})


def test_records_round_trip():
    sub = cr.MemberSubscription("inst", None, "client", "/1.2.3.4", ("a", "b"), "x.*", 30_000,
                                "uniform")
    assert cr.decode_member_metadata(cr.member_metadata_value(sub)) == sub
    value = cr.MemberAssignmentValue(7, 6, 1, frozenset({(T1, 0), (T2, 2)}),
                                     frozenset({(T1, 3)}))
    assert cr.decode_member_assignment(cr.member_assignment_value(value)) == value
    assert cr.decode_epoch(cr.epoch_value(42)) == 42
    tps = frozenset({(T1, 1), (T1, 5), (T2, 0)})
    assert cr.decode_target_member(cr.target_member_value(tps)) == tps
    topics = (TopicMetadata(T1, "a", 6), TopicMetadata(T2, "b", 3))
    assert cr.decode_partition_metadata(cr.partition_metadata_value(topics)) == topics
    regex = cr.ResolvedRegex(frozenset({"a", "b"}), 9, 123)
    assert cr.decode_regex(cr.regex_value(regex)) == regex
    # the key's version is the record type; a value starts with version 0 (flexible)
    record = cr.record(cr.CURRENT_MEMBER_ASSIGNMENT, "g", b"v", "m")
    assert record.key == b"\x00\x08\x00\x01g\x00\x01m"


def _spec(member_id: str, current=frozenset(), topics=frozenset({T1, T2})) -> MemberSpec:
    return MemberSpec(member_id, None, topics, frozenset(current))


def test_uniform_balances_and_sticks():
    partitions = {T1: 6, T2: 3}
    first = uniform([_spec("m1"), _spec("m2")], partitions)
    assert sorted(len(v) for v in first.values()) == [4, 5]
    assert set().union(*first.values()) == {(T1, i) for i in range(6)} | {(T2, i) for i in range(3)}
    second = uniform([_spec("m1", first["m1"]), _spec("m2", first["m2"]), _spec("m3")],
                     partitions)
    assert sorted(len(v) for v in second.values()) == [3, 3, 3]
    moved = sum(len(first[m] - second[m]) for m in ("m1", "m2"))
    assert moved == 3  # only what m3 takes moves


def test_range_gives_consecutive_ranges():
    assert range_([_spec("m1"), _spec("m2")], {T1: 5}) == {
        "m1": frozenset({(T1, 0), (T1, 1), (T1, 2)}), "m2": frozenset({(T1, 3), (T1, 4)})}


def test_reconcile_revokes_before_assigning():
    member = ConsumerMember("m", member_epoch=1, assigned=frozenset({(T1, 0), (T1, 1)}))
    held = {(T1, 2): 1}  # held by another member
    target = frozenset({(T1, 1), (T1, 2)})
    revoking = reconcile(member, 2, target, lambda tp: held.get(tp, NO_PARTITION_EPOCH),
                         frozenset({(T1, 0), (T1, 1)}))
    assert (revoking.state, revoking.member_epoch) == (MemberState.UNREVOKED_PARTITIONS, 1)
    assert revoking.assigned == {(T1, 1)} and revoking.pending_revocation == {(T1, 0)}
    waiting = reconcile(revoking, 2, target, lambda tp: held.get(tp, NO_PARTITION_EPOCH),
                        frozenset({(T1, 1)}))
    assert (waiting.state, waiting.member_epoch, waiting.assigned) == (
        MemberState.UNRELEASED_PARTITIONS, 2, {(T1, 1)})
    done = reconcile(waiting, 2, target, lambda tp: NO_PARTITION_EPOCH, frozenset({(T1, 1)}))
    assert (done.state, done.assigned) == (MemberState.STABLE, target)


class Members:
    """Well-behaved consumer-protocol clients: they report what they were told to own."""

    def __init__(self, broker: FakeBroker) -> None:
        self.broker = broker
        self.owned: dict[str, frozenset] = {}
        self.epochs: dict[str, int] = {}

    def heartbeat(self, member_id: str, epoch: int | None = None, topics=("a", "b")):
        joining = member_id not in self.epochs
        req = HeartbeatRequest(
            "g", member_id, 0 if joining else (self.epochs[member_id] if epoch is None else epoch),
            None, None, 30_000 if joining else -1, tuple(topics) if joining else None, None,
            None, frozenset() if joining else self.owned[member_id], "client", "/h", 1)
        answer = self.broker.persist(self.broker.coord.consumer_group_heartbeat(
            req, self.broker.now_ms))
        if answer.error is E.none:
            self.epochs[member_id] = answer.member_epoch
            if answer.assignment is not None:
                self.owned[member_id] = answer.assignment
            elif joining:
                self.owned[member_id] = frozenset()
        elif answer.error in (E.unknown_member_id, E.fenced_member_epoch):
            self.epochs.pop(member_id, None)
            self.owned.pop(member_id, None)
        return answer

    def leave(self, member_id: str) -> None:
        req = HeartbeatRequest("g", member_id, -1, None, None, -1, None, None, None, None,
                               "client", "/h", 1)
        assert self.broker.persist(self.broker.coord.consumer_group_heartbeat(
            req, self.broker.now_ms)).error is E.none
        self.epochs.pop(member_id)
        self.owned.pop(member_id)


def _group(broker: FakeBroker):
    coord = broker.coord
    return coord._shards[coord.partition_for("g")].consumer_groups.get("g")


@pytest.mark.parametrize("seed", range(6))
def test_random_walk_never_assigns_a_partition_twice(seed: int):
    rng = random.Random(seed)
    broker = FakeBroker()
    broker.coord.update_topics(IMAGE)
    members = Members(broker)
    names = [f"m{i}" for i in range(5)]
    for _ in range(300):
        live = list(members.epochs)
        action = rng.random()
        if action < 0.15 and len(live) < 4:
            members.heartbeat(rng.choice([n for n in names if n not in live]))
        elif action < 0.22 and live:
            members.leave(rng.choice(live))
        elif action < 0.25 and live:
            stopped = rng.choice(live)  # stops heartbeating: its session expires
            others = [m for m in live if m != stopped]
            broker.advance(broker.config.consumer_group_session_timeout_ms + 1)
            members.epochs.pop(stopped, None)
            members.owned.pop(stopped, None)
            for m in others:  # the others were fenced too (no heartbeat meanwhile)
                members.epochs.pop(m, None)
                members.owned.pop(m, None)
        elif live:
            members.heartbeat(rng.choice(live))
        owners: dict = {}
        for member_id, owned in members.owned.items():
            for tp in owned:
                assert tp not in owners, f"{tp} owned by {owners[tp]} and {member_id}"
                owners[tp] = member_id
    for member_id in list(members.epochs):
        members.leave(member_id)
    for name in names[:3]:
        members.heartbeat(name)
    for _ in range(10):
        for name in names[:3]:
            members.heartbeat(name)
    group = _group(broker)
    assert group.state == "Stable"
    assert sum(len(o) for o in members.owned.values()) == 9
    reloaded = _group(broker.restarted())
    assert (reloaded.group_epoch, reloaded.assignment_epoch, reloaded.members, reloaded.target) \
        == (group.group_epoch, group.assignment_epoch, group.members, group.target)


def test_a_failed_append_leaves_the_group_as_it_was():
    broker = FakeBroker()
    broker.coord.update_topics(IMAGE)
    members = Members(broker)
    members.heartbeat("m1")
    group = _group(broker)
    before = (group.group_epoch, dict(group.members), dict(group.target))
    broker.fail_next.append(E.kafka_storage_error)
    answer = members.heartbeat("m2")
    assert answer.error is E.not_coordinator  # Kafka's mapping of a storage error
    assert (group.group_epoch, group.members, group.target) == before
