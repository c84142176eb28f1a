"""Generations fence stale members; static members restart without a rebalance.

The first test speaks the protocol byte for byte (tests/kafka_raw.py), so every request
and its version are exactly what the test says: a member of an old generation tries to
commit and is refused ILLEGAL_GENERATION; during the sync phase commits get
REBALANCE_IN_PROGRESS; a member id the group does not know gets UNKNOWN_MEMBER_ID.

The second uses confluent-kafka consumers with group.instance.id (KIP-345): one is
killed and restarted within its session timeout and gets its old partitions back under
a new member id, while the other member never sees a rebalance.
"""

from __future__ import annotations

import time

from kio.schema.errors import ErrorCode

from tests.helpers import TIMEOUT_S, create_topic, unique
from tests.integration.groups_support import (
    Records,
    Worker,
    all_processed,
    assignment_settled,
    committed,
    groups_broker,  # noqa: F401, F811 - a fixture
    wait_for,
)
from tests.kafka_raw import RawClient

JOIN_GROUP, SYNC_GROUP, HEARTBEAT, OFFSET_COMMIT, FIND_COORDINATOR = 11, 14, 12, 8, 10
JOIN_VERSION, SYNC_VERSION, HEARTBEAT_VERSION, COMMIT_VERSION = 5, 3, 3, 8
SESSION_MS = 10_000
REBALANCE_MS = 10_000
STATIC_SESSION_MS = 6_000  # the static member must be back before this


def _join_body(group: str, member_id: str) -> dict:
    return {"group_id": group, "session_timeout": SESSION_MS, "rebalance_timeout": REBALANCE_MS,
            "member_id": member_id, "group_instance_id": None, "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": b""}]}


def _join(client: RawClient, group: str) -> object:
    """JoinGroup v5 with the MEMBER_ID_REQUIRED round trip (KIP-394)."""
    first = client.request(JOIN_GROUP, JOIN_VERSION, _join_body(group, ""))
    assert first.error_code == ErrorCode.member_id_required
    return client.request(JOIN_GROUP, JOIN_VERSION, _join_body(group, first.member_id))


def _sync(client: RawClient, group: str, joined, assignments: dict[str, bytes]) -> object:
    return client.request(SYNC_GROUP, SYNC_VERSION, {
        "group_id": group, "generation_id": joined.generation_id, "member_id": joined.member_id,
        "group_instance_id": None,
        "assignments": [{"member_id": m, "assignment": a} for m, a in assignments.items()]})


def _commit(client: RawClient, group: str, topic: str, generation: int, member_id: str,
            offset: int) -> ErrorCode:
    response = client.request(OFFSET_COMMIT, COMMIT_VERSION, {
        "group_id": group, "generation_id_or_member_epoch": generation, "member_id": member_id,
        "group_instance_id": None, "topics": [{"name": topic, "partitions": [
            {"partition_index": 0, "committed_offset": offset, "committed_leader_epoch": -1,
             "committed_metadata": ""}]}]})
    return response.topics[0].partitions[0].error_code


def _heartbeat_until_rebalance(client: RawClient, group: str, member_id: str) -> bool:
    """Heartbeat (generation 1) until the answer is REBALANCE_IN_PROGRESS: the other
    member's JoinGroup travels on another connection and may arrive a little later."""
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        beat = client.request(HEARTBEAT, HEARTBEAT_VERSION, {
            "group_id": group, "generation_id": 1, "member_id": member_id,
            "group_instance_id": None})
        if beat.error_code == ErrorCode.rebalance_in_progress:
            return True
        assert beat.error_code == ErrorCode.none, beat
        time.sleep(0.02)
    return False


def test_commit_from_an_old_generation_is_rejected(groups_broker):
    bootstrap = groups_broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("fencing"), 1)
    group = unique("group")
    with RawClient(bootstrap) as one, RawClient(bootstrap) as two:
        found = one.request(FIND_COORDINATOR, 4, {"key_type": 0, "coordinator_keys": [group]})
        assert found.coordinators[0].error_code == ErrorCode.none  # one node: this one
        first = _join(one, group)
        assert (first.error_code, first.generation_id) == (ErrorCode.none, 1)
        assert _sync(one, group, first, {first.member_id: b"p0"}).error_code == ErrorCode.none
        assert _commit(one, group, topic, 1, first.member_id, 5) == ErrorCode.none

        # a second member joins: generation 2 forms once the first member rejoins
        second_member = two.request(JOIN_GROUP, JOIN_VERSION, _join_body(group, "")).member_id
        two.send_frame(two.encode(JOIN_GROUP, JOIN_VERSION, _join_body(group, second_member)))
        assert _heartbeat_until_rebalance(one, group, first.member_id)
        rejoined = one.request(JOIN_GROUP, JOIN_VERSION, _join_body(group, first.member_id))
        second = two.decode_response(JOIN_GROUP, JOIN_VERSION, two.recv_frame())
        assert rejoined.generation_id == second.generation_id == 2

        # generation 2 waits for its assignment: commits must wait too
        assert _commit(one, group, topic, 2, first.member_id, 6) == ErrorCode.rebalance_in_progress
        leader, follower = (one, rejoined) if rejoined.members else (two, second)
        assignments = {rejoined.member_id: b"p0", second.member_id: b""}
        assert _sync(leader, group, follower, assignments).error_code == ErrorCode.none

        # the zombie of generation 1 is fenced; the current generation commits
        assert _commit(one, group, topic, 1, first.member_id, 7) == ErrorCode.illegal_generation
        assert _commit(two, group, topic, 2, "someone-else", 7) == ErrorCode.unknown_member_id
        assert _commit(one, group, topic, 2, first.member_id, 8) == ErrorCode.none
    assert committed(bootstrap, group, topic, 1) == {0: 8}


def test_static_member_restart_keeps_its_assignment_without_rebalance(groups_broker, tmp_path):
    bootstrap = groups_broker.bootstrap_servers
    partitions = 4
    topic = create_topic(bootstrap, unique("static"), partitions)
    group = unique("group")
    records = Records(bootstrap, topic, partitions)

    def static(name: str, run: int) -> Worker:
        return Worker("confluent", bootstrap, group, topic, tmp_path / f"{name}-{run}.log",
                      session_ms=STATIC_SESSION_MS, instance=name).start()

    one, two = static("one", 0), static("two", 0)
    workers = [one, two]
    try:
        wait_for(assignment_settled([one, two], partitions), "both static members assigned")
        records.produce(40)
        wait_for(all_processed(workers, records), "the first records")
        owned = one.assignment()

        one.kill()  # a static member does not leave: its partitions wait for it
        again = static("one", 1)
        workers.append(again)
        wait_for(lambda: again.assignment() != (), "the restarted member's assignment")
        assert again.assignment() == owned, "same partitions under the new member id"
        records.produce(40)
        wait_for(all_processed(workers, records), "records after the restart")
        assert len(two.assignments()) == 1, "the other member never saw a rebalance"
        wait_for(lambda: committed(bootstrap, group, topic, partitions) == records.end_offsets(),
                 "the last commits")
    finally:
        for worker in workers:
            worker.kill()
