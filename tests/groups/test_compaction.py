"""compact(): the compacted log replays to the same state, and stays bounded."""

import time

from hypothesis import example, given, settings
from hypothesis import strategies as st

from onceflow.groups import (
    CoordinatorConfig,
    GroupCoordinator,
    LogRecord,
    TxnMarker,
    compact,
)
from onceflow.groups.records import (
    GroupMetadataValue,
    MemberMetadataValue,
    OffsetCommitValue,
    group_metadata_record,
    offset_commit_record,
)

CONFIG = CoordinatorConfig(offsets_topic_num_partitions=1)
RETENTION_MS = 1_000
GROUPS = ("g1", "g2")
KEYS = [(g, t, p) for g in GROUPS for t in ("a", "b") for p in (0, 1)]


def replayed_state(entries) -> dict:
    """Everything replay builds, normalised (empty containers dropped)."""
    coord = GroupCoordinator(CONFIG)
    coord.load_partition(0, entries, now_ms=0)
    shard = coord._shards[0]
    store = shard.offsets
    return {
        "groups": {gid: (g.state, g.to_value()) for gid, g in shard.groups.items()},
        "committed": {g: dict(o) for g, o in store.committed.items() if o},
        "pending": {(pid, g): dict(o) for pid, by_group in store.pending.items()
                    for g, o in by_group.items() if o},
    }


def group_value(generation: int) -> GroupMetadataValue:
    member = MemberMetadataValue(f"m{generation}", None, "c", "h", 100, 100, b"s", b"a")
    return GroupMetadataValue("consumer", generation, "range", member.member_id, 5, (member,))


ops = st.lists(st.one_of(
    st.tuples(st.just("commit"), st.sampled_from(KEYS), st.integers(0, 10**6)),
    st.tuples(st.just("tombstone"), st.sampled_from(KEYS)),
    st.tuples(st.just("txn"), st.integers(1, 3), st.sampled_from(KEYS), st.integers(0, 10**6)),
    st.tuples(st.just("marker"), st.integers(1, 3), st.booleans()),
    st.tuples(st.just("group"), st.sampled_from(GROUPS), st.integers(1, 5)),
    st.tuples(st.just("group-tombstone"), st.sampled_from(GROUPS)),
), max_size=60)


def build_log(operations, step_ms: int = 100) -> list:
    entries = []
    for offset, op in enumerate(operations):
        ts = offset * step_ms
        kind = op[0]
        if kind == "marker":
            entries.append(TxnMarker(offset, ts, op[1], op[2]))
            continue
        if kind == "commit":
            record, pid = offset_commit_record(*op[1], OffsetCommitValue(op[2], -1, "", ts)), -1
        elif kind == "tombstone":
            record, pid = offset_commit_record(*op[1], None), -1
        elif kind == "txn":
            record, pid = offset_commit_record(*op[2], OffsetCommitValue(op[3], -1, "", ts)), op[1]
        elif kind == "group":
            record, pid = group_metadata_record(op[1], group_value(op[2])), -1
        else:
            record, pid = group_metadata_record(op[1], None), -1
        entries.append(LogRecord(offset, ts, pid, record.key, record.value))
    return entries


@settings(max_examples=300, deadline=None)
@given(ops, st.integers(0, 8_000))
@example([("commit", KEYS[0], 0), ("txn", 2, KEYS[0], 0), ("tombstone", KEYS[0]),
          ("marker", 2, False)], 0)  # a simple group must not outlive its last offset
def test_compacted_log_replays_to_the_same_state(operations, now_ms):
    entries = build_log(operations)
    compacted = compact(entries, now_ms, RETENTION_MS)
    assert replayed_state(compacted) == replayed_state(entries)
    assert compact(compacted, now_ms, RETENTION_MS) == compacted  # idempotent
    assert len(compacted) <= len(entries)


def test_keeps_latest_value_per_key_and_drops_old_tombstones():
    log = build_log([
        ("commit", KEYS[0], 1), ("commit", KEYS[1], 2), ("commit", KEYS[0], 3),
        ("tombstone", KEYS[1]), ("group", "g1", 1), ("group", "g1", 2),
    ])
    kept = compact(log, now_ms=500, tombstone_retention_ms=RETENTION_MS)
    assert [e.offset for e in kept] == [2, 3, 5]  # newest commit, fresh tombstone, newest group
    kept_later = compact(log, now_ms=300 + RETENTION_MS, tombstone_retention_ms=RETENTION_MS)
    assert [e.offset for e in kept_later] == [2, 5]  # the tombstone has served its time


def test_transactions():
    log = build_log([
        ("txn", 1, KEYS[0], 10),  # 0: committed below
        ("txn", 2, KEYS[1], 20),  # 1: aborted below
        ("marker", 2, False),  # 2
        ("marker", 1, True),  # 3
        ("commit", KEYS[2], 5),  # 4
        ("txn", 3, KEYS[2], 30),  # 5: still open: nothing from here on is cleaned
        ("commit", KEYS[2], 6),  # 6
    ])
    kept = compact(log, now_ms=0, tombstone_retention_ms=RETENTION_MS)
    assert [e.offset for e in kept] == [0, 3, 4, 5, 6]


def test_commits_stay_bounded_under_a_million_commits():
    """1M commits from 10 groups x 20 partitions, compacted whenever the log reaches
    100k entries (a log cleaner's pass over closed segments)."""
    keys = [(f"group-{g}", "events", p) for g in range(10) for p in range(20)]
    encoded = {k: offset_commit_record(*k, None).key for k in keys}
    value = offset_commit_record("g", "t", 0, OffsetCommitValue(1, -1, "", 0)).value
    log: list = []
    longest = 0
    compact_s = 0.0
    passes = 0
    for offset in range(1_000_000):
        key = keys[offset % len(keys)]
        log.append(LogRecord(offset, offset, -1, encoded[key], value))
        if len(log) >= 100_000:
            longest = max(longest, len(log))
            start = time.perf_counter()
            log = compact(log, now_ms=offset, tombstone_retention_ms=RETENTION_MS)
            compact_s += time.perf_counter() - start
            passes += 1
    log = compact(log, now_ms=1_000_000, tombstone_retention_ms=RETENTION_MS)
    assert len(log) == len(keys)
    assert longest == 100_000
    assert {e.offset for e in log} == set(range(1_000_000 - len(keys), 1_000_000))
    print(f"\n1M commits: {passes} compaction passes of 100k entries, "
          f"{compact_s:.2f} s total ({compact_s / passes * 1000:.0f} ms per pass); "
          f"log bounded at {longest} entries, {len(log)} after the last pass")
