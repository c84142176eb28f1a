"""Metadata keeps each topic's partition dicts between answers (issue 19): the same dicts
while nothing changed, new ones once leadership or the topic changes."""

from __future__ import annotations

import uuid

from onceflow.broker.cluster import Cluster, Node
from onceflow.broker.handlers.metadata import _partitions
from onceflow.storage.store import TopicInfo


class _State:
    """What `_partitions` reads of a BrokerState: the cluster and the leader rule."""

    def __init__(self, nodes: int) -> None:
        self.cluster = Cluster([Node(i, "localhost", 9092 + i) for i in range(nodes)])

    def leader(self, info: TopicInfo, index: int) -> int:
        return self.cluster.leader(info.name, index, info.replication_factor)


def test_partition_dicts_are_kept_until_the_layout_changes() -> None:
    state = _State(nodes=3)
    info = TopicInfo("t", uuid.uuid4(), 4, replication_factor=3)
    first = _partitions(state, info)
    assert _partitions(state, info) is first
    leaders = [p["leader_id"] for p in first]

    state.cluster.set_node_up(leaders[0], False)   # leadership moves
    moved = _partitions(state, info)
    assert moved is not first
    assert moved[0]["leader_id"] != leaders[0]
    assert leaders[0] in moved[0]["offline_replicas"]

    state.cluster.set_node_up(leaders[0], True)
    back = _partitions(state, info)
    assert [p["leader_id"] for p in back] == leaders

    state.cluster.assign("t", 1, [2, 1, 0])   # a reassignment
    assert _partitions(state, info)[1]["replica_nodes"] == [2, 1, 0]

    more = TopicInfo("t", info.topic_id, 6, replication_factor=3)   # CreatePartitions
    assert len(_partitions(state, more)) == 6
    again = TopicInfo("t", uuid.uuid4(), 2, replication_factor=3)   # deleted, created again
    assert len(_partitions(state, again)) == 2
