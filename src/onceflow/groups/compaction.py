"""Compaction of __consumer_offsets: keep what replay needs, drop the rest.

Theory of operation
-------------------
`compact(entries, now_ms, tombstone_retention_ms)` is a pure function from the entries of
a partition (in offset order) to the subset that replays to the same groups and offsets.
The broker runs it over a partition's closed segments and rewrites them with the result
(offsets are kept, so `record_offset` comparisons in replay are unaffected); this keeps
the topic bounded by the number of live keys instead of the number of commits.

Rules (those of Kafka's log cleaner for a compacted topic with transactions):

* Only the *stable prefix* is compacted: entries before the first record of a
  transaction that has no COMMIT/ABORT marker yet are cleaned; from there on, everything
  is kept verbatim (Kafka never cleans past the first unstable offset).
* In the prefix, records of aborted transactions are dropped: they never became visible.
* Among the remaining records (plain ones, and those of committed transactions), only the
  newest per key survives; a tombstone that is the newest survives until it is older than
  `tombstone_retention_ms`, so that a reader replaying slowly still sees the deletion.
* A marker survives while a record it settles survives (else that record would replay as
  pending forever); markers whose records are all gone are dropped.

Cost is one pass to settle transactions and one to pick survivors, O(n) time and O(keys)
memory beyond the input.
"""

from __future__ import annotations

from collections.abc import Sequence

from onceflow.groups.records import LogEntry, LogRecord, TxnMarker

_OPEN = 0
_COMMITTED = 1
_ABORTED = 2


def _settle(entries: Sequence[LogEntry]) -> tuple[list[int], dict[int, list[int]], int]:
    """Outcome of every entry's transaction, the records each marker settles, and the
    index where the unstable suffix starts (len(entries) if everything is settled)."""
    outcome = [_COMMITTED] * len(entries)  # plain records count as committed
    settles: dict[int, list[int]] = {}  # marker index -> indices of the records it settles
    open_records: dict[int, list[int]] = {}  # producer id -> record indices since its last marker
    for i, entry in enumerate(entries):
        if isinstance(entry, TxnMarker):
            settled = open_records.pop(entry.producer_id, [])
            result = _COMMITTED if entry.commit else _ABORTED
            for j in settled:
                outcome[j] = result
            settles[i] = settled
        elif entry.producer_id >= 0:
            open_records.setdefault(entry.producer_id, []).append(i)
            outcome[i] = _OPEN
    unstable_from = min((indices[0] for indices in open_records.values()), default=len(entries))
    return outcome, settles, unstable_from


def compact(entries: Sequence[LogEntry], now_ms: int,
            tombstone_retention_ms: int) -> list[LogEntry]:
    """The entries (in their order) that replay to the same state as `entries`."""
    for a, b in zip(entries, entries[1:], strict=False):
        assert a.offset < b.offset, f"entries out of order at offset {b.offset}"
    outcome, settles, unstable_from = _settle(entries)
    newest: dict[bytes, int] = {}  # key -> index of its newest visible record in the prefix
    for i in range(unstable_from):
        entry = entries[i]
        if isinstance(entry, LogRecord) and outcome[i] == _COMMITTED:
            newest[entry.key] = i
    keep = bytearray(len(entries))
    for i in newest.values():
        record = entries[i]
        assert isinstance(record, LogRecord)
        if record.value is not None or now_ms - record.timestamp_ms < tombstone_retention_ms:
            keep[i] = 1
    for i in range(unstable_from, len(entries)):
        keep[i] = 1
    for i, settled in settles.items():
        if i < unstable_from and any(keep[j] for j in settled):
            keep[i] = 1
    return [entry for entry, kept in zip(entries, keep, strict=True) if kept]
