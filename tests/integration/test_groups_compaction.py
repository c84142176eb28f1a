"""__consumer_offsets stays bounded (compaction) and replays to the same state.

1. The compactor on a real partition log: random commits, deletions, group records and
   transactions (multi-record batches, so some batches are kept whole, some rebuilt, some
   dropped) are compacted segment by segment; the log replays to exactly the state it
   replayed to before, and again after a reopen.
2. A broker under a stream of commits over a few keys: with small segments the topic's
   size stays bounded while the appended bytes grow, and after a restart the group's
   committed offsets are the last ones.
"""

from __future__ import annotations

import random
import time

from kio.schema.errors import ErrorCode

from onceflow.broker.embedded import Broker
from onceflow.broker.runtime.compaction import plan_compaction
from onceflow.broker.runtime.log_io import append_batch, read_entries
from onceflow.groups import Append, CoordinatorConfig, GroupCoordinator
from onceflow.groups.records import (
    GroupMetadataValue,
    MemberMetadataValue,
    OffsetCommitValue,
    group_metadata_record,
    offset_commit_record,
)
from onceflow.protocol.records import build_control_batch
from onceflow.storage import LogConfig, PartitionLog
from tests.helpers import create_topic, unique
from tests.kafka_raw import RawClient

NOW_MS = 1_700_000_000_000
KEYS = [(g, t, p) for g in ("g1", "g2") for t in ("a", "b") for p in range(3)]
SEGMENT_BYTES = 2048
TOMBSTONE_RETENTION_MS = 1_000


def _replayed(offsets_log: PartitionLog) -> dict:
    coordinator = GroupCoordinator(CoordinatorConfig(offsets_topic_num_partitions=1))
    entries = list(read_entries(offsets_log, 0, offsets_log.log_end_offset))
    coordinator.load_partition(0, entries, now_ms=NOW_MS)
    shard = coordinator._shards[0]
    return {"groups": {g: (group.state, group.to_value()) for g, group in shard.groups.items()},
            "committed": {g: dict(o) for g, o in shard.offsets.committed.items() if o},
            "pending": {(pid, g): dict(o) for pid, by in shard.offsets.pending.items()
                        for g, o in by.items() if o}}


def _random_batch(rng: random.Random, now: int) -> bytes:
    kind = rng.choice(["commit", "commit", "commit", "tombstone", "group", "txn", "marker"])
    if kind == "marker":
        return build_control_batch(producer_id=rng.randint(1, 2), producer_epoch=0,
                                   commit=rng.random() < 0.5, coordinator_epoch=0,
                                   timestamp_ms=now)
    if kind == "group":
        group = rng.choice(["g1", "g2"])
        member = MemberMetadataValue("m", None, "c", "/h", 10, 10, b"s", b"a")
        value = GroupMetadataValue("consumer", rng.randint(1, 9), "range", "m", now, (member,))
        return append_batch(Append(0, (group_metadata_record(group, value),)), now)
    records = []
    for group, topic, partition in rng.sample(KEYS, rng.randint(1, 4)):
        value = None if kind == "tombstone" else OffsetCommitValue(rng.randint(0, 999), -1, "m",
                                                                   now)
        records.append(offset_commit_record(group, topic, partition, value))
    producer_id = rng.randint(1, 2) if kind == "txn" else -1
    return append_batch(Append(0, tuple(records), producer_id=producer_id, producer_epoch=0), now)


def test_compacted_segments_replay_to_the_same_state(tmp_path):
    for seed in range(12):
        rng = random.Random(seed)
        config = LogConfig(segment_bytes=SEGMENT_BYTES, index_interval_bytes=256)
        offsets_log = PartitionLog.open(tmp_path / f"seed-{seed}", config, NOW_MS)
        for i in range(300):
            offsets_log.append([_random_batch(rng, NOW_MS + i)], NOW_MS + i)
        before = _replayed(offsets_log)
        size_before = offsets_log.size_bytes
        now = NOW_MS + 300 + TOMBSTONE_RETENTION_MS * rng.randint(0, 1)  # tombstones expire?
        plan = plan_compaction(offsets_log, offsets_log.segment_base_offsets, now,
                               TOMBSTONE_RETENTION_MS)
        assert plan.changed, "random commits over few keys leave something to drop"
        for base in sorted(plan.changed):
            offsets_log.replace_segment(base, plan.batches[base], now)
        assert _replayed(offsets_log) == before, f"seed {seed}"
        assert offsets_log.size_bytes < size_before
        offsets_log.close()
        reopened = PartitionLog.open(tmp_path / f"seed-{seed}", config, NOW_MS)
        assert _replayed(reopened) == before, f"seed {seed} after reopen"
        reopened.close()


