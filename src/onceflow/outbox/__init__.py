"""The transactional outbox: database writes that reach Kafka exactly once.

An application writes its business rows and, in the same database transaction, outbox
rows (`publish`); a relay (`Relay`, `onceflow outbox relay`) publishes the committed
outbox rows to Kafka in a Kafka transaction together with its progress, so each row is
published exactly once and in order, whatever crashes. store.py is the table (and how
its sequence numbers follow commit order, PostgreSQL included), progress.py the
relay's position in Kafka, relay.py the loop. See docs/databases.md.
"""

from __future__ import annotations

from onceflow.outbox.progress import DEFAULT_PROGRESS_TOPIC, Progress, ProgressError
from onceflow.outbox.relay import BatchReport, Relay, RelayConfig, RelayError, RelayFenced
from onceflow.outbox.store import (
    DEFAULT_TABLE,
    Backlog,
    OutboxError,
    OutboxRow,
    backlog,
    create_outbox,
    outbox_id,
    pending,
    prune,
    publish,
)

__all__ = ["DEFAULT_PROGRESS_TOPIC", "DEFAULT_TABLE", "Backlog", "BatchReport", "OutboxError",
           "OutboxRow", "Progress", "ProgressError", "Relay", "RelayConfig", "RelayError",
           "RelayFenced", "backlog", "create_outbox", "outbox_id", "pending", "prune", "publish"]
