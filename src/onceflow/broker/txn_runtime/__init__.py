"""The broker side of transactions: drives `onceflow.txn` with real storage.

| module | concern |
|---|---|
| runtime.py | `TxnRuntime`: `__transaction_state` (created, loaded, appended to through the shared `CoordinatorRuntime`), timers, the crash point, verification for the produce path |
| markers.py | writing a decided transaction's COMMIT/ABORT markers into its partitions |

Handlers (broker/handlers/transactions.py, producer_ids.py, coordinators.py, and the
transaction checks in produce.py and offsets.py) only translate kio requests to
coordinator calls and results to responses; everything that touches a log or the clock
for transactions goes through `TxnRuntime`.
"""

from onceflow.broker.txn_runtime.runtime import TRANSACTION_STATE_TOPIC, TxnRuntime

__all__ = ["TRANSACTION_STATE_TOPIC", "TxnRuntime"]
