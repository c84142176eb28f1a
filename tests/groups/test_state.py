"""The state machine table: every legal edge works, every other edge raises."""

import itertools

import pytest

from onceflow.groups.group import Group
from onceflow.groups.state import (
    CAN_REBALANCE,
    LEGAL_TRANSITIONS,
    GroupState,
    IllegalTransition,
    check_transition,
    parse_state_filter,
)

S = GroupState

# Kafka's validPreviousStates (GroupMetadata.scala), written the other way round
KAFKA_VALID_PREVIOUS = {
    S.PREPARING_REBALANCE: {S.STABLE, S.COMPLETING_REBALANCE, S.EMPTY},
    S.COMPLETING_REBALANCE: {S.PREPARING_REBALANCE},
    S.STABLE: {S.COMPLETING_REBALANCE},
    S.DEAD: {S.STABLE, S.PREPARING_REBALANCE, S.COMPLETING_REBALANCE, S.EMPTY, S.DEAD},
    S.EMPTY: {S.PREPARING_REBALANCE},
}


@pytest.mark.parametrize("current,target", list(itertools.product(S, S)))
def test_every_pair_is_legal_exactly_when_kafka_allows_it(current, target):
    group = Group("g", 0, current, now_ms=5)
    if current in KAFKA_VALID_PREVIOUS[target]:
        group.transition(target, now_ms=7)
        assert group.state is target and group.state_timestamp_ms == 7
    else:
        with pytest.raises(IllegalTransition):
            group.transition(target, now_ms=7)
        assert group.state is current and group.state_timestamp_ms == 5


def test_table_matches_kafka():
    for current, targets in LEGAL_TRANSITIONS.items():
        assert targets == {t for t, prev in KAFKA_VALID_PREVIOUS.items() if current in prev}


def test_rebalance_can_start_from_empty_stable_and_completing():
    assert CAN_REBALANCE == {S.EMPTY, S.STABLE, S.COMPLETING_REBALANCE}


@pytest.mark.parametrize("state", list(S))
def test_each_state_documents_every_request(state):
    doc = state.__doc__
    assert doc
    if state is not S.DEAD:
        for api in ("JoinGroup", "SyncGroup", "Heartbeat", "LeaveGroup", "OffsetCommit",
                    "OffsetFetch"):
            assert api in doc, (state, api)


def test_names_are_kafkas_and_filter_is_case_insensitive():
    assert [s.value for s in S] == ["Empty", "PreparingRebalance", "CompletingRebalance",
                                    "Stable", "Dead"]
    assert parse_state_filter(["stable", "EMPTY", "nonsense"]) == {S.STABLE, S.EMPTY}


def test_check_transition_message_names_the_group():
    with pytest.raises(IllegalTransition, match="'g1'.*Stable -> Empty"):
        check_transition("g1", S.STABLE, S.EMPTY)
