"""The transaction state table: Kafka's edges and ids, every other edge raises."""

import itertools

import pytest

from onceflow.txn.state import (
    EXPIRATION_ALLOWED,
    NEVER_WRITTEN,
    VALID_PREVIOUS_STATES,
    IllegalTransition,
    TxnState,
    check_transition,
    parse_state_filters,
)

S = TxnState

# Kafka's TransactionState (TransactionMetadata.scala, 3.x/4.0 with transaction.version < 2):
# id, name, validPreviousStates
KAFKA = {
    S.EMPTY: (0, "Empty", {S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.ONGOING: (1, "Ongoing", {S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_COMMIT: (2, "PrepareCommit", {S.ONGOING}),
    # Kafka 4.0: Empty/Complete* -> PrepareAbort for transactions V2 (KIP-890 part 2)
    S.PREPARE_ABORT: (3, "PrepareAbort", {S.ONGOING, S.PREPARE_EPOCH_FENCE, S.EMPTY,
                                          S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.COMPLETE_COMMIT: (4, "CompleteCommit", {S.PREPARE_COMMIT}),
    S.COMPLETE_ABORT: (5, "CompleteAbort", {S.PREPARE_ABORT}),
    S.DEAD: (6, "Dead", {S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_EPOCH_FENCE: (7, "PrepareEpochFence", {S.ONGOING}),
}


@pytest.mark.parametrize("current,target", list(itertools.product(S, S)))
def test_every_pair_is_legal_exactly_when_kafka_allows_it(current, target):
    if current in KAFKA[target][2]:
        check_transition("t", current, target)
    else:
        with pytest.raises(IllegalTransition, match=f"{current.value} -> {target.value}"):
            check_transition("t", current, target)


def test_ids_and_names_are_kafkas():
    assert {s: (s.id, s.value) for s in S} == {s: v[:2] for s, v in KAFKA.items()}
    assert all(TxnState.from_id(s.id) is s for s in S)
    with pytest.raises(ValueError):
        TxnState.from_id(8)
    assert set(VALID_PREVIOUS_STATES) == set(S)


def test_expiration_and_never_written_sets():
    assert EXPIRATION_ALLOWED == {S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}
    assert NEVER_WRITTEN == {S.PREPARE_EPOCH_FENCE, S.DEAD}


@pytest.mark.parametrize("state", list(S))
def test_each_state_documents_every_request(state):
    doc = state.__doc__
    assert "Leaves:" in doc
    if state not in NEVER_WRITTEN:
        for api in ("InitProducerId", "AddPartitionsToTxn", "AddOffsetsToTxn", "EndTxn"):
            assert api in doc, (state, api)


def test_state_filters_match_exact_names():
    known, unknown = parse_state_filters(["Ongoing", "ongoing", "Nope", "CompleteAbort"])
    assert known == {S.ONGOING, S.COMPLETE_ABORT}
    assert unknown == ("ongoing", "Nope")
