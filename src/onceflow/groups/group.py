"""One classic group: its members, its generation, and the facts Kafka derives from them.

Theory of operation
-------------------
A `Group` holds two kinds of state:

* **durable** facts - generation, protocol type and name, leader, and per member its ids,
  timeouts, subscription for the selected protocol and assignment. These are exactly the
  fields of a GroupMetadataValue record: `to_value` writes them, `from_value` builds a
  group from them, and loading a partition is nothing but `from_value` on every record.
* **soft** facts that only matter while the coordinator runs - requests waiting for the
  join or sync phase (`join_waiter`, `sync_waiter`), members that were handed an id but
  have not joined yet (`pending_members`), members that still owe a SyncGroup. Kafka does
  not persist them either; after a restart members simply rejoin.

Every waiter is answered exactly once: `answer_join`/`answer_sync` clear it, and every
path that drops a member answers what it was waiting for. This matters more than in Kafka,
whose socket layer mutes a connection while a request is outstanding; our connections
pipeline requests and answer in order, so a forgotten waiter would stall one for good.

The state machine itself lives in `state.py`; `Group.transition` is the only way to
change `state`.
"""

from __future__ import annotations

import itertools
import struct
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from onceflow.groups.api import (
    JoinGroupMember,
    JoinGroupResult,
    JoinRespond,
    ProtocolLike,
    SyncGroupResult,
    SyncRespond,
    join_error,
)
from onceflow.groups.records import GroupMetadataValue, MemberMetadataValue
from onceflow.groups.state import GroupState, check_transition

CONSUMER_PROTOCOL_TYPE = "consumer"  # Kafka's ConsumerProtocol.PROTOCOL_TYPE
MEMBER_ID_DELIMITER = "-"  # Kafka: member id = (group.instance.id or client.id) + "-" + UUID

Protocols = tuple[tuple[str, bytes], ...]
_INCARNATIONS = itertools.count()


def plain_protocols(protocols: Sequence[ProtocolLike]) -> Protocols:
    return tuple((p.name, bytes(p.metadata)) for p in protocols)


@dataclass(slots=True, eq=False)
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: Protocols  # in the member's order of preference
    assignment: bytes = b""
    join_waiter: JoinRespond | None = None
    sync_waiter: SyncRespond | None = None
    # True from a new member's JoinGroup until its first join response: such a member is
    # expired by the new-member join timeout even while it waits (Kafka: isNew).
    is_new: bool = False
    # set while a static member's replacement record is being written (see membership)
    static_rejoin: object | None = None

    @property
    def protocol_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.protocols)

    def metadata(self, protocol: str) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol:
                return metadata
        raise AssertionError(f"member {self.member_id} does not support protocol {protocol!r}")

    def matches(self, protocols: Protocols) -> bool:
        """Same protocols, same order, same metadata (Kafka: MemberMetadata.matches)."""
        return protocols == self.protocols

    def vote(self, candidates: set[str]) -> str:
        """The member's most preferred protocol among the candidates."""
        for name, _ in self.protocols:
            if name in candidates:
                return name
        raise AssertionError(f"member {self.member_id} supports none of {sorted(candidates)}")


