"""The group APIs version by version, byte-exact (tests/kafka_raw.py), on a real socket.

The real clients (test_groups_clients.py) each use one version per API; these tests pin
the version-specific answers the handlers build: FindCoordinator v0-v4 and its key types,
JoinGroup v0 (no rebalance timeout), LeaveGroup v0 (one member, top-level error),
OffsetCommit v2 (retention time) and v10 (topic ids), OffsetFetch v1 (per-partition
errors), v7 (require_stable), v8 (several groups) and v10, DescribeGroups v5/v6,
ListGroups filters, DeleteGroups, OffsetDelete, and NOT_COORDINATOR on the wrong node.
"""

from __future__ import annotations

import uuid

import pytest
from kio.schema.errors import ErrorCode

from onceflow.broker.runtime.groups import OFFSETS_TOPIC
from tests.helpers import create_topic, unique
from tests.integration.groups_support import FAST_GROUPS, groups_broker  # noqa: F401, F811
from tests.kafka_raw import RawClient

E = ErrorCode
OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR, JOIN_GROUP, HEARTBEAT = 8, 9, 10, 11, 12
LEAVE_GROUP, SYNC_GROUP, DESCRIBE_GROUPS, LIST_GROUPS, DELETE_GROUPS = 13, 14, 15, 16, 42
OFFSET_DELETE, METADATA = 47, 3


@pytest.fixture
def raw(groups_broker):
    with RawClient(groups_broker.bootstrap_servers) as client:
        client.request(FIND_COORDINATOR, 4, {"key_type": 0, "coordinator_keys": ["any"]})
        yield client


@pytest.fixture
def topic(groups_broker) -> str:
    return create_topic(groups_broker.bootstrap_servers, unique("proto"), 2)


def _commit_v8(raw: RawClient, group: str, topic: str, offsets: dict[int, int],
               generation: int = -1, member_id: str = "") -> dict[int, ErrorCode]:
    response = raw.request(OFFSET_COMMIT, 8, {
        "group_id": group, "generation_id_or_member_epoch": generation, "member_id": member_id,
        "group_instance_id": None, "topics": [{"name": topic, "partitions": [
            {"partition_index": p, "committed_offset": o, "committed_leader_epoch": 3,
             "committed_metadata": f"meta-{p}"} for p, o in offsets.items()]}]})
    return {p.partition_index: p.error_code for p in response.topics[0].partitions}


def test_find_coordinator_versions_and_key_types(raw, groups_broker):
    port = int(groups_broker.bootstrap_servers.rsplit(":", 1)[1])
    v0 = raw.request(FIND_COORDINATOR, 0, {"key": "g"})
    assert (v0.error_code, v0.node_id, v0.port) == (E.none, 0, port)
    v1 = raw.request(FIND_COORDINATOR, 1, {"key": "txn", "key_type": 1})
    assert (v1.error_code, v1.node_id, v1.port) == (E.none, 0, port)  # a transactional id
    v4 = raw.request(FIND_COORDINATOR, 4, {"key_type": 0, "coordinator_keys": ["a", "b"]})
    assert [(c.key, c.error_code, c.node_id) for c in v4.coordinators] == [
        ("a", E.none, 0), ("b", E.none, 0)]
    bad = raw.request(FIND_COORDINATOR, 4, {"key_type": 7, "coordinator_keys": ["a"]})
    assert bad.coordinators[0].error_code == E.invalid_request


def test_offsets_topic_is_internal_and_compacted(raw, groups_broker):
    metadata = raw.request(METADATA, 12, {"topics": [{"name": OFFSETS_TOPIC, "topic_id": None}],
                                          "allow_auto_topic_creation": False,
                                          "include_topic_authorized_operations": False})
    (found,) = metadata.topics
    assert found.is_internal and len(found.partitions) == FAST_GROUPS[
        "offsets_topic_num_partitions"]
    config = groups_broker.server.state.store.log_config(OFFSETS_TOPIC)
    assert config.compacts and not config.deletes


