"""The transaction coordinator and the `__transaction_state` it keeps.

Sans-IO, built like the group coordinator (`onceflow.groups`) so the broker drives both
the same way: see `coordinator.py` for the theory of operation and the broker's contract,
`api.py` for what goes in and out, `state.py` for the state machine (and how each state
answers each request), `handlers.py` for the request rules, `metadata.py` for the metadata
and its transitions, `markers.py` for writing a decided transaction's markers, `records.py`
for the on-disk format.
"""

from onceflow.txn.api import (
    Append,
    Appended,
    AppendFailed,
    AppendOutcome,
    DescribedTransaction,
    InitProducerIdResult,
    ListedTransaction,
    ListTransactionsResult,
    MarkerWrite,
    Result,
    TopicPartition,
    TxnMarker,
    TxnResult,
)
from onceflow.txn.config import TxnConfig
from onceflow.txn.coordinator import TransactionCoordinator
from onceflow.txn.metadata import TxnMetadata
from onceflow.txn.records import TxnLogValue, partition_for
from onceflow.txn.state import VALID_PREVIOUS_STATES, IllegalTransition, TxnState

TRANSACTION_STATE_TOPIC = "__transaction_state"

__all__ = [
    "Append", "AppendFailed", "AppendOutcome", "Appended", "DescribedTransaction",
    "IllegalTransition", "InitProducerIdResult", "ListTransactionsResult", "ListedTransaction",
    "MarkerWrite", "Result", "TRANSACTION_STATE_TOPIC", "TopicPartition",
    "TransactionCoordinator", "TxnConfig", "TxnLogValue", "TxnMarker", "TxnMetadata",
    "TxnResult", "TxnState", "VALID_PREVIOUS_STATES", "partition_for",
]