class Group:
    def __init__(self, group_id: str, partition: int, state: GroupState, now_ms: int) -> None:
        self.group_id = group_id
        self.incarnation = next(_INCARNATIONS)  # tells timers of a re-created group apart
        self.partition = partition  # of __consumer_offsets
        self.state = state
        self.state_timestamp_ms = now_ms
        self.generation_id = 0
        self.protocol_type: str | None = None
        self.protocol_name: str | None = None
        self.leader_id: str | None = None
        self.members: dict[str, Member] = {}  # insertion order: first joined first
        self.static_members: dict[str, str] = {}  # group.instance.id -> member id
        self.pending_members: set[str] = set()  # got MEMBER_ID_REQUIRED, not joined yet
        self.pending_sync: set[str] = set()  # joined this generation, SyncGroup not seen
        self.new_member_added = False  # a member joined during the initial delay
        # while the initial rebalance delay runs: (delay_ms, remaining_ms, deadline_ms)
        self.initial_join: tuple[int, int, int] | None = None
        self.subscribed_topics: frozenset[str] | None = None

    def __repr__(self) -> str:
        return (f"Group({self.group_id!r}, {self.state.value}, generation={self.generation_id}, "
                f"members={list(self.members)})")

    # ------------------------------------------------------------ state

    def transition(self, target: GroupState, now_ms: int) -> None:
        check_transition(self.group_id, self.state, target)
        self.state = target
        self.state_timestamp_ms = now_ms

    def is_(self, *states: GroupState) -> bool:
        return self.state in states

    # ------------------------------------------------------------ members

    def is_leader(self, member_id: str) -> bool:
        return self.leader_id == member_id

    def add(self, member: Member, join_waiter: JoinRespond | None) -> None:
        if member.group_instance_id is not None:
            assert member.group_instance_id not in self.static_members, member.group_instance_id
            self.static_members[member.group_instance_id] = member.member_id
        if not self.members:
            self.protocol_type = member.protocol_type
        assert self.protocol_type == member.protocol_type
        assert self.supports_protocols(member.protocol_type, member.protocol_names)
        if self.leader_id is None:
            self.leader_id = member.member_id
        self.members[member.member_id] = member
        member.join_waiter = join_waiter
        self.pending_members.discard(member.member_id)

    def remove(self, member_id: str) -> Member | None:
        member = self.members.pop(member_id, None)
        if member is not None and member.group_instance_id is not None:
            self.static_members.pop(member.group_instance_id, None)
        if self.is_leader(member_id):
            self.leader_id = next(iter(self.members), None)
        self.pending_members.discard(member_id)
        self.pending_sync.discard(member_id)
        return member

    def update_member(self, member: Member, protocols: Protocols, rebalance_timeout_ms: int,
                      session_timeout_ms: int, join_waiter: JoinRespond | None) -> None:
        member.protocols = protocols
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.session_timeout_ms = session_timeout_ms
        if member.join_waiter is not None and join_waiter is not None:
            # Kafka drops the superseded callback (its connection is muted anyway); ours
            # would stall a pipelining connection, so it is answered instead.
            self.answer_join(member, join_error(member.member_id, ErrorCode.rebalance_in_progress))
        member.join_waiter = join_waiter

    def replace_static_member(self, instance_id: str, old_id: str, new_id: str) -> Member:
        """Give the member of `instance_id` a new member id; whatever the old id waited
        for is answered FENCED_INSTANCE_ID (Kafka: replaceStaticMember)."""
        member = self.members.pop(old_id)
        self.answer_join(member, join_error(old_id, ErrorCode.fenced_instance_id))
        self.answer_sync(member, SyncGroupResult(ErrorCode.fenced_instance_id))
        member.member_id = new_id
        self.members[new_id] = member
        if self.is_leader(old_id):
            self.leader_id = new_id
        # Kafka leaves the old id in the pending-sync set, so the sync timeout later
        # rebalances the group; the new id will send the SyncGroup, so it takes the place.
        if old_id in self.pending_sync:
            self.pending_sync.discard(old_id)
            self.pending_sync.add(new_id)
        self.static_members[instance_id] = new_id
        return member

    def validate_member(self, member_id: str, instance_id: str | None) -> ErrorCode | None:
        """Kafka's validateCurrentMember: a known instance id must map to this member id
        (else FENCED_INSTANCE_ID); the member id must be known (else UNKNOWN_MEMBER_ID)."""
        if instance_id is not None:
            current = self.static_members.get(instance_id)
            if current is None:
                return ErrorCode.unknown_member_id
            if current != member_id:
                return ErrorCode.fenced_instance_id
        if member_id not in self.members:
            return ErrorCode.unknown_member_id
        return None

    def answer_join(self, member: Member, result: JoinGroupResult) -> bool:
        waiter, member.join_waiter = member.join_waiter, None
        if waiter is None:
            return False
        waiter(result)
        return True

    def answer_sync(self, member: Member, result: SyncGroupResult) -> bool:
        waiter, member.sync_waiter = member.sync_waiter, None
        if waiter is None:
            return False
        waiter(result)
        return True

    # ------------------------------------------------------------ rebalance facts

    @property
    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def num_awaiting_join(self) -> int:
        return sum(1 for m in self.members.values() if m.join_waiter is not None)

    def has_all_members_joined(self) -> bool:
        return self.num_awaiting_join() == len(self.members) and not self.pending_members

    def candidate_protocols(self) -> set[str]:
        """Protocols that every member supports."""
        members = iter(self.members.values())
        first = next(members, None)
        if first is None:
            return set()
        common = set(first.protocol_names)
        for member in members:
            common.intersection_update(member.protocol_names)
        return common

    def supports_protocols(self, protocol_type: str, names: Sequence[str]) -> bool:
        """Kafka: an Empty group takes any non-empty type and list; otherwise the type must
        match and at least one protocol must be supported by every current member."""
        if self.state is GroupState.EMPTY:
            return bool(protocol_type) and bool(names)
        if self.protocol_type != protocol_type:
            return False
        if not self.members:  # a group being loaded (Kafka: a count of 0 equals 0 members)
            return bool(names)
        candidates = self.candidate_protocols()
        return any(n in candidates for n in names)

    def select_protocol(self) -> str:
        """Each member votes for its preferred protocol among those all members support; the
        most votes wins (Kafka). Ties, which Kafka breaks by hash order, go to the protocol
        that received its first vote earliest in member order, so the choice is stable."""
        assert self.members, "cannot select a protocol for a group without members"
        candidates = self.candidate_protocols()
        votes = Counter(m.vote(candidates) for m in self.members.values())
        return max(votes, key=votes.__getitem__)

    def maybe_elect_new_joined_leader(self) -> bool:
        """Keep the leader if it rejoined, else pick a member that did; False if none did."""
        if self.leader_id is None:
            return False
        if self.members[self.leader_id].join_waiter is not None:
            return True
        for member in self.members.values():
            if member.join_waiter is not None:
                self.leader_id = member.member_id
                return True
        return False

    def init_next_generation(self, now_ms: int) -> None:
        self.generation_id += 1
        if self.members:
            self.protocol_name = self.select_protocol()
            self.transition(GroupState.COMPLETING_REBALANCE, now_ms)
        else:
            self.protocol_name = None
            self.transition(GroupState.EMPTY, now_ms)
        self.subscribed_topics = self.compute_subscribed_topics()
        self.pending_sync.clear()

    def current_member_metadata(self) -> tuple[JoinGroupMember, ...]:
        assert self.protocol_name is not None
        protocol = self.protocol_name
        return tuple(JoinGroupMember(m.member_id, m.group_instance_id, m.metadata(protocol))
                     for m in self.members.values())

    # ------------------------------------------------------------ subscriptions

    def compute_subscribed_topics(self) -> frozenset[str] | None:
        """Topics the members subscribe to, for "consumer" groups whose subscriptions parse;
        None when unknown (then OffsetDelete treats every topic as subscribed)."""
        if self.protocol_type != CONSUMER_PROTOCOL_TYPE:
            return None
        if not self.members:
            return frozenset()
        if self.protocol_name is None:
            return None
        topics: set[str] = set()
        try:
            for member in self.members.values():
                topics.update(parse_subscription_topics(member.metadata(self.protocol_name)))
        except ValueError:
            return None
        return frozenset(topics)

    def is_subscribed_to_topic(self, topic: str) -> bool:
        if self.subscribed_topics is None:
            return self.protocol_type == CONSUMER_PROTOCOL_TYPE
        return topic in self.subscribed_topics

    # ------------------------------------------------------------ records

    def to_value(self, assignments: dict[str, bytes] | None = None) -> GroupMetadataValue:
        """The group as a GroupMetadataValue; `assignments` overrides the members' own."""
        protocol = self.protocol_name
        members = tuple(
            MemberMetadataValue(
                m.member_id, m.group_instance_id, m.client_id, m.client_host,
                m.rebalance_timeout_ms, m.session_timeout_ms,
                m.metadata(protocol) if protocol is not None else b"",
                assignments.get(m.member_id, b"") if assignments is not None else m.assignment,
            )
            for m in self.members.values()
        )
        return GroupMetadataValue(self.protocol_type or "", self.generation_id, protocol,
                                  self.leader_id, self.state_timestamp_ms, members)

    @classmethod
    def from_value(cls, group_id: str, partition: int, value: GroupMetadataValue,
                   now_ms: int) -> Group:
        state = GroupState.STABLE if value.members else GroupState.EMPTY
        timestamp_ms = value.current_state_timestamp_ms
        group = cls(group_id, partition, state, timestamp_ms if timestamp_ms >= 0 else now_ms)
        group.generation_id = value.generation
        group.protocol_type = value.protocol_type or None
        group.protocol_name = value.protocol
        for m in value.members:
            assert value.protocol is not None, f"group {group_id} has members but no protocol"
            group.add(Member(m.member_id, m.group_instance_id, m.client_id, m.client_host,
                             m.rebalance_timeout_ms, m.session_timeout_ms, value.protocol_type,
                             ((value.protocol, m.subscription),), m.assignment), None)
        group.leader_id = value.leader if value.leader in group.members else group.leader_id
        group.subscribed_topics = group.compute_subscribed_topics()
        return group


_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


def parse_subscription_topics(metadata: bytes) -> list[str]:
    """Topics of a ConsumerProtocolSubscription, read as version 0, the prefix of every
    version (as Kafka does): int16 version, then [int32 count] of int16-length strings.
    Raises ValueError for anything that does not parse."""
    buf = memoryview(metadata)
    if len(buf) < 6:
        raise ValueError("subscription too short")
    count = _I32.unpack_from(buf, 2)[0]
    pos = 6
    if count < 0 or count * 2 > len(buf) - pos:
        raise ValueError(f"bad topic count {count}")
    topics = []
    for _ in range(count):
        if pos + 2 > len(buf):
            raise ValueError("truncated topic name length")
        n = _I16.unpack_from(buf, pos)[0]
        pos += 2
        if n < 0 or pos + n > len(buf):
            raise ValueError("truncated topic name")
        topics.append(bytes(buf[pos:pos + n]).decode())
        pos += n
    return topics
