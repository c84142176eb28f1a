"""kio's request dataclasses fit the coordinator's nested request shapes unchanged, so the
broker passes `body.protocols`, `body.topics`, ... straight through."""

from kio.schema.errors import ErrorCode
from kio.schema.join_group.v9.request import JoinGroupRequestProtocol
from kio.schema.leave_group.v5.request import MemberIdentity
from kio.schema.offset_commit.v8.request import (
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
)
from kio.schema.offset_delete.v0.request import (
    OffsetDeleteRequestPartition,
    OffsetDeleteRequestTopic,
)
from kio.schema.offset_fetch.v8.request import OffsetFetchRequestTopics
from kio.schema.sync_group.v5.request import SyncGroupRequestAssignment
from kio.static.primitive import i32, i64

from tests.groups.harness import FakeBroker

E = ErrorCode


def test_kio_request_parts_are_accepted_as_they_are():
    b = FakeBroker()
    proto = JoinGroupRequestProtocol(name="range", metadata=b"m")
    first = b.join("g", protocols=(proto,))
    joined = b.join("g", first.value.member_id, protocols=(proto,))
    b.settle(joined)
    member_id = joined.value.member_id
    box = []
    b.persist(b.coord.sync_group(
        group_id="g", generation_id=1, member_id=member_id, group_instance_id=None,
        protocol_type="consumer", protocol_name="range",
        assignments=(SyncGroupRequestAssignment(member_id=member_id, assignment=b"a"),),
        now_ms=b.now_ms, respond=box.append))
    assert box[0].assignment == b"a"
    commit = OffsetCommitRequestTopic(name="t", partitions=(OffsetCommitRequestPartition(
        partition_index=i32(0), committed_offset=i64(5), committed_leader_epoch=i32(2),
        committed_metadata="x"),))
    result = b.persist(b.coord.offset_commit(
        group_id="g", generation_id=1, member_id=member_id, group_instance_id=None,
        topics=(commit,), api_version=8, now_ms=b.now_ms))
    assert result.topics[0].partitions[0].error is E.none
    fetched = b.coord.offset_fetch(group_id="g", topics=(OffsetFetchRequestTopics(
        name="t", partition_indexes=(i32(0),)),))
    assert fetched.topics[0].partitions[0].committed_offset == 5
    deleted = b.persist(b.coord.offset_delete(group_id="g", topics=(OffsetDeleteRequestTopic(
        name="t", partitions=(OffsetDeleteRequestPartition(partition_index=i32(0)),)),),
        now_ms=b.now_ms))
    assert deleted.topics[0].partitions[0].error is E.group_subscribed_to_topic
    left = b.persist(b.coord.leave_group(group_id="g", members=(
        MemberIdentity(member_id=member_id, group_instance_id=None, reason="bye"),),
        now_ms=b.now_ms))
    assert left.members[0].error is E.none
