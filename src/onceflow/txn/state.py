"""The transaction state machine: one enum, one table, one guarded transition.

The table is Kafka's `TransactionState.validPreviousStates` (TransactionMetadata.scala,
transaction.version 0/1 - the classic protocol every client we serve speaks), kept in the
direction Kafka writes it: for each state, the states it may be entered from. A missing
entry *is* the bug: `check_transition` raises `IllegalTransition`, our own broken invariant
and never a client error (clients get Kafka error codes, decided before any transition is
prepared).

Two states are never written to `__transaction_state`:

- PrepareEpochFence is a *pending* state only (as in Kafka): fencing an Ongoing transaction
  prepares Ongoing -> PrepareEpochFence (epoch + 1) and at once PrepareEpochFence ->
  PrepareAbort; the record written is the PrepareAbort with the bumped epoch.
- Dead is what a tombstone means: replaying it checks the edge, then forgets the id.

Each state's docstring says how every coordinator request is answered in it, after the
common checks (the coordinator owns and has loaded the id's partition; for AddPartitions,
AddOffsets and EndTxn the producer id matches, else INVALID_PRODUCER_ID_MAPPING, and the
epoch equals the current one, else PRODUCER_FENCED; a transition already in flight for the
id - a pending write, markers being written, a tombstone being written - answers
CONCURRENT_TRANSACTIONS). `coordinator.py` and `handlers.py` implement exactly these rules.
"""

from __future__ import annotations

import enum


class IllegalTransition(RuntimeError):
    """A transaction was asked to move along an edge that is not in VALID_PREVIOUS_STATES."""


class TxnState(enum.Enum):
    """State of one transactional id; `.value` is Kafka's name, `.id` its int8 in the log."""

    def __new__(cls, value: str, state_id: int, doc: str) -> TxnState:
        member = object.__new__(cls)
        member._value_ = value
        member.id = state_id
        member.__doc__ = doc
        return member

    id: int

    EMPTY = (
        "Empty", 0,
        """No transaction open: just initialised (InitProducerId) or nothing since.

        InitProducerId: same producer id, epoch + 1 (fences older instances); a new producer
          id with epoch 0 when the epoch is exhausted.
        AddPartitionsToTxn / AddOffsetsToTxn: the partitions are recorded -> Ongoing (the
          transaction starts now: txn_start_timestamp).
        EndTxn: INVALID_TXN_STATE (nothing to end); transactions V2: EndTxn(abort) bumps
          the epoch -> PrepareAbort with no partition.
        Leaves: to Empty (InitProducerId), Ongoing (first partition), PrepareAbort (V2),
          Dead (expired).""",
    )
    ONGOING = (
        "Ongoing", 1,
        """A transaction is open; its partitions are recorded.

        InitProducerId: the open transaction is aborted first: epoch + 1 and PrepareAbort
          are written (the old producer is fenced), the markers follow, and the client is
          told CONCURRENT_TRANSACTIONS; its retry finds CompleteAbort and bumps again.
        AddPartitionsToTxn / AddOffsetsToTxn: NONE at once when every partition is already
          recorded, else the larger set is written -> Ongoing.
        EndTxn(commit) -> PrepareCommit; EndTxn(abort) -> PrepareAbort. Transactions V2
          (EndTxn v5): the same with epoch + 1 (and a new producer id at exhaustion, taken
          when the markers are done), answered with the new producer id and epoch.
        Timeout (txn_start_timestamp + timeout < now): aborted with an epoch bump, like a
          fencing InitProducerId.
        Leaves: to Ongoing, PrepareCommit, PrepareAbort, PrepareEpochFence (pending only).""",
    )
    PREPARE_COMMIT = (
        "PrepareCommit", 2,
        """The commit is decided (durable); COMMIT markers are being written to every
        partition of the transaction. The EndTxn that asked for it was answered NONE.

        InitProducerId: CONCURRENT_TRANSACTIONS (the client retries until it completes).
        AddPartitionsToTxn / AddOffsetsToTxn: CONCURRENT_TRANSACTIONS.
        EndTxn(commit), a retry: CONCURRENT_TRANSACTIONS; EndTxn(abort): INVALID_TXN_STATE
          (CONCURRENT_TRANSACTIONS while the markers are in flight, which is almost always).
        Leaves: to CompleteCommit once every marker is durable.""",
    )
    PREPARE_ABORT = (
        "PrepareAbort", 3,
        """The abort is decided (durable); ABORT markers are being written.

        InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn: CONCURRENT_TRANSACTIONS.
        EndTxn(abort), a retry: CONCURRENT_TRANSACTIONS; EndTxn(commit): INVALID_TXN_STATE
          (CONCURRENT_TRANSACTIONS while the markers are in flight).
        Leaves: to CompleteAbort once every marker is durable.""",
    )
    COMPLETE_COMMIT = (
        "CompleteCommit", 4,
        """The last transaction committed; every marker is written.

        InitProducerId: epoch + 1 (or a new producer id when exhausted) -> Empty.
        AddPartitionsToTxn / AddOffsetsToTxn: a new transaction starts -> Ongoing.
        EndTxn(commit): NONE (an idempotent retry of the commit that completed);
          EndTxn(abort): INVALID_TXN_STATE.
        Transactions V2 (EndTxn v5): a retry (epoch + 1 = the current one) of the commit
          that completed: NONE with the current epoch; EndTxn(abort) at the current epoch
          aborts an empty transaction (epoch + 1) -> PrepareAbort; otherwise
          INVALID_TXN_STATE (commit) or PRODUCER_FENCED (another epoch).
        Leaves: to Empty, Ongoing, PrepareAbort (V2), Dead (expired).""",
    )
    COMPLETE_ABORT = (
        "CompleteAbort", 5,
        """The last transaction aborted (by the client, a fencing InitProducerId or the
        timeout); every marker is written.

        InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn: as in CompleteCommit.
        EndTxn(abort): NONE (a retry); EndTxn(commit): INVALID_TXN_STATE.
        Transactions V2: as in CompleteCommit, with abort and commit swapped.
        Leaves: to Empty, Ongoing, PrepareAbort (V2), Dead (expired).""",
    )
    DEAD = (
        "Dead", 6,
        """The id expired (idle longer than transactional.id.expiration.ms in Empty or
        Complete*); its tombstone was written and the id is forgotten.

        Never held by a live id: replaying the tombstone checks the edge and removes the id,
        so every request then sees an unknown id (InitProducerId starts afresh with a new
        producer id; the others answer INVALID_PRODUCER_ID_MAPPING; DescribeTransactions
        TRANSACTIONAL_ID_NOT_FOUND).
        Leaves: nowhere.""",
    )
    PREPARE_EPOCH_FENCE = (
        "PrepareEpochFence", 7,
        """Pending only, never written: the epoch is being bumped to fence the producer of
        an Ongoing transaction (a new InitProducerId, or the transaction timed out).

        It is immediately followed by PrepareAbort with the bumped epoch, which is what the
        log holds; requests see the id's current state plus a pending transition
        (CONCURRENT_TRANSACTIONS).
        Leaves: to PrepareAbort.""",
    )

    @classmethod
    def from_id(cls, state_id: int) -> TxnState:
        """The state stored as `state_id` in TransactionLogValue.TransactionStatus."""
        state = _BY_ID.get(state_id)
        if state is None:
            raise ValueError(f"unknown transaction state id {state_id}")
        return state