# ---------------------------------------------------------------- a broker under commits

OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR = 8, 9, 10
PARTITIONS = 10
ROUNDS = 6
COMMITS_PER_ROUND = 500  # requests of PARTITIONS offsets each: 5k commit records a round
COMMITS = ROUNDS * COMMITS_PER_ROUND
TINY_SEGMENT_BYTES = 32 * 1024
COMPACTION_INTERVAL_MS = 100
# What is left after compaction: the active segment and about one record per key.
COMPACTED_BYTES = TINY_SEGMENT_BYTES + 4096

def _commit(client: RawClient, group: str, topic: str, offset: int) -> None:
    response = client.request(OFFSET_COMMIT, 8, {
        "group_id": group, "generation_id_or_member_epoch": -1, "member_id": "",
        "group_instance_id": None, "topics": [{"name": topic, "partitions": [
            {"partition_index": p, "committed_offset": offset, "committed_leader_epoch": -1,
             "committed_metadata": ""} for p in range(PARTITIONS)]}]})
    assert {p.error_code for p in response.topics[0].partitions} == {ErrorCode.none}


def _fetch(client: RawClient, group: str, topic: str) -> list[int]:
    response = client.request(OFFSET_FETCH, 7, {"group_id": group, "require_stable": False,
                                                "topics": [{"name": topic,
                                                            "partition_indexes": list(range(10))}]})
    return [p.committed_offset for p in response.topics[0].partitions]


def test_offsets_topic_stays_bounded_under_commits(tmp_path):
    """Round after round of commits appends more and more, and after each round the
    partition shrinks back to the same bound. (Not a bound on the size *during* a round:
    how far appends run ahead of the background compactor depends on the machine's load.)"""
    settings = {"offsets_topic_num_partitions": 1, "fsync": False,
                "offsets_topic_segment_bytes": TINY_SEGMENT_BYTES,
                "offsets_compaction_interval_ms": COMPACTION_INTERVAL_MS}
    group = unique("bounded")
    with Broker(tmp_path / "data", **settings) as broker:
        bootstrap = broker.bootstrap_servers
        topic = create_topic(bootstrap, unique("commits"), PARTITIONS)
        with RawClient(bootstrap) as client:
            client.request(FIND_COORDINATOR, 4, {"key_type": 0, "coordinator_keys": [group]})
            offsets_log = broker.server.groups.offsets_log(0)
            for round_ in range(ROUNDS):
                for i in range(1, COMMITS_PER_ROUND + 1):
                    _commit(client, group, topic, round_ * COMMITS_PER_ROUND + i)
                _wait_compacted(offsets_log)
            appended = offsets_log.log_end_offset  # one record per committed offset
            assert _fetch(client, group, topic) == [COMMITS] * PARTITIONS
        compactions = len(broker.server.groups.compactor.history)
        final = offsets_log.size_bytes
    assert appended >= COMMITS * PARTITIONS
    assert compactions > 0
    assert final <= COMPACTED_BYTES, final
    with Broker(tmp_path / "data", **settings) as broker:  # replay of the compacted log
        with RawClient(broker.bootstrap_servers) as client:
            _wait_for_load(client, group, topic)
            assert _fetch(client, group, topic) == [COMMITS] * PARTITIONS


def _wait_compacted(offsets_log: PartitionLog) -> None:
    """Until what is left is the active segment and about one record per key."""
    deadline = time.monotonic() + 30
    while offsets_log.size_bytes > COMPACTED_BYTES:
        assert time.monotonic() < deadline, offsets_log.segment_base_offsets
        time.sleep(COMPACTION_INTERVAL_MS / 1000)


def _wait_for_load(client: RawClient, group: str, topic: str) -> None:
    deadline = time.monotonic() + 10
    while True:
        response = client.request(OFFSET_FETCH, 7, {"group_id": group, "require_stable": False,
                                                    "topics": [{"name": topic,
                                                                "partition_indexes": [0]}]})
        if response.error_code != ErrorCode.coordinator_load_in_progress:
            return
        assert time.monotonic() < deadline
        time.sleep(0.05)
