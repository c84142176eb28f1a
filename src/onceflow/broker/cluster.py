"""The cluster view one broker process presents: nodes, leaders, replicas.

With `nodes=N` one process answers as N brokers (node ids 0..N-1, one listener
each) over shared storage. Each partition has a leader node chosen by a stable
function of (topic, partition), so leadership spreads over the nodes and client
code paths for several brokers are exercised. A node that is marked down (fault
injection) loses its leaderships to the next live node; requests for a partition
sent to a node that does not lead it are answered NOT_LEADER_OR_FOLLOWER.
"""

from __future__ import annotations

import dataclasses
import zlib


@dataclasses.dataclass(slots=True)
class Node:
    node_id: int
    host: str          # advertised host
    port: int          # advertised port (of the first listener)
    up: bool = True
    # listener name -> advertised (host, port): Metadata answers a client the addresses
    # of the listener it came in on.
    endpoints: dict[str, tuple[str, int]] = dataclasses.field(default_factory=dict)

    def endpoint(self, listener: str | None) -> tuple[str, int]:
        return self.endpoints.get(listener or "", (self.host, self.port))


class Cluster:
    def __init__(self, nodes: list[Node]) -> None:
        assert nodes, "a cluster has at least one node"
        self.nodes = nodes
        # Bumped whenever leadership can change, reported as the partition leader
        # epoch so clients notice moves.
        self.leader_epoch = 0

    @property
    def controller_id(self) -> int:
        return self.live_nodes()[0].node_id

    def live_nodes(self) -> list[Node]:
        live = [node for node in self.nodes if node.up]
        assert live, "at least one node stays up"
        return live

    def replicas(self, topic: str, partition: int, replication_factor: int) -> list[int]:
        """Replica node ids, preferred leader first (all nodes, live or not)."""
        count = len(self.nodes)
        start = (zlib.crc32(topic.encode()) + partition) % count
        return [self.nodes[(start + i) % count].node_id for i in range(min(replication_factor, count))]

    def leader(self, topic: str, partition: int, replication_factor: int) -> int:
        """The first live replica; if every replica is down, the first live node."""
        for node_id in self.replicas(topic, partition, replication_factor):
            if self.nodes[node_id].up:
                return node_id
        return self.live_nodes()[0].node_id

    def set_node_up(self, node_id: int, up: bool) -> None:
        if up is False and len(self.live_nodes()) == 1 and self.nodes[node_id].up:
            raise ValueError("cannot take the last live node down")
        self.nodes[node_id].up = up
        self.leader_epoch += 1
