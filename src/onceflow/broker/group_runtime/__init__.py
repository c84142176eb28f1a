"""The broker side of consumer groups: drives `onceflow.coordinator` with real storage.

| module | concern |
|---|---|
| runtime.py | `GroupRuntime`: JoinGroup/SyncGroup answers over the shared `CoordinatorRuntime` (persist loop, timers, loading, routing) |
| log_io.py | `Append` -> record batch, stored batches -> `LogEntry`s |
| compaction.py | `Compactor`: keeps `__consumer_offsets` and `__transaction_state` bounded (rewrites closed segments) |

Handlers (broker/handlers/groups.py, offsets.py, coordinators.py) only translate kio
requests to coordinator calls and coordinator results to responses; everything that
touches the log or the clock for groups goes through `GroupRuntime`.

log_io.py and compaction.py serve the transaction runtime too (through
`onceflow.broker.coordinator_runtime`), which is why the names below are imported lazily:
importing those two modules must not import runtime.py, which imports the shared base.
"""

from __future__ import annotations

from typing import Any

__all__ = ["OFFSETS_TOPIC", "GroupRuntime"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from onceflow.broker.group_runtime import runtime
        return getattr(runtime, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