def test_join_v0_and_leave_v0(raw):
    group = unique("g")
    joined = raw.request(JOIN_GROUP, 0, {
        "group_id": group, "session_timeout": 10_000, "member_id": "",
        "protocol_type": "consumer", "protocols": [{"name": "range", "metadata": b"m"}]})
    assert (joined.error_code, joined.generation_id, joined.protocol_name) == (E.none, 1, "range")
    assert joined.leader == joined.member_id and len(joined.members) == 1
    bad = raw.request(JOIN_GROUP, 0, {
        "group_id": group, "session_timeout": 10, "member_id": "",
        "protocol_type": "consumer", "protocols": [{"name": "range", "metadata": b"m"}]})
    assert (bad.error_code, bad.protocol_name) == (E.invalid_session_timeout, "")  # "" below v7
    left = raw.request(LEAVE_GROUP, 0, {"group_id": group, "member_id": joined.member_id})
    assert left.error_code == E.none
    again = raw.request(LEAVE_GROUP, 0, {"group_id": group, "member_id": joined.member_id})
    assert again.error_code == E.unknown_member_id  # the one member's error, at the top


def test_commit_v2_and_fetch_v1_v7_v8(raw, topic):
    group = unique("g")
    committed = raw.request(OFFSET_COMMIT, 2, {
        "group_id": group, "generation_id_or_member_epoch": -1, "member_id": "",
        "retention_time": -1, "topics": [{"name": topic, "partitions": [
            {"partition_index": 0, "committed_offset": 7, "committed_metadata": "x"},
            {"partition_index": 9, "committed_offset": 1, "committed_metadata": ""}]},
            {"name": "no-such-topic", "partitions": [
                {"partition_index": 0, "committed_offset": 1, "committed_metadata": ""}]}]})
    assert [[p.error_code for p in t.partitions] for t in committed.topics] == [
        [E.none, E.unknown_topic_or_partition], [E.unknown_topic_or_partition]]

    v1 = raw.request(OFFSET_FETCH, 1, {"group_id": group, "topics": [
        {"name": topic, "partition_indexes": [0, 1]}]})
    assert [(p.committed_offset, p.metadata) for p in v1.topics[0].partitions] == [
        (7, "x"), (-1, "")]
    assert _commit_v8(raw, group, topic, {1: 4}) == {1: E.none}
    v7 = raw.request(OFFSET_FETCH, 7, {"group_id": group, "topics": None, "require_stable": True})
    assert v7.error_code == E.none
    assert {(p.partition_index, p.committed_offset, p.committed_leader_epoch, p.error_code)
            for p in v7.topics[0].partitions} == {(0, 7, -1, E.none), (1, 4, 3, E.none)}
    v8 = raw.request(OFFSET_FETCH, 8, {"require_stable": False, "groups": [
        {"group_id": group, "topics": [{"name": topic, "partition_indexes": [1]}]},
        {"group_id": unique("empty"), "topics": None}]})
    assert [(g.error_code, [(t.name, [p.committed_offset for p in t.partitions])
                            for t in g.topics]) for g in v8.groups] == [
        (E.none, [(topic, [4])]), (E.none, [])]


def test_commit_and_fetch_v10_by_topic_id(raw, topic, groups_broker):
    group = unique("g")
    topic_id = groups_broker.server.state.topic(topic).topic_id
    unknown_id = uuid.uuid4()
    committed = raw.request(OFFSET_COMMIT, 10, {
        "group_id": group, "generation_id_or_member_epoch": -1, "member_id": "",
        "group_instance_id": None, "topics": [
            {"topic_id": topic_id, "partitions": [{"partition_index": 1, "committed_offset": 3,
                                                   "committed_leader_epoch": -1,
                                                   "committed_metadata": None}]},
            {"topic_id": unknown_id, "partitions": [{"partition_index": 0, "committed_offset": 3,
                                                     "committed_leader_epoch": -1,
                                                     "committed_metadata": None}]}]})
    assert [(t.topic_id, t.partitions[0].error_code) for t in committed.topics] == [
        (topic_id, E.none), (unknown_id, E.unknown_topic_id)]
    fetched = raw.request(OFFSET_FETCH, 10, {"require_stable": False, "groups": [
        {"group_id": group, "member_id": None, "member_epoch": -1, "topics": [
            {"topic_id": topic_id, "partition_indexes": [1]},
            {"topic_id": unknown_id, "partition_indexes": [0]}]}]})
    assert [(t.topic_id, [(p.committed_offset, p.error_code) for p in t.partitions])
            for t in fetched.groups[0].topics] == [
        (topic_id, [(3, E.none)]), (unknown_id, [(-1, E.unknown_topic_id)])]


