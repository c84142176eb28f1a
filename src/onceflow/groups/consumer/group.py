"""One consumer group (KIP-848): what its records say, and the states derived from it.

Theory of operation
-------------------
Everything in a `ConsumerGroup` that matters after a restart comes from replaying its
records (`replay`): the group epoch, the subscribed topics' metadata, each member's
subscription and current assignment, the target assignment and its epoch, and the
resolved regular expressions. Two indexes are maintained by replay too: static members
(instance id -> member id) and partition epochs (which member epoch holds each
partition - assigned or still being revoked), which the reconciliation asks to know
whether a partition is free.

Soft state, lost on restart as in Kafka: the metadata refresh deadline and the regex
refresh bookkeeping. Timers (sessions, rebalance timeouts) live in the coordinator.

The group's state is derived, as Kafka derives it (ConsumerGroup.maybeUpdateGroupState):

    Empty        no members
    Assigning    group epoch > assignment epoch: a new target is due
    Reconciling  some member is not yet STABLE at the assignment epoch
    Stable       every member owns exactly its target partitions

so there is no transition to guard: every state is a function of the records. How each
request is answered in each state is in GROUP_STATE_DOCS.

Requests change a group by *replaying the records they produce at once*, before those
records are durable (Kafka's coordinator runtime does the same: its timeline state is
updated on write and rolled back if the write fails). The response waits until the
records are durable; if the append fails, `snapshot()`/`restore()` put the group back.
"""

from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass, field

from onceflow.groups.consumer import records as cr
from onceflow.groups.consumer.member import (
    LEAVE_GROUP_MEMBER_EPOCH,
    NO_PARTITION_EPOCH,
    ConsumerMember,
    MemberState,
)
from onceflow.groups.consumer.records import ResolvedRegex, TopicMetadata, TopicPartition

CONSUMER_GROUP_TYPE = "consumer"
CONSUMER_PROTOCOL_TYPE = "consumer"
_INCARNATIONS = itertools.count(1_000_000_000)  # apart from classic groups' incarnations

GROUP_STATE_DOCS = {
    "Empty": "No members. A heartbeat with epoch 0 joins (and bumps the group epoch); "
             "OffsetCommit from epoch -1 (admin, standalone consumers) is accepted; "
             "DeleteGroups and a classic JoinGroup (conversion) are accepted.",
    "Assigning": "Transient within one heartbeat: the heartbeat that bumped the group "
                 "epoch computes the new target at once.",
    "Reconciling": "Members move towards the target: heartbeats revoke, then assign; "
                   "OffsetCommit needs the member's current epoch (STALE_MEMBER_EPOCH).",
    "Stable": "Every member owns its target. Heartbeats are answered with the same "
              "epoch; a changed subscription or topic metadata bumps the group epoch.",
}


@dataclass(slots=True)
class Snapshot:
    """A group's replayed state, to restore when its append fails."""

    fields: dict = field(default_factory=dict)


