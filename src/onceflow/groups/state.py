"""The classic group state machine: one enum, one table, one guarded transition.

A missing entry in `LEGAL_TRANSITIONS` *is* the bug: `check_transition` raises
`IllegalTransition` (our own broken invariant, never a client error). The table is
Kafka's `validPreviousStates` (GroupMetadata.scala / ClassicGroupState.java) turned
around, with one addition spelled out: Dead -> Dead, which Kafka also allows (a group
deleted by DeleteGroups may be unloaded afterwards).

Each state's docstring says how every group request is answered in it; the handlers in
`membership.py` and `offsets.py` implement exactly these rules.
"""

from __future__ import annotations

import enum


class IllegalTransition(RuntimeError):
    """A group was asked to move along an edge that is not in LEGAL_TRANSITIONS."""


class GroupState(enum.Enum):
    """State of a classic group; `.value` is Kafka's name (DescribeGroups, ListGroups)."""

    def __new__(cls, value: str, doc: str) -> GroupState:
        member = object.__new__(cls)
        member._value_ = value
        member.__doc__ = doc
        return member

    EMPTY = (
        "Empty",
        """No members; the group lingers for its committed offsets (this is also the state
        of a "simple" group that only commits offsets).

        JoinGroup: a new member is accepted (MEMBER_ID_REQUIRED first for v4+ dynamic
          members) -> PreparingRebalance with the initial rebalance delay; a known
          member id -> UNKNOWN_MEMBER_ID.
        SyncGroup, Heartbeat: UNKNOWN_MEMBER_ID (after member/generation checks).
        LeaveGroup: UNKNOWN_MEMBER_ID per member.
        OffsetCommit: accepted from generation -1 (standalone consumers, admin);
          otherwise member and generation checks -> UNKNOWN_MEMBER_ID / ILLEGAL_GENERATION.
        OffsetFetch: answered. DeleteGroups / OffsetDelete: accepted.
        Leaves: to PreparingRebalance (first join), to Dead (deleted, expired, unloaded).""",
    )
    PREPARING_REBALANCE = (
        "PreparingRebalance",
        """A rebalance started; waiting for every member to (re)send JoinGroup or for the
        rebalance timeout (the initial delay for a group that was Empty).

        JoinGroup: held (pending entry) until the join phase completes; then answered with
          the new generation (the leader also gets every member's metadata).
        SyncGroup: REBALANCE_IN_PROGRESS. Heartbeat: REBALANCE_IN_PROGRESS (session kept).
        LeaveGroup: the member is removed; the join phase may complete at once.
        OffsetCommit: accepted from current members of the current generation (the
          heartbeat answer tells them to rejoin). OffsetFetch: answered.
        DeleteGroups: NON_EMPTY_GROUP. OffsetDelete: NON_EMPTY_GROUP unless the
          protocol type is "consumer" (then GROUP_SUBSCRIBED_TO_TOPIC per subscribed topic).
        Leaves: to CompletingRebalance (members joined), to Empty (none left), to Dead.""",
    )
    COMPLETING_REBALANCE = (
        "CompletingRebalance",
        """A generation is formed; waiting for the leader's SyncGroup with the assignment.

        JoinGroup: a member with unchanged metadata gets the current generation again;
          changed metadata (or a static member's replacement) -> PreparingRebalance.
        SyncGroup: held until the leader's assignment is durable; the leader's request
          writes the group record, whose replay answers every held SyncGroup.
        Heartbeat: NONE (session kept). LeaveGroup: member removed -> PreparingRebalance.
        OffsetCommit: REBALANCE_IN_PROGRESS (TxnOffsetCommit is accepted).
        OffsetFetch: answered. DeleteGroups: NON_EMPTY_GROUP.
        Leaves: to Stable (assignment durable), to PreparingRebalance, to Dead.""",
    )
    STABLE = (
        "Stable",
        """Every member has its assignment for the current generation.

        JoinGroup: from the leader or with changed metadata -> PreparingRebalance; from a
          follower with unchanged metadata -> the current generation; from a static member
          with a new member id -> the old id is replaced (and fenced) without a rebalance
          when the selected protocol does not change.
        SyncGroup: the member's assignment. Heartbeat: NONE.
        LeaveGroup: member removed -> PreparingRebalance.
        OffsetCommit: accepted from current members of the current generation.
        OffsetFetch: answered. DeleteGroups: NON_EMPTY_GROUP.
        Leaves: to PreparingRebalance, to Dead (unloaded).""",
    )
    DEAD = (
        "Dead",
        """The group is being removed (deleted, expired, or its partition unloaded).

        Every group request: COORDINATOR_NOT_AVAILABLE (the client looks the coordinator
        up again), except OffsetFetch / DescribeGroups, which see no group.
        Leaves: nowhere.""",
    )


_S = GroupState

# target states reachable from each state (Kafka's validPreviousStates, inverted)
LEGAL_TRANSITIONS: dict[GroupState, frozenset[GroupState]] = {
    _S.EMPTY: frozenset({_S.PREPARING_REBALANCE, _S.DEAD}),
    _S.PREPARING_REBALANCE: frozenset({_S.COMPLETING_REBALANCE, _S.EMPTY, _S.DEAD}),
    _S.COMPLETING_REBALANCE: frozenset({_S.STABLE, _S.PREPARING_REBALANCE, _S.DEAD}),
    _S.STABLE: frozenset({_S.PREPARING_REBALANCE, _S.DEAD}),
    _S.DEAD: frozenset({_S.DEAD}),
}

# states from which a rebalance may start (Kafka: GroupMetadata.canRebalance)
CAN_REBALANCE = frozenset(s for s, targets in LEGAL_TRANSITIONS.items()
                          if _S.PREPARING_REBALANCE in targets)


def check_transition(group_id: str, current: GroupState, target: GroupState) -> None:
    """Raise IllegalTransition unless current -> target is in the table."""
    if target not in LEGAL_TRANSITIONS[current]:
        raise IllegalTransition(
            f"group {group_id!r}: illegal transition {current.value} -> {target.value}"
        )


def parse_state_filter(states: list[str] | tuple[str, ...]) -> frozenset[GroupState]:
    """ListGroups' states filter: Kafka compares lower-cased names; unknown names match nothing."""
    wanted = {s.lower() for s in states}
    return frozenset(s for s in GroupState if s.value.lower() in wanted)