_S = TxnState
_BY_ID: dict[int, TxnState] = {s.id: s for s in TxnState}

# Kafka's validPreviousStates (TransactionMetadata.scala): the states each state may be
# entered from. Empty/Complete* -> PrepareAbort exist for transactions V2 only (KIP-890
# part 2): a V2 client may abort without knowing whether the broker ever added a
# partition; handlers.decide_end takes those edges only for EndTxn v5+.
VALID_PREVIOUS_STATES: dict[TxnState, frozenset[TxnState]] = {
    _S.EMPTY: frozenset({_S.EMPTY, _S.COMPLETE_COMMIT, _S.COMPLETE_ABORT}),
    _S.ONGOING: frozenset({_S.ONGOING, _S.EMPTY, _S.COMPLETE_COMMIT, _S.COMPLETE_ABORT}),
    _S.PREPARE_COMMIT: frozenset({_S.ONGOING}),
    _S.PREPARE_ABORT: frozenset({_S.ONGOING, _S.PREPARE_EPOCH_FENCE, _S.EMPTY,
                                 _S.COMPLETE_COMMIT, _S.COMPLETE_ABORT}),
    _S.COMPLETE_COMMIT: frozenset({_S.PREPARE_COMMIT}),
    _S.COMPLETE_ABORT: frozenset({_S.PREPARE_ABORT}),
    _S.DEAD: frozenset({_S.EMPTY, _S.COMPLETE_COMMIT, _S.COMPLETE_ABORT}),
    _S.PREPARE_EPOCH_FENCE: frozenset({_S.ONGOING}),
}

# Kafka's isExpirationAllowed: only an id with no transaction in flight may expire.
EXPIRATION_ALLOWED = frozenset({_S.EMPTY, _S.COMPLETE_COMMIT, _S.COMPLETE_ABORT})
# States whose markers are (being) written: the coordinator owes them a completion.
PREPARE_STATES = frozenset({_S.PREPARE_COMMIT, _S.PREPARE_ABORT})
# States never written to the log (see the module docstring).
NEVER_WRITTEN = frozenset({_S.PREPARE_EPOCH_FENCE, _S.DEAD})


def check_transition(transactional_id: str, current: TxnState, target: TxnState) -> None:
    """Raise IllegalTransition unless `target` may be entered from `current`."""
    if current not in VALID_PREVIOUS_STATES[target]:
        raise IllegalTransition(
            f"transactional id {transactional_id!r}: illegal transition "
            f"{current.value} -> {target.value}"
        )


def parse_state_filters(
        names: tuple[str, ...] | list[str]) -> tuple[frozenset[TxnState], tuple[str, ...]]:
    """ListTransactions' state filters: Kafka matches exact names (TransactionState.fromName);
    returns (known states, unknown names) - the unknown ones are echoed in the response."""
    by_name = {s.value: s for s in TxnState}
    known = frozenset(by_name[n] for n in names if n in by_name)
    unknown = tuple(n for n in names if n not in by_name)
    return known, unknown