class ConsumerGroup:
    def __init__(self, group_id: str, partition: int) -> None:
        self.group_id = group_id
        self.partition = partition  # of __consumer_offsets
        self.incarnation = next(_INCARNATIONS)  # tells timers of a re-created group apart
        self.group_epoch = 0
        self.assignment_epoch = 0
        self.members: dict[str, ConsumerMember] = {}
        self.static_members: dict[str, str] = {}  # instance id -> member id
        self.target: dict[str, frozenset[TopicPartition]] = {}
        self.partition_epochs: dict[TopicPartition, int] = {}
        self.subscription_metadata: dict[str, TopicMetadata] = {}
        self.resolved_regexes: dict[str, ResolvedRegex] = {}
        # soft: the topics image the subscription metadata was last computed from, and
        # when the regexes were last resolved (Kafka keeps both in memory only)
        self.metadata_image_version = -1
        self.regex_refresh_ms = -(2**62)
        self.rebalance_epochs: dict[str, int] = {}  # member -> epoch its rebalance timer is for

    def __repr__(self) -> str:
        return (f"ConsumerGroup({self.group_id!r}, {self.state}, epoch={self.group_epoch}, "
                f"assignment_epoch={self.assignment_epoch}, members={list(self.members)})")

    # ------------------------------------------------------------ derived facts

    @property
    def state(self) -> str:
        if not self.members:
            return "Empty"
        if self.group_epoch > self.assignment_epoch:
            return "Assigning"
        if any(not m.is_reconciled_to(self.assignment_epoch) for m in self.members.values()):
            return "Reconciling"
        return "Stable"

    def is_empty(self) -> bool:
        return not self.members

    def holder_epoch(self, tp: TopicPartition) -> int:
        return self.partition_epochs.get(tp, NO_PARTITION_EPOCH)

    def static_member(self, instance_id: str | None) -> ConsumerMember | None:
        member_id = self.static_members.get(instance_id) if instance_id is not None else None
        return self.members.get(member_id) if member_id is not None else None

    def target_of(self, member_id: str, instance_id: str | None) -> frozenset[TopicPartition]:
        """A member's target; a static member replacing another inherits the other's."""
        if member_id in self.target:
            return self.target[member_id]
        previous = self.static_members.get(instance_id) if instance_id is not None else None
        return self.target.get(previous, frozenset()) if previous is not None else frozenset()

    def subscribed_topic_names(self, without: str | None = None,
                               extra: ConsumerMember | None = None,
                               resolved_regexes: dict[str, ResolvedRegex] | None = None
                               ) -> set[str]:
        """Topic names the members subscribe to, by name or through a resolved regex
        (`resolved_regexes`: a resolution about to be written instead of the group's)."""
        regexes = self.resolved_regexes if resolved_regexes is None else resolved_regexes
        names: set[str] = set()
        for member in [*(m for mid, m in self.members.items() if mid != without),
                       *([extra] if extra is not None else [])]:
            names.update(member.subscribed_topic_names)
            resolved = regexes.get(member.subscribed_topic_regex or "")
            if resolved is not None:
                names.update(resolved.topics)
        return names

    def regex_subscribers(self, regex: str) -> int:
        return sum(1 for m in self.members.values() if m.subscribed_topic_regex == regex)

    def preferred_assignor(self, default: str) -> str:
        """The server assignor most members ask for (Kafka's computePreferredServerAssignor)."""
        counts: dict[str, int] = {}
        for member in self.members.values():
            if member.server_assignor:
                counts[member.server_assignor] = counts.get(member.server_assignor, 0) + 1
        return max(counts, key=counts.__getitem__) if counts else default

    # ------------------------------------------------------------ snapshots

    _SNAPSHOT_FIELDS = ("group_epoch", "assignment_epoch", "members", "static_members",
                        "target", "partition_epochs", "subscription_metadata",
                        "resolved_regexes", "metadata_image_version", "regex_refresh_ms")

    def snapshot(self) -> Snapshot:
        """Shallow copies suffice: members, assignments and metadata are frozen values."""
        return Snapshot({name: (dict(v) if isinstance(v := getattr(self, name), dict) else v)
                         for name in self._SNAPSHOT_FIELDS})

    def restore(self, snapshot: Snapshot) -> None:
        for name, value in snapshot.fields.items():
            setattr(self, name, value)

    # ------------------------------------------------------------ replay

    def replay(self, key: cr.ConsumerKey, value: bytes | None) -> None:
        """Apply one record of this group (loading and live requests alike)."""
        kind = key.record_type
        if kind == cr.GROUP_METADATA:
            self.group_epoch = cr.decode_epoch(value) if value is not None else self.group_epoch
        elif kind == cr.PARTITION_METADATA:
            topics = cr.decode_partition_metadata(value) if value is not None else ()
            self.subscription_metadata = {t.name: t for t in topics}
        elif kind == cr.TARGET_ASSIGNMENT_METADATA:
            self.assignment_epoch = cr.decode_epoch(value) if value is not None else -1
        elif kind == cr.TARGET_ASSIGNMENT_MEMBER:
            assert key.member is not None
            if value is None:
                self.target.pop(key.member, None)
            else:
                self.target[key.member] = cr.decode_target_member(value)
        elif kind == cr.MEMBER_METADATA:
            self._replay_member_metadata(key.member, value)
        elif kind == cr.CURRENT_MEMBER_ASSIGNMENT:
            self._replay_member_assignment(key.member, value)
        elif kind == cr.REGULAR_EXPRESSION:
            assert key.member is not None
            if value is None:
                self.resolved_regexes.pop(key.member, None)
            else:
                self.resolved_regexes[key.member] = cr.decode_regex(value)
        else:
            raise AssertionError(f"not a consumer group record type: {kind}")

    def _replay_member_metadata(self, member_id: str | None, value: bytes | None) -> None:
        assert member_id is not None
        old = self.members.get(member_id)
        if value is None:
            if old is None:
                return
            assert old.member_epoch == LEAVE_GROUP_MEMBER_EPOCH, (
                f"member {member_id} removed before its assignment tombstone")
            self._put(member_id, None)
            return
        base = old if old is not None else ConsumerMember(member_id)
        self._put(member_id, base.with_subscription(cr.decode_member_metadata(value)))

    def _replay_member_assignment(self, member_id: str | None, value: bytes | None) -> None:
        assert member_id is not None
        old = self.members.get(member_id)
        if value is None:
            if old is not None:  # Kafka: the member stays until its metadata tombstone
                self._put(member_id, ConsumerMember(
                    member_id, old.instance_id, old.rack_id, old.client_id, old.client_host,
                    old.subscribed_topic_names, old.subscribed_topic_regex,
                    old.rebalance_timeout_ms, old.server_assignor,
                    LEAVE_GROUP_MEMBER_EPOCH, LEAVE_GROUP_MEMBER_EPOCH, MemberState.STABLE))
            return
        base = old if old is not None else ConsumerMember(member_id)
        self._put(member_id, base.with_assignment(cr.decode_member_assignment(value)))

    def _put(self, member_id: str, new: ConsumerMember | None) -> None:
        """Replace a member, keeping the static-member and partition-epoch indexes."""
        old = self.members.pop(member_id, None)
        if old is not None:
            for tp in old.assigned | old.pending_revocation:
                held = self.partition_epochs.pop(tp, None)
                assert held == old.member_epoch, (
                    f"{tp} held at epoch {held}, not {old.member_epoch} of {member_id}")
            if old.instance_id is not None and self.static_members.get(old.instance_id) == member_id:
                del self.static_members[old.instance_id]
        if new is None:
            return
        self.members[member_id] = new
        if new.instance_id is not None:
            self.static_members[new.instance_id] = member_id
        for tp in new.assigned | new.pending_revocation:
            assert tp not in self.partition_epochs, f"{tp} would be held twice ({member_id})"
            self.partition_epochs[tp] = new.member_epoch

    # ------------------------------------------------------------ records of the whole group

    def tombstones(self) -> list:
        """Records deleting the group (Kafka's createGroupTombstoneRecords), in Kafka's order."""
        gid = self.group_id
        out = [cr.record(cr.CURRENT_MEMBER_ASSIGNMENT, gid, None, m) for m in self.members]
        out += [cr.record(cr.TARGET_ASSIGNMENT_MEMBER, gid, None, m) for m in self.target]
        out.append(cr.record(cr.TARGET_ASSIGNMENT_METADATA, gid, None))
        out += [cr.record(cr.MEMBER_METADATA, gid, None, m) for m in self.members]
        out += [cr.record(cr.REGULAR_EXPRESSION, gid, None, r) for r in self.resolved_regexes]
        out.append(cr.record(cr.PARTITION_METADATA, gid, None))
        out.append(cr.record(cr.GROUP_METADATA, gid, None))
        return out


def topic_ids(metadata: dict[str, TopicMetadata], names: set[str]) -> dict[uuid.UUID, int]:
    """{topic id: partition count} of the subscribed names that exist."""
    return {metadata[n].topic_id: metadata[n].num_partitions for n in names if n in metadata}
