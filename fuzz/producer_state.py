"""Fuzz harness: sequences of batches through one partition's producer state.

What runs: `storage.producer_state.ProducerStateManager` as `PartitionState.append` drives it
(prepare, then commit at the offsets the log assigned), fed a sequence of operations decoded
from the input with atheris' FuzzedDataProvider: client batches (idempotent or transactional,
sequence next / repeated / random, epoch same / older / newer), exact retries of earlier
batches (the lost-answer case), transaction markers from the coordinator (transactions V1 and
V2), coordinator writes without sequences, producer-id expiry, and a snapshot written and
loaded back into a fresh manager, which then carries on.

Protocol errors: none. The manager answers bad batches with `Rejected` (a Kafka error code)
and retries with `Duplicate`; nothing may escape it. Invariants checked on every step:

- `prepare` changes nothing (Kafka's prepareUpdate);
- an accepted client batch never repeats a sequence number that an earlier accepted batch of
  the same producer id and epoch already took (since that producer id last expired): no
  record is written twice, and no retry is appended as new data;
- a `Duplicate` names exactly the offsets (and timestamp) of an earlier accepted batch with
  the same producer id, epoch and first and last sequence, and for a transactional batch one
  of the producer's transaction that is still open (never of a transaction a marker ended,
  issue 11);
- at the end, replaying the log (every appended batch through `replay`, expiry at the same
  places) rebuilds the same entries and the same open transactions ("state == replay of the
  log");
- a snapshot loads back to the same entries.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import atheris

from onceflow.protocol.records import NO_SEQUENCE, SEQUENCE_MAX, EndTxnMarker, increment_sequence
from onceflow.storage.producer_state import (
    AppendOrigin,
    AppendPlan,
    BatchFields,
    Duplicate,
    ProducerStateManager,
    Rejected,
    decode_snapshot,
    encode_snapshot,
)

PROTOCOL_ERRORS: tuple[type[BaseException], ...] = ()
MAX_LEN = 256
NOW_MS = 1_700_000_000_000
EXPIRATION_MS = 60_000
PIDS = (-1, 1000, 1001, 1002)
# Coordinator writes (transactional offset commits) go to __consumer_offsets, where clients
# may not produce (the Produce handler refuses internal topics): their producer ids never
# mix client batches and sequence-less writes in one partition, so they get their own.
COORDINATOR_PIDS = (2000, 2001)
MARKER_PIDS = PIDS[1:] + COORDINATOR_PIDS
OPERATIONS_MAX = 40  # a window of 5 batches needs few more; longer runs only slow the fuzzer
_SNAPSHOT_DIR = Path(tempfile.mkdtemp(prefix="fuzz-producer-state-"))
atexit.register(shutil.rmtree, _SNAPSHOT_DIR, True)


@dataclass
class _Appended:
    """One append in the log: what replay needs, and what the invariants compare."""

    batch: BatchFields
    first_offset: int
    marker: EndTxnMarker | None
    origin: AppendOrigin


@dataclass
class _Run:
    manager: ProducerStateManager = field(default_factory=ProducerStateManager)
    log: list[_Appended | tuple[int, int]] = field(default_factory=list)  # or expiry(now, exp)
    # (pid, epoch) -> sequence numbers taken by accepted client batches since pid last expired
    taken: dict[tuple[int, int], set[int]] = field(default_factory=dict)
    now_ms: int = NOW_MS
    loaded_snapshot: bool = False  # a file round trip once per input: the rest stay in memory


def test_one_input(data: bytes) -> None:
    provider = atheris.FuzzedDataProvider(data)
    run = _Run()
    for _ in range(OPERATIONS_MAX):
        if provider.remaining_bytes() == 0:
            break
        operation = provider.ConsumeIntInRange(0, 9)
        if operation <= 4:
            _client_batch(run, provider)
        elif operation == 5:
            _retry(run, provider)
        elif operation == 6:
            _marker(run, provider)
        elif operation == 7:
            _coordinator_write(run, provider)
        elif operation == 8:
            _expire(run, provider)
        else:
            _snapshot_round_trip(run)
    _check_replay(run)


# ------------------------------------------------------------------------------ operations


def _epoch_of(run: _Run, pid: int) -> int:
    entry = run.manager.last_entry(pid)
    return entry.producer_epoch if entry is not None and entry.producer_epoch >= 0 else 0


def _pick_epoch(run: _Run, pid: int, provider: atheris.FuzzedDataProvider) -> int:
    return max(0, _epoch_of(run, pid) + provider.ConsumeIntInRange(-1, 1))


def _client_batch(run: _Run, provider: atheris.FuzzedDataProvider) -> None:
    pid = PIDS[provider.ConsumeIntInRange(0, len(PIDS) - 1)]
    epoch = _pick_epoch(run, pid, provider)
    entry = run.manager.last_entry(pid)
    # Sequences are int32 on the wire: the next one after SEQUENCE_MAX is 0.
    next_seq = increment_sequence(entry.last_seq, 1) \
        if entry is not None and entry.last_seq >= 0 else 0
    choice = provider.ConsumeIntInRange(0, 5)
    if choice <= 2:
        base_sequence = next_seq
    elif choice == 3:
        base_sequence = provider.ConsumeIntInRange(-2, 40)
    elif choice == 4:
        base_sequence = SEQUENCE_MAX - provider.ConsumeIntInRange(0, 3)
    else:
        base_sequence = 0
    batch = BatchFields(
        producer_id=pid if pid >= 0 else -1,
        producer_epoch=epoch if pid >= 0 else -1,
        base_sequence=base_sequence if pid >= 0 else NO_SEQUENCE,
        last_offset_delta=provider.ConsumeIntInRange(0, 4),
        max_timestamp=run.now_ms + provider.ConsumeIntInRange(-1000, 1000),
        is_transactional=provider.ConsumeBool() and pid >= 0,
    )
    _append(run, batch, AppendOrigin.CLIENT, None, 0)


def _retry(run: _Run, provider: atheris.FuzzedDataProvider) -> None:
    client = [a for a in run.log if isinstance(a, _Appended) and a.origin is AppendOrigin.CLIENT
              and a.batch.producer_id >= 0]
    if client:
        earlier = client[-1 - provider.ConsumeIntInRange(0, min(len(client), 8) - 1)]
        _append(run, earlier.batch, AppendOrigin.CLIENT, None, 0)


def _marker(run: _Run, provider: atheris.FuzzedDataProvider) -> None:
    pid = MARKER_PIDS[provider.ConsumeIntInRange(0, len(MARKER_PIDS) - 1)]
    transaction_version = provider.ConsumeIntInRange(0, 2)
    epoch = _pick_epoch(run, pid, provider)
    batch = BatchFields(pid, epoch, NO_SEQUENCE, 0, run.now_ms, True, True)
    marker = EndTxnMarker(provider.ConsumeBool(), provider.ConsumeIntInRange(0, 2))
    _append(run, batch, AppendOrigin.COORDINATOR, marker, transaction_version)


def _coordinator_write(run: _Run, provider: atheris.FuzzedDataProvider) -> None:
    """A transactional offset commit, as the group coordinator writes it: no sequence."""
    pid = COORDINATOR_PIDS[provider.ConsumeIntInRange(0, len(COORDINATOR_PIDS) - 1)]
    batch = BatchFields(pid, _pick_epoch(run, pid, provider), NO_SEQUENCE,
                        provider.ConsumeIntInRange(0, 2), run.now_ms, True, False)
    _append(run, batch, AppendOrigin.COORDINATOR, None, 0)


def _expire(run: _Run, provider: atheris.FuzzedDataProvider) -> None:
    run.now_ms += provider.ConsumeIntInRange(0, 2 * EXPIRATION_MS)
    expired = run.manager.remove_expired(run.now_ms, EXPIRATION_MS)
    run.log.append((run.now_ms, EXPIRATION_MS))
    for pid in expired:
        assert run.manager.last_entry(pid) is None
        for key in [key for key in run.taken if key[0] == pid]:
            del run.taken[key]


def _snapshot_round_trip(run: _Run) -> None:
    manager = run.manager
    entries = manager.entries()
    offset, decoded = decode_snapshot(encode_snapshot(manager.end_offset, entries.values()))
    assert offset == manager.end_offset
    assert decoded == sorted(entries.values(), key=lambda e: e.producer_id)
    if run.loaded_snapshot:
        return
    run.loaded_snapshot = True
    for old in _SNAPSHOT_DIR.iterdir():
        old.unlink()
    manager.write_snapshot(_SNAPSHOT_DIR, manager.end_offset, fsync=False)
    loaded = ProducerStateManager()  # load_latest_snapshot, as recovery does, then carry on
    start = loaded.load_latest_snapshot(_SNAPSHOT_DIR, log_start_offset=0,
                                        log_end_offset=manager.end_offset, now_ms=run.now_ms,
                                        producer_id_expiration_ms=2**62)
    assert start == manager.end_offset, "the snapshot just written did not load"
    assert loaded.entries() == entries, "a loaded snapshot differs from the state"
    assert loaded.first_undecided_offset() == manager.first_undecided_offset()
    run.manager = loaded


# ------------------------------------------------------------------------------ the check


def _append(run: _Run, batch: BatchFields, origin: AppendOrigin, marker: EndTxnMarker | None,
            transaction_version: int) -> None:
    manager = run.manager
    before = (manager.entries(), manager.end_offset, manager.first_undecided_offset())
    outcome = manager.prepare([batch], origin=origin, marker=marker,
                              transaction_version=transaction_version)
    after = (manager.entries(), manager.end_offset, manager.first_undecided_offset())
    assert before == after, "prepare changed the producer state"
    if isinstance(outcome, Rejected):
        assert outcome.batch_index == 0
        return
    if isinstance(outcome, Duplicate):
        assert origin is AppendOrigin.CLIENT, "only client batches can be duplicates"
        _check_duplicate(run, batch, outcome)
        return
    assert isinstance(outcome, AppendPlan)
    first = manager.end_offset
    last = first + outcome.offset_count - 1
    assert outcome.offset_count == batch.last_offset_delta + 1
    if origin is AppendOrigin.CLIENT and batch.producer_id >= 0:
        _take_sequences(run, batch)
    manager.commit(outcome, first, last)
    manager.on_high_watermark_updated(last + 1)
    run.log.append(_Appended(batch, first, marker, origin))


def _sequences(batch: BatchFields) -> set[int]:
    return {(batch.base_sequence + delta) % (SEQUENCE_MAX + 1)
            for delta in range(batch.last_offset_delta + 1)}


def _take_sequences(run: _Run, batch: BatchFields) -> None:
    key = (batch.producer_id, batch.producer_epoch)
    taken = run.taken.setdefault(key, set())
    again = taken & _sequences(batch)
    assert not again, f"accepted {batch} although sequences {sorted(again)} were taken"
    taken |= _sequences(batch)


def _check_duplicate(run: _Run, batch: BatchFields, duplicate: Duplicate) -> None:
    matches = [a for a in run.log if isinstance(a, _Appended)
               and a.origin is AppendOrigin.CLIENT and a.batch.producer_id == batch.producer_id
               and a.batch.producer_epoch == batch.producer_epoch
               and a.batch.base_sequence == batch.base_sequence
               and a.batch.last_offset_delta == batch.last_offset_delta]
    assert matches, f"duplicate of {batch} that was never appended"
    original = matches[-1]
    assert duplicate.first_offset == original.first_offset, "duplicate names other offsets"
    assert duplicate.last_offset == original.first_offset + original.batch.last_offset_delta
    assert duplicate.timestamp_ms == original.batch.max_timestamp
    if batch.is_transactional:
        entry = run.manager.last_entry(batch.producer_id)
        assert entry is not None and entry.current_txn_first_offset is not None, \
            "a transactional duplicate although the producer has no open transaction"
        assert original.first_offset >= entry.current_txn_first_offset, \
            "a transactional duplicate of a batch whose transaction has ended"


def _check_replay(run: _Run) -> None:
    replayed = ProducerStateManager()
    for item in run.log:
        if isinstance(item, tuple):
            replayed.remove_expired(*item)
            continue
        replayed.replay(item.batch, item.first_offset, item.marker)
        replayed.on_high_watermark_updated(item.first_offset + item.batch.last_offset_delta + 1)
    assert replayed.entries() == run.manager.entries(), "replaying the log gives another state"
    assert replayed.first_undecided_offset() == run.manager.first_undecided_offset()
    assert replayed.end_offset == run.manager.end_offset


# ------------------------------------------------------------------------------ seeds


def seeds() -> list[bytes]:
    """A few byte strings that drive typical runs (the provider's decoding is not stable
    enough to write scenarios by hand; libFuzzer finds the rest from coverage)."""
    return [bytes(range(start, start + 64)) for start in range(0, 192, 16)] + [
        b"\x00" * 64, b"\x01\x02\x00" * 30, b"\x06\x01\x00\x05\x00" * 20,
    ]
