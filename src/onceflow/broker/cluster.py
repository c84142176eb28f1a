"""The cluster view one broker process presents: nodes, leaders, replicas.

With `nodes=N` one process answers as N brokers (node ids 0..N-1, one listener
each) over shared storage. Each partition has a leader node chosen by a stable
function of (topic, partition), so leadership spreads over the nodes and client
code paths for several brokers are exercised. A node that is marked down (fault
injection) loses its leaderships to the next live node; requests for a partition
sent to a node that does not lead it are answered NOT_LEADER_OR_FOLLOWER.

AlterPartitionReassignments sets a partition's replicas explicitly (preferred leader first);
the assignment replaces the computed one at once (there is no data to move: storage is
shared) and is kept in `replica-assignments.json` in the data directory, so it survives a
restart.
"""

from __future__ import annotations

import dataclasses
import json
import os
import zlib
from pathlib import Path

ASSIGNMENTS_FILE = "replica-assignments.json"


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
        # (topic, partition) -> replicas set by a reassignment, persisted to `_path`.
        self.assigned: dict[tuple[str, int], list[int]] = {}
        self._path: Path | None = None

    def load_assignments(self, data_dir: Path) -> None:
        """Reads the persisted replica assignments (none yet: nothing to read)."""
        self._path = Path(data_dir) / ASSIGNMENTS_FILE
        if not self._path.exists():
            return
        entries = json.loads(self._path.read_text(encoding="utf-8"))
        known = {node.node_id for node in self.nodes}
        self.assigned = {(e["topic"], e["partition"]): e["replicas"] for e in entries
                         if set(e["replicas"]) <= known}  # fewer nodes now: computed again

    def _save(self) -> None:
        if self._path is None:
            return
        entries = [{"topic": t, "partition": p, "replicas": r}
                   for (t, p), r in sorted(self.assigned.items())]
        temporary = self._path.with_suffix(".tmp")
        with open(temporary, "w", encoding="utf-8") as handle:
            json.dump(entries, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, self._path)

    def assign(self, topic: str, partition: int, replicas: list[int]) -> None:
        """Makes `replicas` the partition's replicas (the first is the preferred leader)."""
        self.assign_many(topic, {partition: replicas})

    def assign_many(self, topic: str, replicas_by_partition: dict[int, list[int]]) -> None:
        for partition, replicas in replicas_by_partition.items():
            self.assigned[(topic, partition)] = [int(r) for r in replicas]
        self.leader_epoch += 1
        self._save()

    def assignment_error(self, replicas, replication_factor: int | None = None) -> str | None:
        """Why an explicit replica list is invalid (Kafka: INVALID_REPLICA_ASSIGNMENT), or
        None; checked in Kafka's order, over the sorted ids."""
        if not replicas:
            return "The manual partition assignment includes an empty replica list."
        known = {node.node_id for node in self.nodes}
        previous = None
        for replica in sorted(replicas):
            if replica not in known:
                return (f"The manual partition assignment includes broker {replica}, but no "
                        "such broker is registered.")
            if replica == previous:
                return (f"The manual partition assignment includes the broker {replica} more "
                        "than once.")
            previous = replica
        if replication_factor is not None and len(replicas) != replication_factor:
            return (f"The manual partition assignment includes a partition with "
                    f"{len(replicas)} replica(s), but this is not consistent with previous "
                    f"partitions, which have {replication_factor} replica(s).")
        return None

    def forget_topic(self, topic: str) -> None:
        """Drops a deleted topic's assignments (a new topic of that name starts computed)."""
        if any(key[0] == topic for key in self.assigned):
            self.assigned = {k: v for k, v in self.assigned.items() if k[0] != topic}
            self._save()

    @property
    def controller_id(self) -> int:
        return self.live_nodes()[0].node_id

    def live_nodes(self) -> list[Node]:
        live = [node for node in self.nodes if node.up]
        assert live, "at least one node stays up"
        return live

    def replicas(self, topic: str, partition: int, replication_factor: int) -> list[int]:
        """Replica node ids, preferred leader first (all nodes, live or not)."""
        assigned = self.assigned.get((topic, partition))
        if assigned is not None:
            return list(assigned)
        count = len(self.nodes)
        start = (zlib.crc32(topic.encode()) + partition) % count
        return [self.nodes[(start + i) % count].node_id for i in range(min(replication_factor, count))]

    def leader(self, topic: str, partition: int, replication_factor: int) -> int:
        """The first live replica; if every replica is down, the first live node."""
        if len(self.nodes) == 1:   # the one node is always up (live_nodes); every request asks
            return self.nodes[0].node_id
        for node_id in self.replicas(topic, partition, replication_factor):
            if self.nodes[node_id].up:
                return node_id
        return self.live_nodes()[0].node_id

    def set_node_up(self, node_id: int, up: bool) -> None:
        if up is False and len(self.live_nodes()) == 1 and self.nodes[node_id].up:
            raise ValueError("cannot take the last live node down")
        self.nodes[node_id].up = up
        self.leader_epoch += 1
