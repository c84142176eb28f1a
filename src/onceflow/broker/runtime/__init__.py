"""Coordinator runtimes: drive the sans-IO coordinators (`onceflow.groups`, `onceflow.txn`)
with real storage, on the broker's event loop.

| module | concern |
|---|---|
| common.py | `CoordinatorRuntime`: what both runtimes share - the internal topic (created on first use or loaded at startup), appends made durable then replayed, the loop timer, routing, compaction |
| groups.py | `GroupRuntime`: `__consumer_offsets`; JoinGroup/SyncGroup answered through callbacks |
| txn.py | `TxnRuntime`: `__transaction_state`, the crash point, verification for the produce path |
| markers.py | writing a decided transaction's COMMIT/ABORT markers into its partitions |
| log_io.py | a coordinator `Append` -> record batch, stored batches -> `LogEntry`s |
| compaction.py | `Compactor`: keeps both internal topics bounded (rewrites closed segments) |

The runtimes sit above `BrokerState` (they append through its partitions) and below the
handlers, which only translate kio requests into coordinator calls and results into
responses; everything that touches a log or the clock for groups and transactions goes
through a runtime. `BrokerState` knows nothing of them: the server builds both runtimes
and hands them to the handlers (broker/server.py).
"""