def test_describe_list_delete_and_offset_delete(raw, topic):
    group, simple = unique("g"), unique("simple")
    joined = raw.request(JOIN_GROUP, 0, {
        "group_id": group, "session_timeout": 10_000, "member_id": "",
        "protocol_type": "consumer", "protocols": [{"name": "range", "metadata": b"m"}]})
    raw.request(SYNC_GROUP, 0, {"group_id": group, "generation_id": 1,
                                "member_id": joined.member_id,
                                "assignments": [{"member_id": joined.member_id,
                                                 "assignment": b"a"}]})
    assert _commit_v8(raw, simple, topic, {0: 1, 1: 2}) == {0: E.none, 1: E.none}

    described = raw.request(DESCRIBE_GROUPS, 5, {"groups": [group, unique("none")],
                                                 "include_authorized_operations": False})
    ours, none = described.groups
    assert (ours.group_state, ours.protocol_data, ours.members[0].member_assignment) == (
        "Stable", "range", b"a")
    assert ours.members[0].client_host == "/127.0.0.1"
    assert (none.error_code, none.group_state) == (E.none, "Dead")
    v6 = raw.request(DESCRIBE_GROUPS, 6, {"groups": [unique("none")],
                                          "include_authorized_operations": False})
    assert v6.groups[0].error_code == E.group_id_not_found

    stable = raw.request(LIST_GROUPS, 5, {"states_filter": ["stable"], "types_filter": []})
    listed = {g.group_id: (g.group_state, g.protocol_type) for g in stable.groups}
    assert listed[group] == ("Stable", "consumer") and simple not in listed

    deleted = raw.request(DELETE_GROUPS, 2, {"groups_names": [group, simple, unique("none")]})
    assert [r.error_code for r in deleted.results] == [
        E.non_empty_group, E.none, E.group_id_not_found]
    assert _commit_v8(raw, simple, topic, {0: 5}) == {0: E.none}  # a new simple group
    removed = raw.request(OFFSET_DELETE, 0, {"group_id": simple, "topics": [
        {"name": topic, "partitions": [{"partition_index": 0}]}]})
    assert (removed.error_code, removed.topics[0].partitions[0].error_code) == (E.none, E.none)
    fetched = raw.request(OFFSET_FETCH, 1, {"group_id": simple, "topics": [
        {"name": topic, "partition_indexes": [0]}]})
    assert fetched.topics[0].partitions[0].committed_offset == -1


def test_only_the_coordinator_node_answers():
    from onceflow.broker.embedded import Broker

    with Broker(nodes=2, **FAST_GROUPS) as broker:
        runtime = broker.server.groups
        hosts = broker.bootstrap_servers.split(",")
        with RawClient(hosts[0]) as first:
            first.request(FIND_COORDINATOR, 4, {"key_type": 0, "coordinator_keys": ["x"]})
            groups = [f"g{i}" for i in range(20)]
            by_node = {g: broker.call(runtime.coordinator_node, g) for g in groups}
            assert set(by_node.values()) == {0, 1}, "groups spread over both nodes"
            for group, node in by_node.items():
                with RawClient(hosts[1 - node]) as wrong:
                    beat = wrong.request(HEARTBEAT, 4, {"group_id": group, "generation_id": 1,
                                                        "member_id": "m",
                                                        "group_instance_id": None})
                    assert beat.error_code == E.not_coordinator
                found = first.request(FIND_COORDINATOR, 4, {"key_type": 0,
                                                            "coordinator_keys": [group]})
                assert found.coordinators[0].node_id == node


def test_clients_cannot_produce_to_the_offsets_topic():
    from onceflow.broker.embedded import Broker
    from onceflow.protocol.records import SimpleRecord, build_batch

    batch = build_batch([SimpleRecord(key=b"k", value=b"v")])
    with Broker(**FAST_GROUPS) as broker, RawClient(broker.bootstrap_servers) as raw:
        raw.request(FIND_COORDINATOR, 4, {"key_type": 0, "coordinator_keys": ["any"]})
        response = raw.request(0, 9, {"transactional_id": None, "acks": -1, "timeout": 5000,
                                      "topic_data": [{"name": OFFSETS_TOPIC, "partition_data": [
                                          {"index": 0, "records": batch}]}]})
        error = response.responses[0].partition_responses[0].error_code
        assert error == E.invalid_topic_exception  # Kafka: "Cannot append to internal topic"
